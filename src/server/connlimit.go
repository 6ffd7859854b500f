package server

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// capWarnEvery spaces out the warnings of a listener at its cap, so that a
// client hammering a full listener cannot flood the log.
const capWarnEvery = time.Minute

// limitListener is a net.Listener with at most cap connections open at
// once. At the cap Accept waits until one closes: further clients complete
// the TCP handshake in the kernel's accept queue (the listen backlog) and
// wait there, unanswered, for a free slot; once that queue is full the
// kernel drops their connection attempts. The listener logs a warning when
// it reaches its cap, at most once per capWarnEvery.
type limitListener struct {
	net.Listener
	sem     chan struct{} // one token per open connection
	done    chan struct{} // closed by Close
	once    sync.Once
	name    string // the setting that sets the cap, for the warning
	log     *slog.Logger
	lastCap atomic.Int64 // UnixNano of the last warning
}

func newLimitListener(l net.Listener, capacity int, name string, log *slog.Logger) *limitListener {
	return &limitListener{
		Listener: l,
		sem:      make(chan struct{}, capacity),
		done:     make(chan struct{}),
		name:     name,
		log:      log,
	}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.warnAtCap()
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) warnAtCap() {
	now := time.Now().UnixNano()
	last := l.lastCap.Load()
	if now-last < int64(capWarnEvery) || !l.lastCap.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("listener at its connection cap; new connections wait until one closes",
		"addr", l.Addr().String(), "setting", l.name, "cap", cap(l.sem))
}

// Close closes the listener and releases a waiting Accept.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite passes through to TCP connections, which net/http uses to
// deliver an error answer (such as 431) before closing.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// The open-file reserve: file descriptors kept out of the listeners' caps
// for the store's connections, the rules files and the watcher, and the
// process's own. fdReserveMin covers a small limit; with a large one a
// quarter stays free.
const (
	fdReserveMin     = 256
	fdReserveDivisor = 4
)

// connCaps are the listeners' connection caps.
type connCaps struct {
	grpc          int // GRPC_MAX_CONNECTIONS
	http          int // HTTP_MAX_CONNECTIONS, for each HTTP listener
	httpListeners int // PORT, DEBUG_PORT and, with USE_PROMETHEUS, PROMETHEUS_ADDR
}

func (c connCaps) total() uint64 { return uint64(c.grpc) + uint64(c.http)*uint64(c.httpListeners) }

// fit lowers the caps, in proportion, so that all listeners together stay
// below nofile (the process's RLIMIT_NOFILE) minus the reserve; each keeps
// at least one connection. nofile 0 means unknown or unlimited: the caps are
// kept. It reports whether it lowered them.
func (c connCaps) fit(nofile uint64) (connCaps, bool) {
	if nofile == 0 {
		return c, false
	}
	reserve := max(fdReserveMin, nofile/fdReserveDivisor)
	var budget uint64
	if nofile > reserve {
		budget = nofile - reserve
	}
	sum := c.total()
	if sum <= budget {
		return c, false
	}
	c.grpc = max(1, int(uint64(c.grpc)*budget/sum))
	c.http = max(1, int(uint64(c.http)*budget/sum))
	return c, true
}
