package redis

import "sync/atomic"

// ConnStats counts the connections to one Redis (the main one or the
// per-second one), as the anchor's pool reports them in
// ratelimit.redis_pool.cx_total, cx_local_close and cx_active.
type ConnStats struct {
	// Opened counts the connections made (after TLS and the handshake
	// with go-redis's HELLO hidden); Closed those this side closed,
	// whatever the reason (pool turnover, an error, Close).
	Opened, Closed uint64
}

// Active is the connections open now.
func (c ConnStats) Active() int64 { return int64(c.Opened - c.Closed) }

// connCounts is what the dialer and the connections count into.
type connCounts struct {
	opened, closed atomic.Uint64
}

// Conns returns the connection counts of the main Redis, or with
// perSecond those of the per-second Redis (zero when there is none).
func (s *Store) Conns(perSecond bool) ConnStats {
	be := s.main
	if perSecond {
		be = s.perSecond
	}
	if be == nil {
		return ConnStats{}
	}
	// Closed first: a connection closed between the two loads is then
	// counted as still open, never as closed before it opened.
	closed := be.conns.closed.Load()
	return ConnStats{Opened: be.conns.opened.Load(), Closed: closed}
}
