package redis

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// dialStall dials srv and bounds the connection's silences by stall and
// the pace p (nil: stall alone).
func dialStall(t *testing.T, srv *harness.RedisServer, stall time.Duration, p *pace) (*stallConn, syscall.RawConn) {
	t.Helper()
	raw, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	rc, err := raw.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return newStallConn(raw, rc, stall, p).(*stallConn), rc
}

const ping = "*1\r\n$4\r\nPING\r\n"

// TestStallLateReaderIsNoSilence: a reply that waits in the kernel while
// the reader comes late, past the bound, is read: the reader's lateness is
// not the server's silence (a busy process must not take a healthy Redis
// for a frozen one).
func TestStallLateReaderIsNoSilence(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	c, rc := dialStall(t, srv, 50*time.Millisecond, nil)
	if _, err := c.Write([]byte(ping)); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the reply in the kernel", func() bool { return heard(rc) })
	// The reader comes a second after the write: far past the bound.
	c.last = c.last.Add(-time.Second)
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "+PONG\r\n" {
		t.Errorf("late read of a reply waiting in the kernel = %q, %v; want +PONG", line, err)
	}
}

// TestStallFrozenServer: a read from a frozen Redis fails with errStalled
// once the bound has passed since the write, long before go-redis's
// deadline; one whose deadline comes first gets that deadline's error, and
// so does one on a connection that owes nothing.
func TestStallFrozenServer(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	const stall = 100 * time.Millisecond
	c, _ := dialStall(t, srv, stall, nil)
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	if _, err := c.Write([]byte(ping)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 16))
	took := time.Since(start)
	var ne net.Error
	if !errors.Is(err, errStalled) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read from a frozen Redis = %v, want errStalled, a timeout", err)
	}
	t.Logf("silence found after %v (bound %v)", took, stall)
	if took < stall {
		t.Errorf("silence found after %v, before the bound %v", took, stall)
	}

	// go-redis's own deadline, when it is the earlier, is its own.
	c2, _ := dialStall(t, srv, time.Minute, nil)
	if _, err := c2.Write([]byte(ping)); err != nil {
		t.Fatal(err)
	}
	if err := c2.SetReadDeadline(time.Now().Add(stall)); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Read(make([]byte, 16)); !isDeadline(err) {
		t.Errorf("Read past go-redis's deadline = %v, want that deadline's error", err)
	}

	// A connection that owes nothing (a subscriber waiting for messages)
	// may be silent: only go-redis's deadline ends its read.
	c3, _ := dialStall(t, srv, stall, nil)
	c3.owes = func() bool { return false }
	if err := c3.SetReadDeadline(time.Now().Add(3 * stall)); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Read(make([]byte, 16)); !isDeadline(err) {
		t.Errorf("Read owing nothing = %v, want go-redis's deadline's error", err)
	}
}

// isDeadline reports whether err is a read deadline's.
func isDeadline(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, errStalled)
}

// TestStallOff: without a bound, or without a socket to look into, the
// connection is left as it is.
func TestStallOff(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if c := newStallConn(a, nil, time.Second, nil); c != a {
		t.Error("a connection without a socket was wrapped")
	}
	if c := newStallConn(a, nil, -1, nil); c != a {
		t.Error("a connection with no bound was wrapped")
	}
}

// TestStallTLSHandshake: a TLS handshake with a frozen Redis, before
// go-redis sets any deadline, fails on the silence too, so that a new
// connection does not wait for the store's timeout.
func TestStallTLSHandshake(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{TLS: true})
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	const stall = 100 * time.Millisecond
	c, _ := dialStall(t, srv, stall, nil)
	conf := srv.TLS.ClientConfig()
	conf.ServerName = "127.0.0.1"
	ctx, cancel := context.WithTimeout(t.Context(), 50*stall)
	defer cancel()
	err := tls.Client(c, conf).HandshakeContext(ctx)
	if !errors.Is(err, errStalled) {
		t.Errorf("TLS handshake with a frozen Redis = %v, want errStalled", err)
	}
}

// TestPaceStretchesTheBound: a server slow to answer lately is allowed
// paceFactor times its slowest answer of the last paceMemory before its
// silence counts; a faster answer does not shorten that, and it is
// forgotten after paceMemory.
func TestPaceStretchesTheBound(t *testing.T) {
	const stall = 250 * time.Millisecond
	t0 := time.Unix(1000, 0)
	var p pace
	if got := p.bound(stall, t0); got != stall {
		t.Errorf("bound with nothing seen = %v, want %v", got, stall)
	}
	p.observe(10*time.Millisecond, t0)
	if got := p.bound(stall, t0); got != stall {
		t.Errorf("bound after a 10ms answer = %v, want %v", got, stall)
	}
	p.observe(300*time.Millisecond, t0.Add(time.Second))
	p.observe(5*time.Millisecond, t0.Add(1500*time.Millisecond))
	if got, want := p.bound(stall, t0.Add(2*time.Second)), paceFactor*300*time.Millisecond; got != want {
		t.Errorf("bound a second after a 300ms answer = %v, want %v", got, want)
	}
	if got := p.bound(stall, t0.Add(time.Second+paceMemory+time.Millisecond)); got != stall {
		t.Errorf("bound past paceMemory after the slow answer = %v, want %v", got, stall)
	}
	var none *pace
	none.observe(time.Hour, t0)
	if got := none.bound(stall, t0); got != stall {
		t.Errorf("bound without a pace = %v, want %v", got, stall)
	}
	var ps paces
	if a, again := ps.of("a:1"), ps.of("a:1"); a != again || a == ps.of("b:1") {
		t.Error("paces.of: one pace per address, the same each time, wanted")
	}
	for i := range maxPaces {
		ps.of(fmt.Sprint("n", i))
	}
	if ps.of("past:1") != nil {
		t.Errorf("paces.of past %d servers = a pace, want nil", maxPaces)
	}
}

// TestStallFollowsThePace: a Redis that answered slowly a moment ago and
// now keeps silent for longer than Stall, but within its stretched bound,
// is waited for (a busy host can keep a healthy Redis from running that
// long); without the pace the same silence fails the read.
func TestStallFollowsThePace(t *testing.T) {
	t.Parallel()
	const (
		stall = 50 * time.Millisecond
		quiet = 4 * stall // the silence
	)
	for _, slowLately := range []bool{true, false} {
		srv := harness.StartRedis(t, harness.RedisOptions{})
		var p pace
		if slowLately {
			p.observe(10*quiet, time.Now()) // a bound of 40 times the silence
		}
		c, _ := dialStall(t, srv, stall, &p)
		if err := srv.Freeze(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(ping)); err != nil {
			t.Fatal(err)
		}
		thaw := time.AfterFunc(quiet, func() { _ = srv.Thaw() })
		t.Cleanup(func() { thaw.Stop(); _ = srv.Thaw() })
		if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		switch {
		case slowLately && (err != nil || line != "+PONG\r\n"):
			t.Errorf("a silence of %v after answers of %v: %q, %v; want +PONG", quiet, 10*quiet, line, err)
		case !slowLately && !errors.Is(err, errStalled):
			t.Errorf("a silence of %v with a bound of %v: %q, %v; want errStalled", quiet, stall, line, err)
		}
	}
}
