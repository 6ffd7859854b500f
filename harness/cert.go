// The certificates of every TLS test: CAs, the certificates they sign, the
// PEM files of a TLS server and its client (WriteTLS: Redis, Memcached, the
// xDS server), and a directory laid out like a Kubernetes secret volume,
// whose files change all at once as the kubelet swaps them.

package harness

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that signs certificates for one test.
type CA struct {
	// PEM is the CA's certificate, PEM-encoded: the content of a CA file.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA named name, valid from an hour ago for a day.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	ca, err := newCA(name)
	if err != nil {
		tb.Fatal(err)
	}
	return ca
}

func newCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("harness: CA %s: %w", name, err)
	}
	sn, err := serial()
	if err != nil {
		return nil, fmt.Errorf("harness: CA %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("harness: CA %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("harness: CA %s: %w", name, err)
	}
	return &CA{PEM: pemBlock("CERTIFICATE", der), cert: cert, key: key}, nil
}

// Pool returns a pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// CertSpec describes a certificate for Issue.
type CertSpec struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	URIs       []string
	// Usages are the extended key usages; none means client and server
	// authentication both.
	Usages []x509.ExtKeyUsage
	// NotBefore and NotAfter bound the validity; zero means an hour ago
	// and a day from now.
	NotBefore, NotAfter time.Time
}

// Cert is a certificate and its private key.
type Cert struct {
	// CertPEM and KeyPEM are the contents of a certificate file and of
	// its key file.
	CertPEM, KeyPEM []byte
	// TLS is the pair, for a tls.Config.
	TLS tls.Certificate
	// Leaf is the parsed certificate.
	Leaf *x509.Certificate
}

// Issue signs a certificate as spec says, by default valid from an hour ago for a day,
// with a fresh ECDSA P-256 key and a random serial number.
func (ca *CA) Issue(tb testing.TB, spec CertSpec) *Cert {
	tb.Helper()
	c, err := ca.issue(spec)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func (ca *CA) issue(spec CertSpec) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("harness: issue %s: %w", spec.CommonName, err)
	}
	sn, err := serial()
	if err != nil {
		return nil, fmt.Errorf("harness: issue %s: %w", spec.CommonName, err)
	}
	usages := spec.Usages
	if len(usages) == 0 {
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: spec.CommonName},
		NotBefore:    cmp.Or(spec.NotBefore, time.Now().Add(-time.Hour)),
		NotAfter:     cmp.Or(spec.NotAfter, time.Now().Add(24*time.Hour)),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
		DNSNames:     spec.DNSNames,
		IPAddresses:  spec.IPs,
	}
	for _, s := range spec.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("harness: URI %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("harness: issue %s: %w", spec.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("harness: issue %s: %w", spec.CommonName, err)
	}
	c := &Cert{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		return nil, fmt.Errorf("harness: issue %s: %w", spec.CommonName, err)
	}
	c.Leaf = c.TLS.Leaf
	return c, nil
}

// Server issues a server certificate for localhost, 127.0.0.1 and ::1.
func (ca *CA) Server(tb testing.TB) *Cert {
	tb.Helper()
	return ca.ServerValid(tb, time.Time{}, time.Time{})
}

// ServerValid is Server with the validity from notBefore to notAfter (a
// zero time is Issue's default).
func (ca *CA) ServerValid(tb testing.TB, notBefore, notAfter time.Time) *Cert {
	tb.Helper()
	return ca.Issue(tb, CertSpec{
		CommonName: "ratelimit test server",
		DNSNames:   []string{"localhost"},
		IPs:        loopbackIPs(),
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore:  notBefore,
		NotAfter:   notAfter,
	})
}

// Client issues a client certificate whose DNS SANs are dnsNames.
func (ca *CA) Client(tb testing.TB, dnsNames ...string) *Cert {
	tb.Helper()
	return ca.Issue(tb, CertSpec{
		CommonName: "ratelimit test client",
		DNSNames:   dnsNames,
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// ClientConfig returns a client configuration that trusts the given CAs
// alone and presents cert (none when nil).
func ClientConfig(cert *Cert, trust ...*CA) *tls.Config {
	pool := x509.NewCertPool()
	for _, ca := range trust {
		pool.AddCert(ca.cert)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS}
	}
	return cfg
}

// TLSFiles names the PEM files WriteTLS generates: a CA, a server
// certificate and a client certificate, both signed by the CA. They are
// what a TLS server of the tests loads (redis-server, memcached, the xDS
// server) and what its client's settings point to (REDIS_TLS_CACERT,
// REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY, ...).
type TLSFiles struct {
	CAFile         string
	ServerCertFile string
	ServerKeyFile  string
	ClientCertFile string
	ClientKeyFile  string
}

// WriteTLS generates into dir a new CA, a server certificate for hosts and
// the loopback addresses, and a client certificate, and returns the files.
// Each call makes a different CA, so the files of two calls do not trust
// each other. As in Envoy Gateway's /certs, the client certificate
// (tls.crt, tls.key) may serve too: it is valid for both uses, for
// localhost and the loopback addresses, so that the rate-limit service
// can present it on its own listener.
func WriteTLS(dir string, hosts ...string) (*TLSFiles, error) {
	f := &TLSFiles{
		CAFile:         filepath.Join(dir, "ca.crt"),
		ServerCertFile: filepath.Join(dir, "server.crt"),
		ServerKeyFile:  filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "tls.crt"),
		ClientKeyFile:  filepath.Join(dir, "tls.key"),
	}
	ca, err := newCA("ratelimit test CA")
	if err != nil {
		return nil, err
	}
	server, err := ca.issue(CertSpec{
		CommonName: "ratelimit test server",
		DNSNames:   hosts,
		IPs:        loopbackIPs(),
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	client, err := ca.issue(CertSpec{CommonName: "envoy-ratelimit", DNSNames: []string{"localhost"}, IPs: loopbackIPs()})
	if err != nil {
		return nil, err
	}
	for path, data := range map[string][]byte{
		f.CAFile:         ca.PEM,
		f.ServerCertFile: server.CertPEM,
		f.ServerKeyFile:  server.KeyPEM,
		f.ClientCertFile: client.CertPEM,
		f.ClientKeyFile:  client.KeyPEM,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("harness: tls: %w", err)
		}
	}
	return f, nil
}

// ClientConfig returns a client configuration that trusts the CA and
// presents the client certificate. It returns nil if the files are unreadable.
func (f *TLSFiles) ClientConfig() *tls.Config {
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

// ServerConfig is the TLS configuration of Envoy Gateway's rate-limit xDS
// server: TLS 1.3 and a client certificate signed by the CA, required.
func (f *TLSFiles) ServerConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.ServerCertFile, f.ServerKeyFile)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("harness: no CA certificate")
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// loopbackIPs are 127.0.0.1 and ::1, the addresses every server of the
// tests listens on.
func loopbackIPs() []net.IP { return []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback} }

// SecretDir is a directory laid out as Kubernetes mounts a secret: each
// file is a symlink name -> ..data/name, and ..data is a symlink to a
// directory holding one version of every file. Update swaps ..data in one
// rename, so a reader sees either every old file or every new one.
type SecretDir struct {
	// Dir is the directory.
	Dir string
	gen int
}

// NewSecretDir makes a SecretDir in a temporary directory holding files
// (name -> content).
func NewSecretDir(tb testing.TB, files map[string][]byte) *SecretDir {
	tb.Helper()
	d := &SecretDir{Dir: tb.TempDir()}
	d.Update(tb, files)
	return d
}

// Path returns the path of the file name, as a program reading the secret
// is given it.
func (d *SecretDir) Path(name string) string { return filepath.Join(d.Dir, name) }

// Update replaces the files as the kubelet does: it writes the new version
// into a directory of its own, points ..data_tmp at it, renames ..data_tmp
// over ..data (the one step a reader can see), links any new name, and
// removes the old version.
func (d *SecretDir) Update(tb testing.TB, files map[string][]byte) {
	tb.Helper()
	d.gen++
	version := fmt.Sprintf("..%04d_%s", d.gen, time.Now().Format("2006_01_02_15_04_05.000000000"))
	if err := os.Mkdir(filepath.Join(d.Dir, version), 0o755); err != nil {
		tb.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(d.Dir, version, name), content, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	data := filepath.Join(d.Dir, "..data")
	old, _ := os.Readlink(data)
	tmp := filepath.Join(d.Dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		tb.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(d.Dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			tb.Fatal(err)
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(d.Dir, old)); err != nil {
			tb.Fatal(err)
		}
	}
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
