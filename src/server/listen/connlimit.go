package listen

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
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

// Listener is a net.Listener with at most Capacity connections open at
// once, and at most its share of them (PerPeerPercent) from one client
// address.
//
// It accepts a connection, then gives it a slot: one from an address that
// holds its share already is closed at once (counted, and warned at most
// once per capWarnEvery). At the cap, a listener that may evict closes the
// open connection that has waited longest with no request under way (see
// limitConn.idleSince), if for at least MinIdle, and gives its slot to the
// new one: a client that holds connections without finishing its requests
// cannot keep a prober out. Otherwise, or when every connection is busy,
// it waits for a slot to free, holding the connection unanswered, while
// further clients complete the TCP handshake in the kernel's accept queue
// (the listen backlog) and wait there; once that queue is full the kernel
// drops their connection attempts. At the cap it logs a warning, at most
// once per capWarnEvery.
type Listener struct {
	net.Listener
	// Limits are the listener's; set them before the first Accept.
	Limits
	// perPeer bounds the connections of one client address (an IPv6
	// client's /64); 0 means none. Unix sockets have no address.
	perPeer  int
	done     chan struct{} // closed by Close
	once     sync.Once
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

// Limits are what a Listener caps.
type Limits struct {
	Capacity int
	// PerPeerPercent, 1 to 100, is the share of Capacity one client
	// address may hold (MAX_CONNECTIONS_PER_PEER_PERCENT; see peerShare).
	PerPeerPercent int
	// Setting names the cap, for the warnings.
	Setting string
	// OverShare counts the connections refused for their peer's share.
	OverShare *stats.Counter
	// Evicted, when not nil, lets the listener close at its cap the
	// connection idle longest for a new one, and counts them; MinIdle is
	// how long it must have been idle.
	Evicted *stats.Counter
	MinIdle time.Duration
}

// Limit returns l capped by lim, warning through log.
func Limit(l net.Listener, lim Limits, log *slog.Logger) *Listener {
	ll := &Listener{
		Listener: l,
		Limits:   lim,
		perPeer:  peerShare(lim.Capacity, lim.PerPeerPercent),
		done:     make(chan struct{}),
		freed:    make(chan struct{}, 1),
		peers:    map[netip.Addr]int{},
		log:      log,
	}
	if ll.Evicted != nil {
		ll.conns = map[*limitConn]struct{}{}
	}
	return ll
}

// Open is the connections holding a slot now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Accept returns the next connection that gets a slot.
func (l *Listener) Accept() (net.Conn, error) {
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
func (l *Listener) admit(c net.Conn) (*limitConn, error) {
	peer := peerKey(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.perPeer > 0 && peer.IsValid() && l.peers[peer] >= l.perPeer {
			c.Close()
			l.OverShare.Inc()
			warnEvery(&l.lastPeer, func() {
				l.log.Warn("a client address holds its share of a listener's connections; its new connections are closed at once",
					"addr", l.Addr().String(), "peer", peer.String(), "share", l.perPeer, "setting", "MAX_CONNECTIONS_PER_PEER_PERCENT")
			})
			return nil, nil
		}
		if l.open < l.Capacity {
			break
		}
		if v := l.victim(); v != nil {
			l.mu.Unlock()
			v.Close()
			l.Evicted.Inc()
			l.mu.Lock()
			continue
		}
		warnEvery(&l.lastCap, func() {
			l.log.Warn("listener at its connection cap; new connections wait until one closes",
				"addr", l.Addr().String(), "setting", l.Setting, "cap", l.Capacity)
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
func (l *Listener) evictPoll() <-chan time.Time {
	if l.conns == nil {
		return nil
	}
	return time.After(evictPoll)
}

// victim returns the open connection idle longest, or nil when the
// listener may not evict or no connection has been idle MinIdle. l.mu is
// held.
func (l *Listener) victim() *limitConn {
	var v *limitConn
	var since int64
	for c := range l.conns {
		if t := c.idleSince.Load(); t != 0 && (v == nil || t < since) {
			v, since = c, t
		}
	}
	if v == nil || time.Since(time.Unix(0, since)) < l.MinIdle {
		return nil
	}
	return v
}

// release gives back the slot of c, a connection from peer.
func (l *Listener) release(c *limitConn, peer netip.Addr) {
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
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	l    *Listener
	peer netip.Addr
	once sync.Once
	// idleSince is the UnixNano since which the connection has had no
	// request under way (accepted, between requests, or its request still
	// arriving), or 0 while one is (see TrackRequests): at the cap, the
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

func (c *limitConn) CloseWrite() error { return closeWrite(c.Conn) }

// closeWrite passes CloseWrite through to TCP connections, which net/http
// uses to deliver an error answer (such as 431) before closing.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
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

// Caps are the listeners' connection caps.
type Caps struct {
	GRPC          int // GRPC_MAX_CONNECTIONS
	HTTP          int // HTTP_MAX_CONNECTIONS, for each HTTP listener
	HTTPListeners int // PORT, DEBUG_PORT and, with USE_PROMETHEUS, PROMETHEUS_ADDR
}

func (c Caps) total() uint64 { return uint64(c.GRPC) + uint64(c.HTTP)*uint64(c.HTTPListeners) }

// Fit lowers the caps, in proportion, so that all listeners together stay
// below nofile (the process's RLIMIT_NOFILE) minus the reserve; each keeps
// at least one connection. nofile 0 means unknown or unlimited: the caps are
// kept. It reports whether it lowered them.
func (c Caps) Fit(nofile uint64) (Caps, bool) {
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
	c.GRPC = max(1, int(uint64(c.GRPC)*budget/sum))
	c.HTTP = max(1, int(uint64(c.HTTP)*budget/sum))
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

// connKey is the context key of a request's *limitConn.
type connKey struct{}

// withLimitConn is http.Server.ConnContext: it keeps the connection's
// limitConn for TrackRequests.
func withLimitConn(ctx context.Context, c net.Conn) context.Context {
	if lc := limitConnOf(c); lc != nil {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// idleBetweenRequests is http.Server.ConnState: a keep-alive connection
// waiting for its next request is idle from then on.
func idleBetweenRequests(c net.Conn, st http.ConnState) {
	if st == http.StateIdle {
		if lc := limitConnOf(c); lc != nil {
			lc.idleSince.Store(time.Now().UnixNano())
		}
	}
}

// TrackRequests has srv, serving a Listener, mark a connection busy
// while a request is under way, so that the listener, at its cap, never
// closes it for a new one: from the end of the request's headers, or of
// its body when it has one, until its answer is written. A connection
// whose request line, headers or body are still arriving stays idle: a
// client that sends them slowly holds no slot a prober needs (issue 24,
// case 5). It sets srv's ConnContext and ConnState, and returns srv.
func TrackRequests(srv *http.Server) *http.Server {
	next := srv.Handler
	srv.ConnContext, srv.ConnState = withLimitConn, idleBetweenRequests
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(connKey{}).(*limitConn)
		if lc == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.Body == nil || r.Body == http.NoBody {
			lc.idleSince.Store(0)
		} else {
			r.Body = &busyAtEOF{ReadCloser: r.Body, c: lc}
		}
		// Idle again once the answer is written and the connection
		// waits for its next request (idleBetweenRequests), or closed.
		next.ServeHTTP(w, r)
	})
	return srv
}

// busyAtEOF marks its connection busy once the body has arrived whole.
type busyAtEOF struct {
	io.ReadCloser
	c *limitConn
}

func (b *busyAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.c.idleSince.Store(0)
	}
	return n, err
}
