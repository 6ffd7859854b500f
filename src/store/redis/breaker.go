package redis

import (
	"context"
	"errors"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// The circuit breakers (Config.Breaker) sit where a Redis server is known:
// go-redis sends a backend's pipeline through the pipeline hooks of the
// client of each server it reaches, the client itself for SINGLE and
// SENTINEL, and for CLUSTER the client of each master the slots of the
// commands route to. A hook there (breakerHook) sees every round trip to
// one server and its outcome, and can refuse one without sending it. Do
// checks the same breakers before a request is queued (admit), so that a
// request for an open server costs no queueing and no round trip; the
// hook refuses only the requests queued before the breaker opened.

// breakerHook is the go-redis hook of one server's breaker. Single
// commands (the probes' PING and INFO) pass: only pipelines, which carry
// every op, are refused.
type breakerHook struct{ b *breaker.Breaker }

func (breakerHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (breakerHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (h breakerHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if err := h.b.Allow(); err != nil {
			// Nothing is sent. go-redis's cluster client keeps this
			// error as the commands' own and does not retry them.
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		// go-redis's cluster client sends a node's commands again, up to
		// MaxRedirects times, when it could not get a connection to the
		// node; they then carry the first attempt's error. One request
		// is one failure, however many attempts it took.
		retry := len(cmds) > 0 && cmds[0].Err() != nil
		// The round trip is this server's, from the write to the read of
		// its replies, bounded by the store's own timeout (REDIS_TIMEOUT):
		// a failure here is the server's. How long its requests waited in
		// this process's queue before is not (see breaker).
		err := next(ctx, cmds)
		switch {
		case !roundTripFailed(err, cmds):
			h.b.Success()
		case errors.Is(err, errStalled):
			// The server owes replies and went silent (stallConn):
			// no run of failures is needed to know it fails.
			h.b.Trip()
		case !retry:
			h.b.Failure()
		}
		return err
	}
}

// roundTripFailed reports whether a pipeline's outcome means its server
// could not serve: the pipeline failed as a whole (go-redis may leave its
// commands without an error of their own), or a command failed in a way
// cmdError calls unavailable. Error replies about the data (isDataError),
// a write refused for lack of memory (isOOM), NOSCRIPT (answered by EVAL
// next) and cluster redirections are answers.
func roundTripFailed(err error, cmds []goredis.Cmder) bool {
	if err == nil {
		return false
	}
	own := false
	for _, c := range cmds {
		e := c.Err()
		if e == nil {
			continue
		}
		own = true
		if serverCannotServe(e) {
			return true
		}
	}
	return !own
}

// serverCannotServe reports whether a command's error means that its server
// cannot serve (see cmdError), rather than an answer about the command.
func serverCannotServe(err error) bool {
	switch {
	case errors.Is(err, goredis.Nil), isDataError(err), isOOM(err):
		return false
	case goredis.HasErrorPrefix(err, "NOSCRIPT"), goredis.HasErrorPrefix(err, "MOVED"),
		goredis.HasErrorPrefix(err, "ASK"), goredis.HasErrorPrefix(err, "TRYAGAIN"):
		return false
	}
	return true
}

// addBreaker puts the breaker of the server addr on client c.
func (be *backend) addBreaker(c interface{ AddHook(goredis.Hook) }, addr string) *breaker.Breaker {
	b := be.breakers.Server(addr)
	if b != nil {
		c.AddHook(breakerHook{b})
	}
	return b
}

// admit checks, before r is queued, the breakers of the servers r's ops go
// to, and fails at once with the first open one's error.
func (be *backend) admit(ctx context.Context, r *request, b *limiter.Batch) error {
	if be.breakers == nil {
		return nil
	}
	c, ok := be.client.(*goredis.ClusterClient)
	if !ok {
		return be.server.Allow()
	}
	for _, i := range r.idx {
		// The slot's master as go-redis will route the command: from
		// its cached cluster state, which it reloads by itself.
		n, err := c.MasterForKey(ctx, b.Ops[i].Key)
		if err != nil {
			// No cluster state yet (every node unreachable so far):
			// sending will tell.
			return nil
		}
		if err := be.breakers.Lookup(n.Options().Addr).Allow(); err != nil {
			return err
		}
	}
	return nil
}

// probeBreakers is the breakers' probe (breaker.Group.Run): it pings the
// servers whose breaker is open and closes the breakers of those that
// answer. Each ping is bounded by the backend's timeout (REDIS_TIMEOUT), the
// bound of every round trip: a server that answers within it serves; a
// frozen server's ping is answered as soon as it thaws.
func (s *Store) probeBreakers(ctx context.Context, be *backend) {
	defer recovered(nil)
	defer be.breakerClosed()
	ctx, cancel := context.WithTimeout(ctx, be.timeout)
	defer cancel()
	c, ok := be.client.(*goredis.ClusterClient)
	if !ok {
		if be.client.Ping(ctx).Err() == nil {
			be.server.Reset()
			be.markUp()
		}
		return
	}
	var (
		mu      sync.Mutex
		masters = map[string]bool{}
	)
	// ForEachMaster reloads the cluster state first, so that a failover
	// shows here.
	_ = c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
		addr := n.Options().Addr
		mu.Lock()
		masters[addr] = true
		mu.Unlock()
		b := be.breakers.Lookup(addr)
		if !b.IsOpen() {
			return nil
		}
		if err := n.Ping(ctx).Err(); err != nil {
			return err
		}
		b.Reset()
		return nil
	})
	if len(masters) == 0 {
		return // no cluster state: try again next time
	}
	// A server that is no master any more (a failover promoted a replica,
	// a node was replaced) gets no traffic: its breaker guards nothing, and
	// must not keep health down for ever.
	for _, b := range be.breakers.OpenServers() {
		if !masters[b.Addr()] {
			b.Reset()
		}
	}
}

// Breakers returns the counters of the circuit breakers of both Redis
// (ratelimit.redis.breaker_open, breaker_trips, breaker_open_rejections).
func (s *Store) Breakers() breaker.Stats {
	var st breaker.Stats
	for _, be := range s.backends() {
		b := be.breakers.Stats()
		st.Open += b.Open
		st.Trips += b.Trips
		st.Rejections += b.Rejections
	}
	return st
}

// breakerClosed calls Config.Answered when a breaker of be closed since it
// was last called for one, once Redis has answered: with
// HealthCheckActiveConnection Healthy counts open breakers, and the first
// answer (markUp) may have come while one was open. The probe that closed
// it tells once its round is over, and a round trip answered after it
// (markUp) at the latest, before its requests are answered.
func (be *backend) breakerClosed() {
	if be.breakers.ClosedSince(&be.toldCloses) && be.onAnswered != nil && be.hasAnswered() {
		be.onAnswered()
	}
}
