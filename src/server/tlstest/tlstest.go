// Package tlstest makes certificates for tests of TLS listeners: CAs,
// certificates they sign, and a directory laid out like a Kubernetes
// secret volume, whose files change all at once as the kubelet swaps them.
// Tests only: nothing outside _test files imports it.
package tlstest

import (
	"cmp"
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
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("tlstest: CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("tlstest: CA %s: %v", name, err)
	}
	return &CA{PEM: pemBlock("CERTIFICATE", der), cert: cert, key: key}
}

// Pool returns a pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Spec describes a certificate for Issue.
type Spec struct {
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
func (ca *CA) Issue(tb testing.TB, spec Spec) *Cert {
	tb.Helper()
	key := newKey(tb)
	usages := spec.Usages
	if len(usages) == 0 {
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb),
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
			tb.Fatalf("tlstest: URI %q: %v", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("tlstest: issue %s: %v", spec.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("tlstest: issue %s: %v", spec.CommonName, err)
	}
	c := &Cert{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		tb.Fatalf("tlstest: issue %s: %v", spec.CommonName, err)
	}
	c.Leaf = c.TLS.Leaf
	return c
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
	return ca.Issue(tb, Spec{
		CommonName: "ratelimit test server",
		DNSNames:   []string{"localhost"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore:  notBefore,
		NotAfter:   notAfter,
	})
}

// Client issues a client certificate whose DNS SANs are dnsNames.
func (ca *CA) Client(tb testing.TB, dnsNames ...string) *Cert {
	tb.Helper()
	return ca.Issue(tb, Spec{
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

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("tlstest: key: %v", err)
	}
	return key
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		tb.Fatalf("tlstest: serial: %v", err)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
