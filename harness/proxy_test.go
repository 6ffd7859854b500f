package harness

import (
	"bufio"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// proxyClient is one RESP connection through a Proxy.
type proxyClient struct {
	conn net.Conn
	rd   *bufio.Reader
}

func dialProxy(t *testing.T, p *Proxy) *proxyClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &proxyClient{conn: c, rd: bufio.NewReader(c)}
}

// do sends one command and reads its reply within d.
func (c *proxyClient) do(d time.Duration, args ...string) (any, error) {
	_ = c.conn.SetDeadline(time.Now().Add(d))
	return redisRoundTrip(c.conn, c.rd, args)
}

// The proxy against a real redis-server: each fault does to a client what
// its documentation says, and Heal undoes it.
func TestProxy(t *testing.T) {
	r := StartRedis(t, RedisOptions{})
	p := StartProxy(t, r.Addr)
	ctx := t.Context()

	t.Run("pass", func(t *testing.T) {
		c := dialProxy(t, p)
		if v, err := c.do(2*time.Second, "PING"); err != nil || v != "PONG" {
			t.Fatalf("PING through the proxy = %v, %v; want PONG", v, err)
		}
		if n := p.Conns(); n != 1 {
			t.Errorf("Conns() = %d with one client, want 1", n)
		}
	})

	t.Run("latency", func(t *testing.T) {
		c := dialProxy(t, p)
		p.SetLatency(150 * time.Millisecond)
		began := time.Now()
		if v, err := c.do(2*time.Second, "PING"); err != nil || v != "PONG" {
			t.Fatalf("PING with latency = %v, %v; want PONG", v, err)
		}
		if took := time.Since(began); took < 150*time.Millisecond {
			t.Errorf("round trip with 150ms of latency took %v", took)
		}
		p.Heal()
		began = time.Now()
		if _, err := c.do(2*time.Second, "PING"); err != nil {
			t.Fatal(err)
		}
		// Generous: a loaded machine, and the race detector.
		if took := time.Since(began); took > 100*time.Millisecond {
			t.Errorf("round trip after Heal took %v, want no added latency", took)
		}
	})

	t.Run("drop", func(t *testing.T) {
		c := dialProxy(t, p)
		p.DropReplies()
		defer p.Heal()
		// The connection is closed after half the reply: the client
		// reads a truncated reply and EOF, never a timeout.
		v, err := c.do(2*time.Second, "SET", "dropped", "yes-it-ran")
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("SET with replies dropped = %v, %v; want the connection cut", v, err)
		}
		if got, err := r.Do(ctx, "GET", "dropped"); err != nil || got != "yes-it-ran" {
			t.Errorf("GET dropped on the server = %v, %v; the command should have run", got, err)
		}
		if p.Cuts() < 1 {
			t.Errorf("Cuts() = %d, want at least 1", p.Cuts())
		}
		p.Heal()
		if v, err := dialProxy(t, p).do(2*time.Second, "PING"); err != nil || v != "PONG" {
			t.Errorf("PING on a new connection after Heal = %v, %v", v, err)
		}
	})

	t.Run("blackhole", func(t *testing.T) {
		open := dialProxy(t, p)
		if _, err := open.do(2*time.Second, "PING"); err != nil {
			t.Fatal(err)
		}
		p.Blackhole()
		if _, err := open.do(200*time.Millisecond, "INCR", "held"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("INCR on an open connection in the blackhole: %v, want a timeout", err)
		}
		late := dialProxy(t, p) // accepted, but not connected on
		if _, err := late.do(200*time.Millisecond, "PING"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("PING on a new connection in the blackhole: %v, want a timeout", err)
		}
		if got, _ := r.Do(ctx, "GET", "held"); got != nil {
			t.Fatalf("held = %v on the server: the blackhole let the command through", got)
		}
		p.Heal()
		// What was held is delivered: the INCR runs and its reply,
		// and the PING's, arrive.
		_ = open.conn.SetDeadline(time.Now().Add(2 * time.Second))
		if v, err := redisReadReply(open.rd); err != nil || v != int64(1) {
			t.Errorf("held INCR after Heal = %v, %v; want 1", v, err)
		}
		_ = late.conn.SetDeadline(time.Now().Add(2 * time.Second))
		if v, err := redisReadReply(late.rd); err != nil || v != "PONG" {
			t.Errorf("held PING after Heal = %v, %v; want PONG", v, err)
		}
	})

	t.Run("target_down", func(t *testing.T) {
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = r.Start() }()
		c := dialProxy(t, p)
		if _, err := c.do(2*time.Second, "PING"); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("PING with the target down: %v, want the connection closed at once", err)
		}
	})

	t.Run("close", func(t *testing.T) {
		q := StartProxy(t, r.Addr)
		c := dialProxy(t, q)
		if _, err := c.do(2*time.Second, "PING"); err != nil {
			t.Fatal(err)
		}
		q.Blackhole() // Close must not wait for the blackhole
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		if n := q.Conns(); n != 0 {
			t.Errorf("Conns() = %d after Close, want 0", n)
		}
		if _, err := c.do(2*time.Second, "PING"); err == nil {
			t.Error("PING after Close succeeded, want the connection closed")
		}
	})
}
