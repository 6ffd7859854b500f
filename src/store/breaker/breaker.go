// Package breaker is the circuit breaker that the shared stores (Redis,
// Memcached) keep per server: after a run of failures that mean the server
// is unreachable, requests for that server fail at once, without a round
// trip and without waiting for their deadline, until a background probe
// finds the server answering again.
//
// A failure is evidence that the server fails: a connection that cannot be
// made or breaks, an error reply about the server's own state, or an
// answer missing past the store's own timeout, timed from when the request
// was written to the socket. A request whose own deadline passes while it
// waits in this process, or for its answer, is not one: under load this
// process, not the server, may be what is late (issue 25). A server that
// has gone silent (the store saw no byte of it for a while although it
// owes answers, and checked that none waits unread) needs no run of
// failures to confirm it: Trip opens its breaker at once (issue 36).
//
// It knows the limiter's error contract (an open breaker's error wraps
// limiter.ErrUnavailable) and nothing of any store: what a failure is, how
// a server is named and how it is probed are the stores' business.
package breaker

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	cbackoff "github.com/cenkalti/backoff/v5"

	"github.com/ratelimitd/ratelimit/src/limiter"
)

// ErrOpen is wrapped, beside limiter.ErrUnavailable, by the error of a
// request refused by an open breaker. It is a limiter.Reason: a caller is
// told that the breaker is open, never which server it guards.
var ErrOpen error = limiter.ReasonBreakerOpen

// MaxServers bounds the breakers of a Group: one per server address seen
// (a Redis Cluster's masters, including addresses left behind by
// failovers and restarts; Memcached's servers, including those an SRV
// refresh dropped). Requests for a server beyond it go through without a
// breaker, as with the breaker turned off. Far above any real deployment,
// it only keeps a churn of addresses from growing the map without end.
const MaxServers = 1024

// Config tunes a Group. The zero value turns the breakers off.
type Config struct {
	// Failures is the number of consecutive failures of a server that open
	// its breaker (STORE_BREAKER_FAILURES; settings default 5). 0 or less
	// turns the breakers off: every request tries the server.
	Failures int
	// ProbeInterval is the longest wait between two probes of an open
	// breaker's server (STORE_BREAKER_PROBE_INTERVAL; default 500ms when
	// 0); they back off from FirstProbe (see Run). The breaker closes at
	// the first probe the server answers within the store's own timeout.
	ProbeInterval time.Duration
}

// DefaultProbeInterval is Config.ProbeInterval's default: once the probes
// have backed off, two a second per open server, so that a server back
// after a long outage takes requests again within about half a second, at
// a negligible cost to it.
const DefaultProbeInterval = 500 * time.Millisecond

// Group is the breakers of one store's servers, with their counters. It is
// safe for concurrent use. Make one with NewGroup; a nil *Group has no
// breakers (Server returns nil) and Run returns at once.
type Group struct {
	name     string
	failures int64
	interval time.Duration

	// servers is copied on write, so that the hot path looks a server up
	// without a lock; mu serialises the writers.
	servers atomic.Pointer[map[string]*Breaker]
	mu      sync.Mutex

	open              atomic.Int64
	trips, rejections atomic.Uint64
	closes            atomic.Uint64 // breakers Reset closed
	opened            chan struct{} // capacity 1: wakes Run
}

// NewGroup returns the breakers of a store whose errors start with name
// ("redis", "memcached"), or nil when cfg turns them off.
func NewGroup(name string, cfg Config) *Group {
	if cfg.Failures <= 0 {
		return nil
	}
	cfg.ProbeInterval = cmp.Or(max(cfg.ProbeInterval, 0), DefaultProbeInterval)
	g := &Group{
		name:     name,
		failures: int64(cfg.Failures),
		interval: cfg.ProbeInterval,
		opened:   make(chan struct{}, 1),
	}
	g.servers.Store(&map[string]*Breaker{})
	return g
}

// Server returns the breaker of the server called addr, making it on first
// use. It returns nil (a breaker that never opens) when g is nil or holds
// MaxServers breakers already.
func (g *Group) Server(addr string) *Breaker {
	if g == nil {
		return nil
	}
	if b, ok := (*g.servers.Load())[addr]; ok {
		return b
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.servers.Load()
	if b, ok := old[addr]; ok {
		return b
	}
	if len(old) >= MaxServers {
		return nil
	}
	b := &Breaker{g: g, addr: addr}
	b.err = fmt.Errorf("%s %s: %w: %w after %d failures in a row; probing at most %v apart",
		g.name, addr, limiter.ErrUnavailable, ErrOpen, g.failures, g.interval)
	b.silentErr = fmt.Errorf("%s %s: %w: %w: the server went silent; probing at most %v apart",
		g.name, addr, limiter.ErrUnavailable, ErrOpen, g.interval)
	m := make(map[string]*Breaker, len(old)+1)
	maps.Copy(m, old)
	m[addr] = b
	g.servers.Store(&m)
	return b
}

// Lookup returns the breaker of addr if it exists, or nil.
func (g *Group) Lookup(addr string) *Breaker {
	if g == nil {
		return nil
	}
	return (*g.servers.Load())[addr]
}

// OpenServers returns the breakers open now, for a probe to try.
func (g *Group) OpenServers() []*Breaker {
	if g == nil || g.open.Load() == 0 {
		return nil
	}
	var open []*Breaker
	for _, b := range *g.servers.Load() {
		if b.open.Load() {
			open = append(open, b)
		}
	}
	return open
}

// Stats are a Group's counters.
type Stats struct {
	// Open is the number of breakers open now.
	Open int64
	// Trips counts the times a breaker opened.
	Trips uint64
	// Rejections counts the requests refused at once by an open breaker.
	Rejections uint64
}

// Stats returns g's counters; zero for a nil Group.
func (g *Group) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return Stats{Open: g.open.Load(), Trips: g.trips.Load(), Rejections: g.rejections.Load()}
}

// ClosedSince reports whether a breaker of g closed (Reset) since the
// last call with seen, the caller's count of closings (zero at first),
// which it updates; false for a nil Group. A store that reports its health
// asks it: a breaker that closed may have made the store healthy. It costs
// a load of a word that changes only when a breaker closes, and of seen.
func (g *Group) ClosedSince(seen *atomic.Uint64) bool {
	if g == nil {
		return false
	}
	c := g.closes.Load()
	if c == seen.Load() {
		return false
	}
	seen.Store(c)
	return true
}

// AnyOpen reports whether a breaker of g is open.
func (g *Group) AnyOpen() bool { return g != nil && g.open.Load() > 0 }

// FirstProbe is how soon after a breaker opens its server is first probed
// (ProbeInterval when that is shorter). A server that missed its budget a
// few times in a row (a pause of the machine, a failover) is often back
// within milliseconds, and a breaker that waited a whole ProbeInterval
// would refuse every request for it meanwhile; one that stays down is
// probed at doubling intervals up to ProbeInterval (10, 20, 40 ... ms).
const FirstProbe = 10 * time.Millisecond

// Run probes, until ctx ends, while a breaker of g is open; probe closes
// the breakers of the servers that answer (Reset). Probes back off: the
// first comes FirstProbe after a breaker opened, and each round that
// leaves one open doubles the wait up to ProbeInterval. A breaker that
// opens again within ProbeInterval of the last close (a flapping server)
// goes on from the wait it had reached instead of starting over. Probes
// do not overlap, so a probe that waits for a frozen server delays the
// next one, but is answered as soon as the server thaws. The store that
// owns g runs it in a goroutine of its own.
func (g *Group) Run(ctx context.Context, probe func(context.Context)) {
	if g == nil {
		return
	}
	t := time.NewTimer(g.interval)
	t.Stop()
	defer t.Stop()
	waits := cbackoff.ExponentialBackOff{InitialInterval: min(FirstProbe, g.interval), Multiplier: 2, MaxInterval: g.interval}
	waits.Reset()
	var closedAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.opened:
		}
		if closedAt.IsZero() || time.Since(closedAt) >= g.interval {
			waits.Reset()
		}
		for g.open.Load() > 0 {
			t.Reset(waits.NextBackOff())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			probe(ctx)
		}
		closedAt = time.Now()
	}
}

// Breaker is the circuit breaker of one server. It is closed (requests go
// through) until Failures failures in a row open it; then Allow refuses
// every request until Reset, which the store's probe calls once the server
// answers. A success in between clears the run. It is safe for concurrent
// use; under concurrency "in a row" is approximate: a success that lands
// between two failures clears the run.
//
// A nil *Breaker is a breaker that never opens: every method is a no-op.
type Breaker struct {
	g    *Group
	addr string
	// Allow's errors, made once so that a refusal allocates nothing: err
	// after a run of failures, silentErr after Trip.
	err, silentErr error

	run    atomic.Int64 // consecutive failures
	open   atomic.Bool
	silent atomic.Bool // Trip opened it
}

// Addr returns the server's address as the store named it.
func (b *Breaker) Addr() string {
	if b == nil {
		return ""
	}
	return b.addr
}

// Allow returns nil when the breaker is closed, and otherwise an error
// wrapping limiter.ErrUnavailable and ErrOpen, counting the refusal.
func (b *Breaker) Allow() error {
	if b == nil || !b.open.Load() {
		return nil
	}
	b.g.rejections.Add(1)
	if b.silent.Load() {
		return b.silentErr
	}
	return b.err
}

// IsOpen reports whether the breaker is open.
func (b *Breaker) IsOpen() bool { return b != nil && b.open.Load() }

// Success records an answer from the server: the run of failures ends. It
// does not close an open breaker (only a probe does, so that one late
// answer to a request sent before the breaker opened does not let the
// traffic back on a server still failing).
func (b *Breaker) Success() {
	// Read first: every request calls this, and a store to a shared word
	// on each would bounce its cache line between cores (BenchmarkClosed
	// on 2 cores: 1 ns per request, 11 ns storing every time).
	if b != nil && b.run.Load() != 0 {
		b.run.Store(0)
	}
}

// Failure records a failure that means the server is unreachable (see the
// package doc: never a request's own deadline), and opens the breaker at
// the Failures-th in a row.
func (b *Breaker) Failure() {
	if b == nil {
		return
	}
	if b.run.Add(1) >= b.g.failures {
		b.trip()
	}
}

// Trip opens the breaker at once: the server went silent (see the package
// doc), which no run of failures needs to confirm. Only a probe closes it
// again, as after a run of failures.
func (b *Breaker) Trip() {
	if b == nil {
		return
	}
	b.silent.Store(true)
	b.trip()
}

// trip opens the breaker unless it is open, and wakes the probe.
func (b *Breaker) trip() {
	if !b.open.CompareAndSwap(false, true) {
		return
	}
	b.g.open.Add(1)
	b.g.trips.Add(1)
	select {
	case b.g.opened <- struct{}{}:
	default:
	}
}

// Reset closes the breaker: the server answered a probe.
func (b *Breaker) Reset() {
	if b == nil {
		return
	}
	b.run.Store(0)
	b.silent.Store(false)
	if b.open.CompareAndSwap(true, false) {
		b.g.open.Add(-1)
		b.g.closes.Add(1)
	}
}
