package listen

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/stats"
)

func TestConnCapsFit(t *testing.T) {
	tests := []struct {
		name   string
		give   Caps
		nofile uint64
		want   Caps
		lower  bool
	}{
		{"unknown_limit", Caps{10000, 1024, 2}, 0, Caps{10000, 1024, 2}, false},
		{"defaults_fit_20000", Caps{10000, 1024, 3}, 20000, Caps{10000, 1024, 3}, false},
		// 1<<20 is Docker's usual limit: a quarter kept back is plenty.
		{"large_limit", Caps{100000, 1024, 2}, 1 << 20, Caps{100000, 1024, 2}, false},
		// 4096: 3072 for the listeners, shared in proportion of 12048.
		{"lowered_in_proportion", Caps{10000, 1024, 2}, 4096, Caps{2549, 261, 2}, true},
		// 1024: the 256 reserve leaves 768.
		{"small_limit", Caps{10000, 1024, 2}, 1024, Caps{637, 65, 2}, true},
		{"below_the_reserve", Caps{10000, 1024, 2}, 100, Caps{1, 1, 2}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, lowered := tt.give.Fit(tt.nofile)
			if got != tt.want || lowered != tt.lower {
				t.Errorf("%+v.Fit(%d) = %+v, %v; want %+v, %v", tt.give, tt.nofile, got, lowered, tt.want, tt.lower)
			}
			if lowered && tt.nofile > fdReserveMin {
				if budget := tt.nofile - max(fdReserveMin, tt.nofile/fdReserveDivisor); got.total() > budget {
					t.Errorf("lowered caps total %d, above the budget %d", got.total(), budget)
				}
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
	l := Limit(inner, Limits{Capacity: 4, PerPeerPercent: 50, Setting: "TEST", OverShare: over}, slog.New(slog.DiscardHandler))
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
