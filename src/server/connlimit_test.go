package server

import (
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/server/listen"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct{ harness.Log }

// TestHTTPConnectionCap fills HTTP_MAX_CONNECTIONS on both HTTP listeners.
// On PORT, with connections that send nothing: a new client closes the
// one idle longest and is served, counted in connections_evicted. On the
// debug listener, with live-view streams (busy: a request under way): a
// new client waits (and the cap is logged) until a stream ends.
func TestHTTPConnectionCap(t *testing.T) {
	logs := &syncBuffer{}
	// Every client is 127.0.0.1 here: no share of its own per address.
	srv, _ := build(t, serverRules, map[string]string{"HTTP_MAX_CONNECTIONS": "2", "MAX_CONNECTIONS_PER_PEER_PERCENT": "100"}, logs)
	run(t, srv)
	a := srv.Addrs()
	base, debug := "http://"+a.HTTP.String(), "http://"+a.Debug.String()
	fresh := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	eventually(t, "healthy", func() bool {
		resp, err := fresh.Get(base + "/healthcheck")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	// The probe's connection above closes on the server's side too.
	httpLn := srv.httpLn.(*listen.Listener)
	eventually(t, "no connection open", func() bool { return httpLn.Open() == 0 })
	var silent []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", a.HTTP.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		silent = append(silent, c)
	}
	resp, err := fresh.Get(base + "/healthcheck")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /healthcheck with PORT full of silent connections: %v %v; want 200", resp, err)
	}
	resp.Body.Close()
	if !closedByServer(silent[0], 5*time.Second) {
		t.Error("the connection idle longest was not closed for the new one")
	}
	if got := srv.stats.Counter("ratelimit.server.connections_evicted").Value(); got != 1 {
		t.Errorf("connections_evicted = %d, want 1", got)
	}

	var streams []*http.Response
	for range 2 {
		resp, err := http.Get(debug + "/api/v1/stream")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		streams = append(streams, resp)
	}
	waiting := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := waiting.Get(debug + "/stats"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /stats with the debug listener full of streams answered %d; want it to wait", resp.StatusCode)
	}
	eventually(t, "the cap warning", func() bool { return strings.Contains(logs.String(), "HTTP_MAX_CONNECTIONS") })
	streams[0].Body.Close()
	eventually(t, "served after a stream ended", func() bool {
		resp, err := fresh.Get(debug + "/stats")
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
			l, ok := tt.give.(*listen.Listener)
			if !ok {
				t.Fatalf("%s listener is a %T, want a *listen.Listener", tt.name, tt.give)
			}
			if l.Capacity != tt.want {
				t.Errorf("%s listener capped at %d, want %d", tt.name, l.Capacity, tt.want)
			}
		})
	}
}

// closedByServer reports whether the server gave up on c within the wait:
// a read gets an answer, EOF or a reset rather than its deadline.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	n, err := c.Read(make([]byte, 1))
	return n > 0 || err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}
