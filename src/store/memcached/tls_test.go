package memcached

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// TestTLSConfig dials a memcached that accepts only TLS with the client
// configuration TLSConfig builds from the MEMCACHE_TLS_* files (the
// checks of the chain and the name are tlsclient's, tried on Redis).
func TestTLSConfig(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcachedTLS(t)
	conf, err := TLSConfig(TLSFiles{ClientCert: srv.TLS.ClientCertFile, ClientKey: srv.TLS.ClientKeyFile, CACert: srv.TLS.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Config{Addrs: []string{srv.Addr}, TLS: conf, Timeout: time.Second})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatalf("WaitStarted over TLS = %v", err)
	}
}

// TestTLSConfigErrors: files that cannot make a configuration are errors
// of memcached's, never of another store's.
func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []TLSFiles{
		{ClientCert: dir + "/c.crt"},
		{CACert: dir + "/none.crt"},
		{ClientCert: dir + "/c.crt", ClientKey: dir + "/c.key"},
	} {
		_, err := TLSConfig(f)
		if err == nil || !strings.HasPrefix(err.Error(), "memcached: tls: ") || strings.Contains(err.Error(), "REDIS") {
			t.Errorf("TLSConfig(%+v) = %v, want an error of memcached's", f, err)
		}
	}
}

// TestClientOverTLS: the client the store makes speaks to a memcached that
// accepts only TLS.
func TestClientOverTLS(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcachedTLS(t)
	cfg := Config{Addrs: []string{srv.Addr}, TLS: srv.TLS.ClientConfig(), Timeout: time.Second}
	c := mcclient.New(mcclient.Config{Conns: 2, Timeout: time.Second, MaxQueue: 16, Dial: dialer(cfg)})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetServers(srv.Addr); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(t.Context(), "tls_n", []byte("1"), 60); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Incr(t.Context(), "tls_n", 2); err != nil || n != 3 {
		t.Fatalf("incr over TLS = %d, %v, want 3", n, err)
	}
}
