package redis

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// dialStall dials srv and bounds the connection's silences by stall.
func dialStall(t *testing.T, srv *storetest.RedisServer, stall time.Duration) (*stallConn, syscall.RawConn) {
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
	return newStallConn(raw, rc, stall).(*stallConn), rc
}

const ping = "*1\r\n$4\r\nPING\r\n"

// TestStallLateReaderIsNoSilence: a reply that waits in the kernel while
// the reader comes late, past the bound, is read: the reader's lateness is
// not the server's silence (a busy process must not take a healthy Redis
// for a frozen one).
func TestStallLateReaderIsNoSilence(t *testing.T) {
	t.Parallel()
	srv := storetest.StartRedis(t, storetest.RedisOptions{})
	c, rc := dialStall(t, srv, 50*time.Millisecond)
	if _, err := c.Write([]byte(ping)); err != nil {
		t.Fatal(err)
	}
	storetest.WaitFor(t, 10*time.Second, "the reply in the kernel", func() bool { return heard(rc) })
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
// deadline; one whose deadline comes first gets that deadline's error.
func TestStallFrozenServer(t *testing.T) {
	t.Parallel()
	srv := storetest.StartRedis(t, storetest.RedisOptions{})
	const stall = 100 * time.Millisecond
	c, _ := dialStall(t, srv, stall)
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
	c2, _ := dialStall(t, srv, time.Minute)
	if _, err := c2.Write([]byte(ping)); err != nil {
		t.Fatal(err)
	}
	if err := c2.SetReadDeadline(time.Now().Add(stall)); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Read(make([]byte, 16)); !isDeadline(err) {
		t.Errorf("Read past go-redis's deadline = %v, want that deadline's error", err)
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
	if c := newStallConn(a, nil, time.Second); c != a {
		t.Error("a connection without a socket was wrapped")
	}
	if c := newStallConn(a, nil, -1); c != a {
		t.Error("a connection with no bound was wrapped")
	}
}

// TestStallTLSHandshake: a TLS handshake with a frozen Redis, before
// go-redis sets any deadline, fails on the silence too, so that a new
// connection does not wait for the store's timeout.
func TestStallTLSHandshake(t *testing.T) {
	t.Parallel()
	srv := storetest.StartRedis(t, storetest.RedisOptions{TLS: true})
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	const stall = 100 * time.Millisecond
	c, _ := dialStall(t, srv, stall)
	conf := srv.TLS.ClientConfig()
	conf.ServerName = "127.0.0.1"
	ctx, cancel := context.WithTimeout(t.Context(), 50*stall)
	defer cancel()
	err := tls.Client(c, conf).HandshakeContext(ctx)
	if !errors.Is(err, errStalled) {
		t.Errorf("TLS handshake with a frozen Redis = %v, want errStalled", err)
	}
}
