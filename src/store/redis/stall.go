package redis

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// A server that stops answering (a frozen process, a blackholed network, a
// stalled proxy) sends nothing more, and REDIS_TIMEOUT (the anchor's 10 s)
// is far too long to wait before calling it failed; but a deadline that
// passes is no evidence by itself: under load, this process may be what is
// late (issue 25). What tells the two apart is the socket: a server that
// answered has left bytes in the kernel, read or not. stallConn bounds how
// long a connection may wait for a server that owes replies and sends
// nothing (Config.Stall), and at that bound looks into the kernel's buffer
// before it calls the server silent (issue 36).

// errStalled is wrapped by the error of a read that found the server
// silent (see stallConn); the round trip's breaker then opens at once
// (breakerHook).
var errStalled = errors.New("server silent")

// stallError is the error of a read that found the server silent. It is a
// timeout (net.Error), as a read deadline's: go-redis drops the connection.
type stallError struct{ d time.Duration }

func (e *stallError) Error() string {
	return fmt.Sprintf("%v: no byte for %v while replies are owed (STORE_STALL_TIMEOUT)", errStalled, e.d)
}
func (e *stallError) Unwrap() error   { return errStalled }
func (e *stallError) Timeout() bool   { return true }
func (e *stallError) Temporary() bool { return true }

// stallConn is the socket of a connection to Redis, beneath TLS and the
// reply guard. A read that waits more than stall since the server was last
// written to or last heard from (a write returned, a read brought bytes)
// fails with a stallError, unless the kernel holds bytes of the server's
// (or its end of the stream) that this process has not read yet: then the
// server answered and the reader was late, and the read goes on. So only
// the server's silence fails a read, never this process's lateness.
//
// The bound is a read deadline set when go-redis sets its own (once per
// round trip), the earlier of the two, so a read that gets its bytes in
// time costs nothing more. go-redis uses a connection from one goroutine
// at a time; Close may come from another, and touches nothing here.
type stallConn struct {
	net.Conn
	raw   syscall.RawConn
	stall time.Duration
	// deadline is the read deadline go-redis asked for (zero: none), set
	// the one in force on the socket.
	deadline, set time.Time
	// last is when the server was last written to or heard from.
	last time.Time
	err  stallError
}

// newStallConn bounds c's silences by stall, raw being c's socket; c as
// it is when there is no bound or no socket to look into.
func newStallConn(c net.Conn, raw syscall.RawConn, stall time.Duration) net.Conn {
	if stall <= 0 || raw == nil {
		return c
	}
	s := &stallConn{Conn: c, raw: raw, stall: stall, last: time.Now(), err: stallError{stall}}
	// Bounded from the start: the TLS handshake reads before go-redis
	// sets any deadline.
	_ = s.arm()
	return s
}

func (c *stallConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.last = time.Now()
	}
	return n, err
}

func (c *stallConn) SetReadDeadline(t time.Time) error {
	c.deadline = t
	return c.arm()
}

func (c *stallConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// arm sets the socket's read deadline: the earlier of go-redis's and the
// end of the silence allowed.
func (c *stallConn) arm() error {
	t := c.last.Add(c.stall)
	if !c.deadline.IsZero() && c.deadline.Before(t) {
		t = c.deadline
	}
	c.set = t
	return c.Conn.SetReadDeadline(t)
}

// maxLooks bounds the times one Read finds bytes waiting in the kernel
// after its bound passed without reading them, which only a socket that
// keeps reporting readable without data could do.
const maxLooks = 1000

func (c *stallConn) Read(p []byte) (int, error) {
	for range maxLooks {
		n, err := c.Conn.Read(p)
		if n > 0 {
			c.last = time.Now()
			return n, err
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !c.deadline.IsZero() && !c.set.Before(c.deadline) {
			return n, err // not our bound: go-redis's deadline, or another error
		}
		// The bound passed. Since it was set, bytes may have come (it is
		// set once per round trip) or been written; and the kernel may
		// hold bytes this goroutine was too late to read.
		if time.Since(c.last) >= c.stall {
			if !heard(c.raw) {
				return 0, &c.err
			}
			c.last = time.Now() // the server spoke: read what it said
		}
		if err := c.arm(); err != nil {
			return 0, err
		}
	}
	return 0, &c.err
}
