package server

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// capWarnEvery spaces out the warnings of a listener at its cap or
// refusing a peer over its share, so that a client hammering a full
// listener cannot flood the log.
const capWarnEvery = time.Minute

// limitListener is a net.Listener with at most cap connections open at
// once, and at most perPeer of them from one client address.
//
// It accepts a connection, then gives it a slot: one from an address that
// holds its share already is closed at once (counted, and warned at most
// once per capWarnEvery). At the cap, a listener that may evict closes the
// open connection that has waited longest with no request under way (see
// limitConn.idleSince), if for at least minIdle, and gives its slot to the
// new one: a client that holds connections without finishing its requests
// cannot keep a prober out. Otherwise, or when every connection is busy,
// it waits for a slot to free, holding the connection unanswered, while
// further clients complete the TCP handshake in the kernel's accept queue
// (the listen backlog) and wait there; once that queue is full the kernel
// drops their connection attempts. At the cap it logs a warning, at most
// once per capWarnEvery.
type limitListener struct {
	net.Listener
	capacity int
	// perPeer bounds the connections of one client address (an IPv6
	// client's /64); 0 means none. Unix sockets have no address.
	perPeer int
	// overShare counts the connections closed for their peer's share.
	overShare *stats.Counter
	// evicted counts the connections closed at the cap for a new one; nil
	// when the listener waits instead.
	evicted *stats.Counter
	// minIdle is how long a connection must have been idle to be closed
	// for a new one.
	minIdle  time.Duration
	done     chan struct{} // closed by Close
	once     sync.Once
	name     string // the setting that sets the cap, for the warnings
	log      *slog.Logger
	lastCap  atomic.Int64 // UnixNano of the last warning at the cap
	lastPeer atomic.Int64 // and of a peer over its share

	// freed wakes an Accept waiting at the cap when a slot frees.
	freed chan struct{}
	// mu guards the fields below.
	mu    sync.Mutex
	open  int
	peers map[netip.Addr]int
	// conns are the open connections, kept when the listener may evict.
	conns map[*limitConn]struct{}
}

// limits are what newLimitListener caps.
type limits struct {
	capacity, perPeer int
	// setting names the cap, for the warnings.
	setting string
	// overShare counts the connections refused for their peer's share.
	overShare *stats.Counter
	// evicted, when not nil, lets the listener close at its cap the
	// connection idle longest for a new one, and counts them; minIdle is
	// how long it must have been idle.
	evicted *stats.Counter
	minIdle time.Duration
}

func newLimitListener(l net.Listener, lim limits, log *slog.Logger) *limitListener {
	ll := &limitListener{
		Listener:  l,
		capacity:  lim.capacity,
		perPeer:   lim.perPeer,
		overShare: lim.overShare,
		evicted:   lim.evicted,
		minIdle:   lim.minIdle,
		done:      make(chan struct{}),
		freed:     make(chan struct{}, 1),
		peers:     map[netip.Addr]int{},
		name:      lim.setting,
		log:       log,
	}
	if ll.evicted != nil {
		ll.conns = map[*limitConn]struct{}{}
	}
	return ll
}

// Accept returns the next connection that gets a slot.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc, err := l.admit(c)
		if err != nil {
			return nil, err
		}
		if lc != nil {
			return lc, nil
		}
	}
}

// admit gives c a slot, waiting for one at the cap. It returns nil when c
// was refused (and closed) for its peer's share, and an error when the
// listener closed meanwhile.
func (l *limitListener) admit(c net.Conn) (*limitConn, error) {
	peer := peerKey(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.perPeer > 0 && peer.IsValid() && l.peers[peer] >= l.perPeer {
			c.Close()
			l.overShare.Inc()
			warnEvery(&l.lastPeer, func() {
				l.log.Warn("a client address holds its share of a listener's connections; its new connections are closed at once",
					"addr", l.Addr().String(), "peer", peer.String(), "share", l.perPeer, "setting", "MAX_CONNECTIONS_PER_PEER_PERCENT")
			})
			return nil, nil
		}
		if l.open < l.capacity {
			break
		}
		if v := l.victim(); v != nil {
			l.mu.Unlock()
			v.Close()
			l.evicted.Inc()
			l.mu.Lock()
			continue
		}
		warnEvery(&l.lastCap, func() {
			l.log.Warn("listener at its connection cap; new connections wait until one closes",
				"addr", l.Addr().String(), "setting", l.name, "cap", l.capacity)
		})
		l.mu.Unlock()
		select {
		case <-l.freed:
		case <-l.evictPoll():
			// A busy connection may have become idle.
		case <-l.done:
			c.Close()
			l.mu.Lock()
			return nil, net.ErrClosed
		}
		l.mu.Lock()
	}
	l.open++
	if peer.IsValid() {
		l.peers[peer]++
	}
	lc := &limitConn{Conn: c, l: l, peer: peer}
	lc.idleSince.Store(time.Now().UnixNano())
	if l.conns != nil {
		l.conns[lc] = struct{}{}
	}
	return lc, nil
}

// evictPoll is how often a listener that may evict, waiting at its cap
// with every connection busy, looks again for one gone idle.
const evictPoll = 100 * time.Millisecond

// evictPoll returns a channel that fires after evictPoll when the
// listener may evict, and nil (never) otherwise.
func (l *limitListener) evictPoll() <-chan time.Time {
	if l.conns == nil {
		return nil
	}
	return time.After(evictPoll)
}

// victim returns the open connection idle longest, or nil when the
// listener may not evict or no connection has been idle minIdle. l.mu is
// held.
func (l *limitListener) victim() *limitConn {
	var v *limitConn
	var since int64
	for c := range l.conns {
		if t := c.idleSince.Load(); t != 0 && (v == nil || t < since) {
			v, since = c, t
		}
	}
	if v == nil || time.Since(time.Unix(0, since)) < l.minIdle {
		return nil
	}
	return v
}

// release gives back the slot of c, a connection from peer.
func (l *limitListener) release(c *limitConn, peer netip.Addr) {
	l.mu.Lock()
	l.open--
	delete(l.conns, c)
	if peer.IsValid() {
		if l.peers[peer]--; l.peers[peer] <= 0 {
			delete(l.peers, peer)
		}
	}
	l.mu.Unlock()
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// warnEvery runs warn unless it ran less than capWarnEvery ago by last.
func warnEvery(last *atomic.Int64, warn func()) {
	now := time.Now().UnixNano()
	prev := last.Load()
	if now-prev < int64(capWarnEvery) || !last.CompareAndSwap(prev, now) {
		return
	}
	warn()
}

// peerKey is what a client's share is counted by: its IP address, or for
// IPv6 its /64, which one host usually holds whole; invalid for an address
// without an IP (a unix socket).
func peerKey(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// Close closes the listener and releases a waiting Accept.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	l    *limitListener
	peer netip.Addr
	once sync.Once
	// idleSince is the UnixNano since which the connection has had no
	// request under way (accepted, between requests, or its request still
	// arriving), or 0 while one is (see trackRequests): at the cap, the
	// connection idle longest is the one closed for a new one. A gRPC
	// connection is idle since its client last sent a whole message (see
	// watchedConn.used), never 0: its calls are answered within their
	// budget, and its long-lived streams are not use.
	idleSince atomic.Int64
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c, c.peer) })
	return err
}

// limitConnOf returns the limitConn beneath c (behind TLS and sniffing),
// or nil.
func limitConnOf(c net.Conn) *limitConn {
	for range 4 {
		switch cc := c.(type) {
		case *limitConn:
			return cc
		case interface{ NetConn() net.Conn }:
			c = cc.NetConn()
		default:
			return nil
		}
	}
	return nil
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

// peerShare is the connections one client address may hold of a listener
// capped at capacity: percent of it (MAX_CONNECTIONS_PER_PEER_PERCENT), at
// least one; 0 (no bound of its own) at 100 %.
func peerShare(capacity, percent int) int {
	if percent >= 100 {
		return 0
	}
	return max(1, capacity*percent/100)
}
