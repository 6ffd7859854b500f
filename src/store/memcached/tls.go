package memcached

import (
	"crypto/tls"
	"fmt"

	"github.com/ratelimitd/ratelimit/src/store/tlsclient"
)

// TLSFiles names the PEM files of MEMCACHE_TLS_CLIENT_CERT,
// MEMCACHE_TLS_CLIENT_KEY and MEMCACHE_TLS_CACERT, and
// MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION (see tlsclient.Files).
type TLSFiles = tlsclient.Files

// TLSConfig builds the client TLS configuration for Config.TLS from the
// MEMCACHE_TLS_* files, as envoyproxy/ratelimit does. Each connection's
// ServerName is its server's host (see Config.TLS).
func TLSConfig(f TLSFiles) (*tls.Config, error) {
	c, err := tlsclient.Config(f)
	if err != nil {
		return nil, fmt.Errorf("memcached: tls: %w", err)
	}
	return c, nil
}
