package memcached

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// TestTLSConfig dials a memcached that accepts only TLS with the client
// configuration TLSConfig builds from the MEMCACHE_TLS_* files (the
// checks of the chain and the name are tlsclient's, tried on Redis).
func TestTLSConfig(t *testing.T) {
	t.Parallel()
	srv := storetest.StartMemcachedTLS(t)
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
