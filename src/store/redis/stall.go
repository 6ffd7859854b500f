package redis

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
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
//
// A busy host can also keep a healthy Redis from running for a few hundred
// milliseconds (a Redis beside a loaded service, on a two-core test host,
// answered nothing for 290 ms while the service kept 1,024 calls in
// flight): its silence is then real, but says nothing of an outage. The
// bound stretches with how slow the server has been lately (pace): a
// server that was answering within milliseconds and stops is silent when
// Stall has passed; one that took 300 ms to answer a moment ago is given
// paceFactor times that.

// errStalled is wrapped by the error of a read that found the server
// silent (see stallConn); the round trip's breaker then opens at once
// (breakerHook).
var errStalled = errors.New("server silent")

// stallError is the error of a read that found the server silent. It is a
// timeout (net.Error), as a read deadline's: go-redis drops the connection.
type stallError struct{ d time.Duration }

func (e *stallError) Error() string {
	return fmt.Sprintf("%v: no byte for %v while replies are owed (REDIS_STALL_TIMEOUT)", errStalled, e.d)
}
func (e *stallError) Unwrap() error   { return errStalled }
func (e *stallError) Timeout() bool   { return true }
func (e *stallError) Temporary() bool { return true }

// paceFactor and paceMemory set how the bound of a silence stretches with
// the server's pace: paceFactor times the longest wait for a first answer
// seen in the last paceMemory, when that is longer than Config.Stall.
const (
	paceFactor = 4
	paceMemory = 2 * time.Second
)

// pace is how slow one server has been to answer lately, as this process
// saw it: the longest wait from a write to the first byte of its answer
// (this process's own lateness in reading included, which only stretches
// the bound) recorded in the last paceMemory. It is safe for concurrent
// use; its zero value has seen nothing.
type pace struct {
	slowest atomic.Int64 // nanoseconds
	at      atomic.Int64 // when slowest was recorded, Unix nanoseconds
}

// observe records a wait d for a first answer, ending at now.
func (p *pace) observe(d time.Duration, now time.Time) {
	if p == nil {
		return
	}
	n := now.UnixNano()
	// Loads first: every round trip observes, and a store to the shared
	// words on each would bounce their cache line between cores.
	if int64(d) > p.slowest.Load() || n-p.at.Load() > int64(paceMemory) {
		p.slowest.Store(int64(d))
		p.at.Store(n)
	}
}

// bound is how long a connection to the server may wait for it in
// silence at now: stall, or paceFactor times its recent slowest answer.
func (p *pace) bound(stall time.Duration, now time.Time) time.Duration {
	if p == nil || now.UnixNano()-p.at.Load() > int64(paceMemory) {
		return stall
	}
	return max(stall, paceFactor*time.Duration(p.slowest.Load()))
}

// maxPaces bounds the servers whose pace a backend keeps (a Cluster's
// nodes, addresses left by failovers included); a connection to one beyond
// it is bounded by Config.Stall alone.
const maxPaces = 1024

// paces are a backend's paces, by server address. It is safe for
// concurrent use; its zero value is empty.
type paces struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]*pace
}

// of returns the pace of the server at addr, or nil past maxPaces.
func (ps *paces) of(addr string) *pace {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p, ok := ps.m[addr]; ok {
		return p
	}
	if len(ps.m) >= maxPaces {
		return nil
	}
	if ps.m == nil {
		ps.m = map[string]*pace{}
	}
	p := &pace{}
	ps.m[addr] = p
	return p
}

// stallConn is the socket of a connection to Redis, beneath TLS and the
// reply guard. A read that waits in silence longer than its bound (stall,
// stretched by the server's pace) since the server was last written to or
// last heard from (a write returned, a read brought bytes), while the
// server owes replies, fails with a stallError, unless the kernel holds bytes of the server's (or its end of
// the stream) that this process has not read yet: then the server
// answered and the reader was late, and the read goes on. So only the
// server's silence fails a read, never this process's lateness.
//
// The bound is a read deadline set when go-redis sets its own (once per
// round trip), the earlier of the two, so a read that gets its bytes in
// time costs nothing more. go-redis uses a connection from one goroutine
// at a time; Close may come from another, and touches nothing here.
type stallConn struct {
	net.Conn
	raw   syscall.RawConn
	stall time.Duration
	pace  *pace // the server's; nil: stall alone
	// owes reports whether the server owes replies (replyGuard's count,
	// set once the connection is made; nil before, for the TLS
	// handshake, which does): a connection that owes nothing, a
	// subscriber's waiting for messages, may be silent for ever.
	owes func() bool
	// deadline is the read deadline go-redis asked for (zero: none), set
	// the one in force on the socket.
	deadline, set time.Time
	// last is when the server was last written to or heard from; wrote
	// is when it was last written to, while its answer has not begun.
	last, wrote time.Time
	err         stallError
}

// newStallConn bounds c's silences by stall and the server's pace p (which
// may be nil), raw being c's socket; c as it is when there is no bound or
// no socket to look into.
func newStallConn(c net.Conn, raw syscall.RawConn, stall time.Duration, p *pace) net.Conn {
	if stall <= 0 || raw == nil {
		return c
	}
	s := &stallConn{Conn: c, raw: raw, stall: stall, pace: p, last: time.Now(), err: stallError{stall}}
	// Bounded from the start: the TLS handshake reads before go-redis
	// sets any deadline.
	_ = s.arm()
	return s
}

func (c *stallConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.last = time.Now()
		c.wrote = c.last
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
	t := c.last.Add(c.pace.bound(c.stall, time.Now()))
	if !c.deadline.IsZero() && c.deadline.Before(t) {
		t = c.deadline
	}
	c.set = t
	return c.Conn.SetReadDeadline(t)
}

// maxLooks bounds the times one Read finds its bound passed and goes on,
// each after a wait of its own.
const maxLooks = 1000

func (c *stallConn) Read(p []byte) (int, error) {
	for range maxLooks {
		n, err := c.Conn.Read(p)
		if n > 0 {
			now := time.Now()
			if !c.wrote.IsZero() {
				c.pace.observe(now.Sub(c.wrote), now)
			}
			c.last, c.wrote = now, time.Time{}
			return n, err
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !c.deadline.IsZero() && !c.set.Before(c.deadline) {
			return n, err // not our bound: go-redis's deadline, or another error
		}
		// The bound passed. Since it was set, bytes may have come (it is
		// set once per round trip), the server's pace may have slowed,
		// and the kernel may hold bytes this goroutine was too late to
		// read.
		if now := time.Now(); now.Sub(c.last) >= c.pace.bound(c.stall, now) {
			if c.owes != nil && !c.owes() {
				// Nothing owed: go-redis's deadline alone.
				c.set = c.deadline
				if err := c.Conn.SetReadDeadline(c.deadline); err != nil {
					return 0, err
				}
				continue
			}
			if !heard(c.raw) {
				c.err.d = now.Sub(c.last).Truncate(time.Millisecond)
				return 0, &c.err
			}
			c.last = now // the server spoke: read what it said
		}
		if err := c.arm(); err != nil {
			return 0, err
		}
	}
	return 0, &c.err
}
