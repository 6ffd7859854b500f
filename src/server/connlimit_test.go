package server

import (
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestConnCapsFit(t *testing.T) {
	tests := []struct {
		name   string
		give   connCaps
		nofile uint64
		want   connCaps
		lower  bool
	}{
		{"unknown_limit", connCaps{10000, 1024, 2}, 0, connCaps{10000, 1024, 2}, false},
		{"defaults_fit_20000", connCaps{10000, 1024, 3}, 20000, connCaps{10000, 1024, 3}, false},
		// 1<<20 is Docker's usual limit: a quarter kept back is plenty.
		{"large_limit", connCaps{100000, 1024, 2}, 1 << 20, connCaps{100000, 1024, 2}, false},
		// 4096: 3072 for the listeners, shared in proportion of 12048.
		{"lowered_in_proportion", connCaps{10000, 1024, 2}, 4096, connCaps{2549, 261, 2}, true},
		// 1024: the 256 reserve leaves 768.
		{"small_limit", connCaps{10000, 1024, 2}, 1024, connCaps{637, 65, 2}, true},
		{"below_the_reserve", connCaps{10000, 1024, 2}, 100, connCaps{1, 1, 2}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, lowered := tt.give.fit(tt.nofile)
			if got != tt.want || lowered != tt.lower {
				t.Errorf("%+v.fit(%d) = %+v, %v; want %+v, %v", tt.give, tt.nofile, got, lowered, tt.want, tt.lower)
			}
			if lowered && tt.nofile > fdReserveMin {
				if budget := tt.nofile - max(fdReserveMin, tt.nofile/fdReserveDivisor); got.total() > budget {
					t.Errorf("lowered caps total %d, above the budget %d", got.total(), budget)
				}
			}
		})
	}
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestHTTPConnectionCap holds HTTP_MAX_CONNECTIONS connections open on the
// HTTP listener: a further client waits (and the cap is logged) while the
// debug listener, which has its own cap, still answers; as soon as one
// held connection closes the waiting client is served.
func TestHTTPConnectionCap(t *testing.T) {
	logs := &syncBuffer{}
	srv, _ := build(t, serverRules, map[string]string{"HTTP_MAX_CONNECTIONS": "2"}, logs)
	run(t, srv)
	a := srv.Addrs()
	base, debug := "http://"+a.HTTP.String(), "http://"+a.Debug.String()
	eventually(t, "healthy", func() bool { c, _ := get(t, base+"/healthcheck"); return c == 200 })
	// The client above may keep its connection alive; use fresh ones.
	http.DefaultClient.CloseIdleConnections()

	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", a.HTTP.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		held = append(held, c)
	}
	// Once it accepted both, the listener waits for a free slot and logs
	// that it is at its cap.
	eventually(t, "the cap warning", func() bool { return strings.Contains(logs.String(), "HTTP_MAX_CONNECTIONS") })

	waiting := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := waiting.Get(base + "/healthcheck"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /healthcheck at the cap answered %d; want it to wait", resp.StatusCode)
	}
	if c, _ := get(t, debug+"/stats"); c != 200 {
		t.Errorf("debug listener with the HTTP listener at its cap: %d, want 200", c)
	}
	held[0].Close()
	eventually(t, "served after a connection closed", func() bool {
		resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Get(base + "/healthcheck")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// TestEveryListenerIsCapped: gRPC has GRPC_MAX_CONNECTIONS, and each HTTP
// listener, Prometheus's included, HTTP_MAX_CONNECTIONS.
func TestEveryListenerIsCapped(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{
		"USE_PROMETHEUS":       "true",
		"PROMETHEUS_ADDR":      "127.0.0.1:0",
		"GRPC_MAX_CONNECTIONS": "7",
		"HTTP_MAX_CONNECTIONS": "5",
	})
	tests := []struct {
		name string
		give net.Listener
		want int
	}{
		{"grpc", srv.grpcLn, 7},
		{"http", srv.httpLn, 5},
		{"debug", srv.debugLn, 5},
		{"prometheus", srv.promLn, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, ok := tt.give.(*limitListener)
			if !ok {
				t.Fatalf("%s listener is a %T, want a *limitListener", tt.name, tt.give)
			}
			if cap(l.sem) != tt.want {
				t.Errorf("%s listener capped at %d, want %d", tt.name, cap(l.sem), tt.want)
			}
		})
	}
}
