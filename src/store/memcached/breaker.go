package memcached

import (
	"context"
	"slices"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// The circuit breakers (Config.Breaker) are per server, found as the
// client finds an item's server: by the key's hash over the server list.
// Every round trip's outcome is known where it ends (gotAnswer, fail), so
// no failure is counted for a round trip never started (a request past
// its deadline, a full connection pool).

// breakerFor returns the breaker of the server that holds key (an item key,
// see itemKey), or nil when the breakers are off or there is no server.
func (s *Store) breakerFor(key string) *breaker.Breaker {
	if s.breakers == nil {
		return nil
	}
	a, err := s.client.AddrOf(key)
	if err != nil {
		return nil
	}
	return s.breakers.Server(a)
}

// admit fails with the error of the first open breaker among the servers
// of b's ops, before any op is applied: a batch is applied whole or fails
// (an AllOrNothing batch must record nothing).
func (s *Store) admit(b *limiter.Batch) error {
	if !s.breakers.AnyOpen() {
		return nil
	}
	for i := range b.Ops {
		key := b.Ops[i].Key
		if b.Ops[i].Group != 0 {
			// A list's ops go to its item (see units).
			if shared, _, ok := limiter.SplitListKey(key, b.Ops[i].Algorithm); ok {
				key = shared
			}
		}
		if err := s.breakerFor(itemKey(key)).Allow(); err != nil {
			return err
		}
	}
	return nil
}

// probeBreakers is the breakers' probe (breaker.Group.Run): it pings each
// server whose breaker is open, on each of its connections, and closes the
// breakers of those that answer within Timeout. A server no longer in the
// list (an SRV refresh dropped it) gets no traffic: its breaker is closed.
func (s *Store) probeBreakers(ctx context.Context) {
	addrs := s.client.Addrs()
	for _, b := range s.breakers.OpenServers() {
		if !slices.Contains(addrs, b.Addr()) || s.pingServer(ctx, b.Addr()) == nil {
			b.Reset()
		}
	}
	s.breakerClosed()
}

// pingServer asks one server for its version, bounded by Timeout.
func (s *Store) pingServer(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	return s.client.PingAddr(ctx, addr)
}

// Breakers returns the counters of the servers' circuit breakers
// (ratelimit.memcache.breaker_open, breaker_trips, breaker_open_rejections).
func (s *Store) Breakers() breaker.Stats { return s.breakers.Stats() }
