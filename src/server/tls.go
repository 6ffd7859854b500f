package server

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"

	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// tlsFiles are the files of TLS on the gRPC listener, from the settings.
type tlsFiles struct {
	// cert and key are GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY.
	cert, key string
	// clientCA is GRPC_CLIENT_TLS_CACERT: when set, clients must present
	// a certificate signed by one of its CAs.
	clientCA string
	// clientSAN is GRPC_CLIENT_TLS_SAN: when set with clientCA, the
	// client certificate must hold it.
	clientSAN string
}

// tlsState is one loaded version of the files: immutable once published.
type tlsState struct {
	// config is what a handshake uses.
	config *tls.Config
}

// serverTLS serves TLS on the gRPC listener from files. Each handshake
// takes the version in force at that moment.
//
// It is safe for concurrent use once built by newServerTLS.
type serverTLS struct {
	files tlsFiles
	// refused counts handshakes that failed for another reason than the
	// client going away: plaintext, untrusted or missing certificates.
	refused *stats.Counter

	cur atomic.Pointer[tlsState]
}

// newServerTLS loads the files once. An error names the setting of
// the file at fault, as a misconfiguration at start must stop the service.
func newServerTLS(files tlsFiles, reg *stats.Registry) (*serverTLS, error) {
	tl := &serverTLS{
		files:   files,
		refused: reg.Counter("ratelimit.server.tls_handshake_error"),
	}
	st, err := tl.load()
	if err != nil {
		return nil, err
	}
	tl.cur.Store(st)
	return tl, nil
}

// credentials returns the gRPC server's transport credentials.
func (tl *serverTLS) credentials() credentials.TransportCredentials {
	base := &tls.Config{
		// Called at every handshake: the version in force now.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return tl.cur.Load().config, nil
		},
	}
	return countRefused{TransportCredentials: credentials.NewTLS(base), refused: tl.refused}
}

// load reads and checks the files and builds their handshake config.
func (tl *serverTLS) load() (*tlsState, error) {
	contents, err := tl.read()
	if err != nil {
		return nil, err
	}
	return tl.parse(contents)
}

// read reads the files.
func (tl *serverTLS) read() ([3][]byte, error) {
	var contents [3][]byte
	for i, f := range []struct{ setting, path string }{
		{"GRPC_SERVER_TLS_CERT", tl.files.cert},
		{"GRPC_SERVER_TLS_KEY", tl.files.key},
		{"GRPC_CLIENT_TLS_CACERT", tl.files.clientCA},
	} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return contents, fmt.Errorf("server: %s: %w", f.setting, err)
		}
		contents[i] = b
	}
	return contents, nil
}

// parse builds the handshake config from the files' contents.
func (tl *serverTLS) parse(contents [3][]byte) (*tlsState, error) {
	certPEM, keyPEM, caPEM := contents[0], contents[1], contents[2]
	// tls.X509KeyPair names neither file; look at the certificate alone
	// first, so that the error names the setting at fault.
	if err := checkCertPEM(certPEM); err != nil {
		return nil, fmt.Errorf("server: GRPC_SERVER_TLS_CERT %s: %w", tl.files.cert, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("server: GRPC_SERVER_TLS_KEY %s (with GRPC_SERVER_TLS_CERT %s): %w", tl.files.key, tl.files.cert, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{pair},
		// grpc-go's credentials add both to a config of ours too; set
		// here, they hold whatever it does.
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		// A resumed session skips the full check of the client's
		// certificate against the CAs in force now; Envoy holds its
		// connections for hours, so a full handshake costs nothing.
		SessionTicketsDisabled: true,
	}
	if tl.files.clientCA != "" {
		// Only the file's CAs: the anchor adds the system's roots, which
		// would let any client with a certificate from a public CA in.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("server: GRPC_CLIENT_TLS_CACERT %s: no PEM certificate in it", tl.files.clientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if tl.files.clientSAN != "" {
			cfg.VerifyConnection = verifyClientSAN(tl.files.clientSAN)
		}
	}
	return &tlsState{config: cfg}, nil
}

// checkCertPEM reports whether b holds a certificate Go can parse.
func checkCertPEM(b []byte) error {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return errors.New("no PEM certificate in it")
		}
		if block.Type == "CERTIFICATE" {
			_, err := x509.ParseCertificate(block.Bytes)
			return err
		}
	}
}

// verifyClientSAN checks the client certificate, already verified against
// the CAs, for the name GRPC_CLIENT_TLS_SAN. The anchor verifies the chain
// again with this name as x509.VerifyOptions.DNSName, which comes down to
// the leaf's VerifyHostname: a DNS SAN, case-insensitive, where a wildcard
// SAN covers one label; an IP address matches an IP SAN; no other SAN type,
// and never the common name.
func verifyClientSAN(san string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server: no client certificate")
		}
		if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
			return fmt.Errorf("server: client certificate: %w", err)
		}
		return nil
	}
}

// countRefused counts the handshakes the listener refuses. grpc-go logs
// them at debug level only, so without a count a client locked out (a
// certificate from another CA, a plaintext client) would go unseen.
type countRefused struct {
	credentials.TransportCredentials
	refused *stats.Counter
}

// ServerHandshake counts a failure other than the client going away
// before the handshake, as load balancers' probes do.
func (c countRefused) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil && !errors.Is(err, io.EOF) {
		c.refused.Inc()
	}
	return out, info, err
}

// Clone keeps the count.
func (c countRefused) Clone() credentials.TransportCredentials {
	return countRefused{TransportCredentials: c.TransportCredentials.Clone(), refused: c.refused}
}
