// Package tlsclient builds the TLS configuration a shared store (Redis,
// Memcached) dials its servers with, from the PEM files its settings name,
// as envoyproxy/ratelimit builds it for both. Each store wraps it in a
// TLSConfig of its own, whose errors name that store; the settings check
// that a certificate comes with its key. It knows no store and no setting.
package tlsclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names the PEM files of a store's TLS settings.
type Files struct {
	// ClientCert and ClientKey are the client certificate and its key,
	// presented to servers that ask for one; both or neither.
	ClientCert, ClientKey string
	// CACert is the CA bundle that signs the servers' certificates; empty
	// means the system roots.
	CACert string
	// SkipHostnameVerification still verifies a server's chain against the
	// CA, but not that its name matches the address dialled (useful when a
	// server is reached by an IP its certificate does not list).
	SkipHostnameVerification bool
}

// Config reads f and returns the client configuration: TLS 1.2 at least,
// the client certificate when both its files are given, the CA bundle, and
// with SkipHostnameVerification a verification of the chain alone.
func Config(f Files) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if (f.ClientCert == "") != (f.ClientKey == "") {
		return nil, errors.New("client certificate and key go together: set both or neither")
	}
	if f.ClientCert != "" {
		cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if f.CACert != "" {
		pem, err := os.ReadFile(f.CACert)
		if err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA certificate: %s: no PEM certificate found", f.CACert)
		}
		c.RootCAs = pool
	}
	if f.SkipHostnameVerification {
		// Turn off the standard verification, which always checks the name,
		// and verify the chain ourselves without a name.
		c.InsecureSkipVerify = true
		roots := c.RootCAs
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, cert := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(cert)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("tls: %w", err)
			}
			return nil
		}
	}
	return c, nil
}
