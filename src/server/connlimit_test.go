package server

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/stats"
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
	httpLn := srv.httpLn.(*limitListener)
	eventually(t, "no connection open", func() bool {
		httpLn.mu.Lock()
		defer httpLn.mu.Unlock()
		return httpLn.open == 0
	})
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
			l, ok := tt.give.(*limitListener)
			if !ok {
				t.Fatalf("%s listener is a %T, want a *limitListener", tt.name, tt.give)
			}
			if l.capacity != tt.want {
				t.Errorf("%s listener capped at %d, want %d", tt.name, l.capacity, tt.want)
			}
		})
	}
}

func TestPeerShare(t *testing.T) {
	for _, tt := range []struct{ capacity, percent, want int }{
		{10000, 25, 2500},
		{1024, 25, 256},
		{200, 25, 50},
		{2, 25, 1},
		{10, 100, 0},
		{3, 1, 1},
	} {
		if got := peerShare(tt.capacity, tt.percent); got != tt.want {
			t.Errorf("peerShare(%d, %d) = %d, want %d", tt.capacity, tt.percent, got, tt.want)
		}
	}
}

func TestPeerKey(t *testing.T) {
	for _, tt := range []struct {
		give net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5000}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5000}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), Port: 5000}, "2001:db8:1:2::"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::7"), Port: 5001}, "2001:db8:1:2::"},
		{&net.UnixAddr{Name: "@", Net: "unix"}, "invalid IP"},
	} {
		if got := peerKey(tt.give).String(); got != tt.want {
			t.Errorf("peerKey(%v) = %s, want %s", tt.give, got, tt.want)
		}
	}
}

// closedByServer reports whether the server gave up on c within the wait:
// a read gets an answer, EOF or a reset rather than its deadline.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	n, err := c.Read(make([]byte, 1))
	return n > 0 || err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// pipeListener hands out the server's ends of net.Pipe connections, each
// from the client address its dial names.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

type pipeConn struct {
	net.Conn
	remote net.Addr
}

func (c pipeConn) RemoteAddr() net.Addr { return c.remote }

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { close(l.done); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// dial returns the client's end of a connection from ip.
func (l *pipeListener) dial(ip string) net.Conn {
	client, server := net.Pipe()
	l.conns <- pipeConn{Conn: server, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
	return client
}

// TestLimitListenerPeerShare: a client address gets its share of the
// slots and its next connections are closed at once, counted; another
// address still gets in, and the share frees as connections close.
func TestLimitListenerPeerShare(t *testing.T) {
	inner := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	over := stats.NewRegistry().Counter("over")
	l := newLimitListener(inner, limits{capacity: 4, perPeer: 2, setting: "TEST", overShare: over}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	inner.dial("10.0.0.2")
	inner.dial("10.0.0.2")
	first := <-accepted
	<-accepted
	if !closedByServer(inner.dial("10.0.0.2"), 5*time.Second) {
		t.Error("a third connection from an address whose share is 2 was not closed")
	}
	if over.Value() != 1 {
		t.Errorf("connections over the share counted %d, want 1", over.Value())
	}
	inner.dial("10.0.0.3")
	<-accepted // another address gets in
	first.Close()
	inner.dial("10.0.0.2")
	select {
	case <-accepted: // the share freed with a closed connection
	case <-time.After(10 * time.Second):
		t.Error("a connection from the address never got the slot one of its closed connections freed")
	}
}
