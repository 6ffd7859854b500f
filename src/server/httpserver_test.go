package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/store/redis"
)

// TestHTTPBounds: headers over httpMaxHeaderBytes are answered 431, and a
// CPU profile still works under the debug listener's write timeout.
func TestHTTPBounds(t *testing.T) {
	srv, _ := start(t, serverRules, nil)
	a := srv.Addrs()
	base, debug := "http://"+a.HTTP.String(), "http://"+a.Debug.String()
	eventually(t, "healthy", func() bool { c, _ := get(t, base+"/healthcheck"); return c == 200 })

	t.Run("headers_too_large", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, base+"/healthcheck", nil)
		req.Header.Set("X-Pad", strings.Repeat("a", httpMaxHeaderBytes+8192))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("GET with %d bytes of headers: %d, want 431", httpMaxHeaderBytes+8192, resp.StatusCode)
		}
	})

	// net/http/pprof extends the debug listener's write deadline by the
	// duration of a CPU profile, so a profile works whatever its length.
	t.Run("cpu_profile", func(t *testing.T) {
		c, body := get(t, debug+"/debug/pprof/profile?seconds=1")
		if c != 200 || len(body) == 0 {
			t.Errorf("/debug/pprof/profile?seconds=1: %d with %d bytes, want 200 and a profile", c, len(body))
		}
	})
}

// TestHTTPServersHaveBounds: every HTTP listener, Prometheus's included, has
// the documented timeouts and header bound; on PORT the write timeout makes
// room for the store's own timeout. (The read side is also tested over the
// wire, in integration-test; net/http enforces the rest.)
func TestHTTPServersHaveBounds(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{
		"USE_PROMETHEUS":  "true",
		"PROMETHEUS_ADDR": "127.0.0.1:0",
	})
	tests := []struct {
		name  string
		give  *http.Server
		write time.Duration
	}{
		{"http", srv.httpSrv, httpWriteTimeout + srv.store.timeout},
		{"debug", srv.debugSrv, debugWriteTimeout},
		{"prometheus", srv.promSrv, httpWriteTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.give
			if h.ReadHeaderTimeout != httpReadHeaderTimeout || h.ReadTimeout != httpReadTimeout ||
				h.WriteTimeout != tt.write || h.IdleTimeout != httpIdleTimeout || h.MaxHeaderBytes != httpMaxHeaderBytes {
				t.Errorf("%s server: read header %v, read %v, write %v, idle %v, max header %d; want %v, %v, %v, %v, %d",
					tt.name, h.ReadHeaderTimeout, h.ReadTimeout, h.WriteTimeout, h.IdleTimeout, h.MaxHeaderBytes,
					httpReadHeaderTimeout, httpReadTimeout, tt.write, httpIdleTimeout, httpMaxHeaderBytes)
			}
		})
	}
}

func TestRedisTimeoutIsTheLongerOfBoth(t *testing.T) {
	tests := []struct {
		name string
		give redis.Config
		want time.Duration
	}{
		{"main_only", redis.Config{Timeout: 3 * time.Second}, 3 * time.Second},
		{"per_second_longer", redis.Config{Timeout: time.Second, PerSecond: &redis.Config{Timeout: 4 * time.Second}}, 4 * time.Second},
		{"main_longer", redis.Config{Timeout: 5 * time.Second, PerSecond: &redis.Config{Timeout: time.Second}}, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := redisTimeout(tt.give); got != tt.want {
				t.Errorf("redisTimeout(%+v) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
}
