package storetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// RedisTLS names the PEM files generated for a TLS redis-server: a CA, the
// server's certificate (for 127.0.0.1, ::1 and localhost) and a client
// certificate, all signed by the CA. They are the files REDIS_TLS_CACERT,
// REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY point to.
type RedisTLS struct {
	CAFile         string
	ServerCertFile string
	ServerKeyFile  string
	ClientCertFile string
	ClientKeyFile  string
}

// ClientConfig returns a client configuration that trusts the CA and
// presents the client certificate. It returns nil if the files are unreadable.
func (f *RedisTLS) ClientConfig() *tls.Config {
	cert, err := tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		return nil
	}
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{
		RootCAs:      pool,
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
}

// writeRedisTLS generates a CA, a server and a client certificate into dir.
func writeRedisTLS(dir string) (*RedisTLS, error) {
	f := &RedisTLS{
		CAFile:         filepath.Join(dir, "ca.crt"),
		ServerCertFile: filepath.Join(dir, "server.crt"),
		ServerKeyFile:  filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.crt"),
		ClientKeyFile:  filepath.Join(dir, "client.key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("storetest: tls: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ratelimit test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("storetest: tls: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("storetest: tls: %w", err)
	}
	if err := writePEM(f.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaves := []struct {
		serial    int64
		name      string
		usage     x509.ExtKeyUsage
		certFile  string
		keyFile   string
		withHosts bool
	}{
		{2, "redis server", x509.ExtKeyUsageServerAuth, f.ServerCertFile, f.ServerKeyFile, true},
		{3, "ratelimit client", x509.ExtKeyUsageClientAuth, f.ClientCertFile, f.ClientKeyFile, false},
	}
	for _, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("storetest: tls: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(l.serial),
			Subject:      pkix.Name{CommonName: l.name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{l.usage},
		}
		if l.withHosts {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, fmt.Errorf("storetest: tls: %w", err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("storetest: tls: %w", err)
		}
		if err := writePEM(l.certFile, "CERTIFICATE", der); err != nil {
			return nil, err
		}
		if err := writePEM(l.keyFile, "PRIVATE KEY", keyDER); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func writePEM(path, typ string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("storetest: tls: %w", err)
	}
	return nil
}
