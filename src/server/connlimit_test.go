package server

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/http"
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

// TestHTTPConnectionCap holds HTTP_MAX_CONNECTIONS connections open on the
// HTTP listener: a further client waits (and the cap is logged) while the
// debug listener, which has its own cap, still answers; as soon as one
// held connection closes the waiting client is served.
func TestHTTPConnectionCap(t *testing.T) {
	logs := &syncBuffer{}
	// Every client is 127.0.0.1 here: no share of its own per address.
	srv, _ := build(t, serverRules, map[string]string{"HTTP_MAX_CONNECTIONS": "2", "MAX_CONNECTIONS_PER_PEER_PERCENT": "100"}, logs)
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
	waiting := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := waiting.Get(base + "/healthcheck"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /healthcheck at the cap answered %d; want it to wait", resp.StatusCode)
	}
	// The listener waits for a free slot and logs that it is at its cap.
	eventually(t, "the cap warning", func() bool { return strings.Contains(logs.String(), "HTTP_MAX_CONNECTIONS") })
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

// dialFrom connects to addr from the loopback address local (127.0.0.x:
// another client address on the same machine).
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read returns EOF
// or a reset rather than waiting past the deadline.
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestLimitListenerPeerShare: a client address gets its share of the
// slots and its next connections are closed at once, counted; another
// address still gets in, and the share frees as connections close.
func TestLimitListenerPeerShare(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := stats.NewRegistry()
	over := reg.Counter("over")
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
	addr := inner.Addr().String()
	dialFrom(t, "127.0.0.2", addr)
	dialFrom(t, "127.0.0.2", addr)
	first := <-accepted
	<-accepted
	if !closedByServer(dialFrom(t, "127.0.0.2", addr), 5*time.Second) {
		t.Error("a third connection from an address whose share is 2 was not closed")
	}
	if over.Value() != 1 {
		t.Errorf("connections over the share counted %d, want 1", over.Value())
	}
	dialFrom(t, "127.0.0.3", addr)
	<-accepted // another address gets in
	first.Close()
	dialFrom(t, "127.0.0.2", addr)
	select {
	case <-accepted: // the share freed with a closed connection
	case <-time.After(10 * time.Second):
		t.Error("a connection from the address never got the slot one of its closed connections freed")
	}
}
