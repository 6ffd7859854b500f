// Package storetest is the behavioural suite that every limiter.Store passes
// (Run, RunLists). The suite holds each store to the limiter's pure
// functions, so the memory store and the Redis and Memcached scripts cannot
// drift apart. The real servers it runs against are started by
// harness/. It knows nothing of any store's internals.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// Clock says where a store takes the time of an op from.
type Clock uint8

const (
	// BatchClock stores apply ops at Batch.Now (the memory store; Redis
	// for fixed windows, whose window is in the key). The suite injects
	// time: it moves Batch.Now instead of waiting and checks every value
	// exactly.
	BatchClock Clock = iota
	// ServerClock stores read their own clock and ignore Batch.Now (Redis
	// TIME for the other algorithms). The suite uses real time: cases that
	// need time to pass use one-second windows and wait for real (a few
	// seconds in all), the others use day-long windows so that the time the
	// test takes changes nothing, and ResetAfter is compared within
	// Options.Tolerance. Cases that need exact instants (the semantics and
	// property cases) run only under BatchClock.
	ServerClock
)

// Options describe the store under test.
type Options struct {
	// Algorithms lists the algorithms the store runs; nil means all of
	// rules.Algorithms.
	Algorithms []rules.Algorithm
	// Clock says which clock the store uses for an algorithm; nil means
	// BatchClock for every algorithm.
	Clock func(rules.Algorithm) Clock
	// Tolerance is the slack on ResetAfter under ServerClock; default 1 s.
	Tolerance time.Duration
	// GroupsOneByOne says that the store applies the ops of a group
	// (limiter.Op.Group) one by one rather than in one atomic step
	// (a Redis proxy): the suite then checks that a group never
	// over-admits and that AllOrNothing leaves nothing of a refused one,
	// not that concurrent admission is exact.
	GroupsOneByOne bool
}

func (o *Options) algorithms() []rules.Algorithm {
	if o.Algorithms == nil {
		return rules.Algorithms
	}
	return o.Algorithms
}

func (o *Options) clock(a rules.Algorithm) Clock {
	if o.Clock == nil {
		return BatchClock
	}
	return o.Clock(a)
}

// base is the injected time a case starts at: midnight UTC, the start of a
// second, a minute, an hour and a day.
var base = time.Unix(1_699_920_000, 0)

// Run runs the suite against the stores newStore makes. It asks for one
// store per case, from parallel subtests (one per algorithm), so newStore
// must be safe for concurrent use. Every case uses keys of its own (a
// random domain), so stores that share a server across cases need no
// flushing.
func Run(t *testing.T, newStore func(t *testing.T) limiter.Store, opts Options) {
	t.Helper()
	if opts.Tolerance == 0 {
		opts.Tolerance = time.Second
	}
	for _, a := range opts.algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			for _, sc := range append(scenarios(a), refundScenarios(a)...) {
				t.Run(sc.name, func(t *testing.T) {
					clock := opts.clock(a)
					if sc.batchOnly && clock == ServerClock {
						t.Log("needs exact instants: runs only where the store honours Batch.Now")
						return
					}
					h := newHarness(t, newStore(t), clock, opts.Tolerance)
					h.run(sc, a)
				})
			}
			t.Run("exact_under_concurrency", func(t *testing.T) {
				testConcurrency(t, newStore(t), a, opts.clock(a), 32, 400, 100)
			})
			if opts.clock(a) == BatchClock {
				t.Run("matches_pure_function", func(t *testing.T) {
					testProperty(t, newStore(t), a)
				})
			}
			t.Run("refunds_in_one_batch", func(t *testing.T) {
				testRefundBatch(t, newStore(t), a, opts.clock(a))
			})
			testRefundConcurrency(t, newStore, a, opts.clock(a))
		})
	}
	algs := opts.algorithms()
	if slices.Contains(algs, rules.FixedWindow) {
		t.Run("fixed_window/exact_under_heavy_concurrency", func(t *testing.T) {
			testConcurrency(t, newStore(t), rules.FixedWindow, opts.clock(rules.FixedWindow), 32, 1000, 100)
		})
	}
	t.Run("all_or_nothing", func(t *testing.T) {
		testAllOrNothing(t, newStore, &opts)
	})
	t.Run("lists", func(t *testing.T) {
		testLists(t, newStore, &opts)
	})
	t.Run("shadow_lists", func(t *testing.T) {
		testShadowLists(t, newStore, &opts)
	})
	t.Run("refund_lists", func(t *testing.T) {
		testRefundLists(t, newStore, &opts)
	})
	t.Run("canceled_context", func(t *testing.T) {
		testCanceled(t, newStore(t))
	})
}

// RunLists runs the suite's cases of descriptors with several limits
// (rules.Limit.Limits), shadow limits and refunds among them, alone: for deployments
// whose scripts are those of a store that Run covers (a Redis behind
// Sentinel), where the whole suite would add little but time.
func RunLists(t *testing.T, newStore func(t *testing.T) limiter.Store, opts Options) {
	t.Helper()
	t.Run("lists", func(t *testing.T) {
		testLists(t, newStore, &opts)
	})
	t.Run("shadow_lists", func(t *testing.T) {
		testShadowLists(t, newStore, &opts)
	})
	t.Run("refund_lists", func(t *testing.T) {
		testRefundLists(t, newStore, &opts)
	})
}

// scenario is a sequence of single-op batches on one algorithm, each with
// its exact expected result under BatchClock.
type scenario struct {
	name string
	// limit is the rule; under ServerClock its unit becomes a day unless
	// realTime is set.
	limit rules.Limit
	steps []step
	// batchOnly marks scenarios that need exact instants.
	batchOnly bool
	// realTime marks scenarios whose steps wait under ServerClock; they
	// use one-second windows and decisions that waiting cannot change.
	realTime bool
}

type step struct {
	at    time.Duration // since the case's start
	entry string        // descriptor value; "" means "a"
	hits  uint64
	// refund gives the hits back (limiter.Op.Refund).
	refund bool
	want   limiter.Result
}

func ok(before, after, remaining uint64, reset time.Duration) limiter.Result {
	return limiter.Result{Before: before, After: after, Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func over(before, after, remaining uint64, reset time.Duration) limiter.Result {
	return limiter.Result{Before: before, After: after, Remaining: remaining, ResetAfter: reset}
}

// scenarios returns algorithm a's cases. The steps start at base + 10 s
// unless a says otherwise, so fixed windows reset 50 s later.
func scenarios(a rules.Algorithm) []scenario {
	const s = time.Second
	f := figures{a}
	perMinute, perSecond := f.perMinute, f.perSecond
	reset, overRemaining, afterOver := f.reset, f.overRemaining, f.afterOver
	scs := []scenario{
		{name: "admits_to_limit", limit: perMinute(3), steps: []step{
			{hits: 1, want: ok(0, 1, 2, reset(1, 3))},
			{hits: 1, want: ok(1, 2, 1, reset(2, 3))},
			{hits: 1, want: ok(2, 3, 0, reset(3, 3))},
			{hits: 1, want: over(3, 4, 0, reset(3, 3))},
			{hits: 1, want: over(afterOver(3, 1), afterOver(3, 1)+1, 0, reset(3, 3))},
		}},
		{name: "hits_addend", limit: perMinute(10), steps: []step{
			{hits: 4, want: ok(0, 4, 6, reset(4, 10))},
			{hits: 4, want: ok(4, 8, 2, reset(8, 10))},
			{hits: 4, want: over(8, 12, overRemaining(8, 10), reset(8, 10))},
			{hits: 11, want: over(afterOver(8, 4), afterOver(8, 4)+11, overRemaining(8, 10), reset(8, 10))},
		}},
		{name: "hits_0_reads_only", limit: perMinute(5), steps: []step{
			{hits: 0, want: ok(0, 0, 5, reset(0, 5))},
			{hits: 3, want: ok(0, 3, 2, reset(3, 5))},
			{hits: 0, want: ok(3, 3, 2, reset(3, 5))},
			{hits: 0, want: ok(3, 3, 2, reset(3, 5))},
			{hits: 2, want: ok(3, 5, 0, reset(5, 5))},
		}},
		{name: "keys_independent", limit: perMinute(2), steps: []step{
			{entry: "a", hits: 2, want: ok(0, 2, 0, reset(2, 2))},
			{entry: "a", hits: 1, want: over(2, 3, 0, reset(2, 2))},
			{entry: "b", hits: 1, want: ok(0, 1, 1, reset(1, 2))},
			{entry: "c", hits: 2, want: ok(0, 2, 0, reset(2, 2))},
		}},
		{name: "limit_0_refuses_every_hit", limit: perMinute(0), steps: []step{
			{hits: 1, want: over(0, 1, 0, limitZeroReset(a))},
			{hits: 1, want: over(afterOver(0, 1), afterOver(0, 1)+1, 0, limitZeroReset(a))},
		}},
		{name: "windows_roll_over", limit: perSecond(3), realTime: true, steps: []step{
			{hits: 3, want: ok(0, 3, 0, rollReset(a, 3))},
			{hits: 1, want: over(3, 4, 0, rollReset(a, 3))},
			{at: 2 * s, hits: 3, want: ok(0, 3, 0, rollReset(a, 3))},
		}},
	}
	return append(scs, f.exact()...)
}

// figures are an algorithm's expected figures, for the tables.
type figures struct{ a rules.Algorithm }

func (f figures) perMinute(n uint32) rules.Limit {
	return rules.Limit{RequestsPerUnit: n, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: f.a}
}

func (f figures) perSecond(n uint32) rules.Limit {
	return rules.Limit{RequestsPerUnit: n, Unit: rules.Second, UnitMultiplier: 1, Algorithm: f.a}
}

// reset is the algorithm's ResetAfter after n of limit hits at once, 10 s
// into a minute window.
func (f figures) reset(n, limit uint64) time.Duration {
	switch f.a {
	case rules.FixedWindow:
		return 50 * time.Second
	case rules.SlidingWindow:
		if n < limit {
			return 0
		}
		// Curr = limit: one more fits once the previous window weighs
		// (limit-1)/limit, in the next window.
		w := uint64(60_000_000)
		rmax := (limit - 1) * 1_000_000 / limit * w / 1_000_000
		return time.Duration(50_000_000+w-rmax) * time.Microsecond
	case rules.SlidingLog:
		if n == 0 {
			return 0
		}
		return time.Minute
	default: // token bucket: n tokens at one per 60/limit s
		return time.Duration(n) * time.Minute / time.Duration(limit)
	}
}

// overRemaining is Remaining after a refused op when count hits were
// admitted of limit: fixed windows record the refused hits.
func (f figures) overRemaining(count, limit uint64) uint64 {
	if f.a == rules.FixedWindow {
		return 0
	}
	return limit - count
}

// afterOver is the count after a refused op of hits.
func (f figures) afterOver(count, hits uint64) uint64 {
	if f.a == rules.FixedWindow {
		return count + hits
	}
	return count
}

// exact are the scenarios of exact Remaining and ResetAfter as time
// passes: the table of algorithm.go, one case per algorithm (and the
// token bucket's burst).
func (f figures) exact() []scenario {
	const s, ms = time.Second, time.Millisecond
	exact := scenario{name: "remaining_and_reset", batchOnly: true}
	var more []scenario
	switch f.a {
	case rules.FixedWindow:
		exact.limit = f.perMinute(10)
		exact.steps = []step{
			{at: 5 * s, hits: 9, want: ok(0, 9, 1, 55*s)},
			{at: 59*s + 900*ms, hits: 2, want: over(9, 11, 0, 1*s)},
			{at: 60 * s, hits: 1, want: ok(0, 1, 9, 60*s)},
		}
	case rules.SlidingWindow:
		exact.limit = f.perMinute(10)
		exact.steps = []step{
			{at: 0, hits: 10, want: ok(0, 10, 0, 66*s)},
			{at: 30 * s, hits: 1, want: over(10, 11, 0, 36*s)},
			{at: 66 * s, hits: 1, want: ok(9, 10, 0, 6*s)},
			{at: 72 * s, hits: 0, want: ok(9, 9, 1, 0)},
			{at: 150 * s, hits: 9, want: ok(1, 10, 0, 30*s)},
			{at: 300 * s, hits: 0, want: ok(0, 0, 10, 0)},
		}
	case rules.SlidingLog:
		exact.limit = f.perMinute(3)
		exact.steps = []step{
			{at: 0, hits: 1, want: ok(0, 1, 2, 60*s)},
			{at: 10 * s, hits: 1, want: ok(1, 2, 1, 50*s)},
			{at: 20 * s, hits: 1, want: ok(2, 3, 0, 40*s)},
			{at: 30 * s, hits: 1, want: over(3, 4, 0, 30*s)},
			{at: 60 * s, hits: 1, want: ok(2, 3, 0, 10*s)},
			{at: 200 * s, hits: 0, want: ok(0, 0, 3, 0)},
		}
	case rules.TokenBucket:
		exact.limit = f.perMinute(60)
		exact.steps = []step{
			{at: 0, hits: 10, want: ok(0, 10, 50, 10*s)},
			{at: 5 * s, hits: 55, want: ok(5, 60, 0, 60*s)},
			{at: 5*s + 500*ms, hits: 1, want: over(60, 61, 0, 59*s+500*ms)},
			{at: 6 * s, hits: 1, want: ok(59, 60, 0, 60*s)},
			{at: 100 * s, hits: 0, want: ok(0, 0, 60, 0)},
		}
		burst := f.perSecond(10)
		burst.Burst = 1
		more = append(more, scenario{name: "burst_1_spaces_hits", limit: burst, batchOnly: true, steps: []step{
			{at: 0, hits: 1, want: ok(0, 1, 0, 100*ms)},
			{at: 50 * ms, hits: 1, want: over(1, 2, 0, 50*ms)},
			{at: 100 * ms, hits: 1, want: ok(0, 1, 0, 100*ms)},
		}})
	}
	return append(more, exact)
}

func limitZeroReset(a rules.Algorithm) time.Duration {
	switch a {
	case rules.FixedWindow:
		return 50 * time.Second
	case rules.TokenBucket:
		return 0
	}
	return time.Minute
}

// rollReset is ResetAfter after n hits of a 3-a-second limit at the start of
// a second (BatchClock values; ServerClock compares with the pure function).
func rollReset(a rules.Algorithm, n uint64) time.Duration {
	switch a {
	case rules.FixedWindow:
		return time.Second
	case rules.SlidingWindow:
		return time.Second + 333334*time.Microsecond
	case rules.SlidingLog:
		return time.Second
	}
	return time.Duration(n) * 333334 * time.Microsecond
}

// harness runs batches on one store, on an injected or a real clock, and
// keeps a model: the limiter's pure functions applied to the same ops.
type harness struct {
	t      *testing.T
	store  limiter.Store
	clock  Clock
	tol    time.Duration
	start  time.Time // injected: the case's start
	now    time.Time // injected: the current time
	domain string
	model  map[string]*model
}

func newHarness(t *testing.T, store limiter.Store, clock Clock, tol time.Duration) *harness {
	return &harness{
		t: t, store: store, clock: clock, tol: tol,
		start: base, now: base,
		domain: fmt.Sprintf("storetest%016x", rand.Uint64()),
		model:  make(map[string]*model),
	}
}

// time is the time of the next batch: injected, or the real clock.
func (h *harness) time() time.Time {
	if h.clock == ServerClock {
		return time.Now()
	}
	return h.now
}

// advanceTo moves to offset at since the case's start: the injected clock
// jumps; under ServerClock the harness waits, since the store keeps time
// itself.
func (h *harness) advanceTo(at time.Duration) {
	if h.clock == BatchClock {
		h.now = h.start.Add(at)
		return
	}
	if d := time.Until(h.start.Add(at)); d > 0 {
		time.Sleep(d) // a real server's own clock cannot be moved
	}
}

func (h *harness) op(l *rules.Limit, entry string, hits uint64) limiter.Op {
	key := limiter.CacheKey(nil, "", h.domain, []rules.Entry{{Key: "k", Value: entry}}, l, h.time())
	m := max(int64(l.UnitMultiplier), 1)
	return limiter.Op{
		Key:       string(key),
		Algorithm: l.Algorithm,
		Limit:     uint64(l.RequestsPerUnit),
		Burst:     uint64(l.Burst),
		Window:    time.Duration(l.Unit.Seconds()*m) * time.Second,
		Hits:      hits,
		PerSecond: l.Unit == rules.Second,
	}
}

// do sends one batch and returns its results.
func (h *harness) do(allOrNothing bool, ops ...limiter.Op) []limiter.Result {
	h.t.Helper()
	b := &limiter.Batch{Now: h.time(), Ops: ops, Results: make([]limiter.Result, len(ops)), AllOrNothing: allOrNothing}
	if err := h.store.Do(h.t.Context(), b); err != nil {
		h.t.Fatalf("Do(%+v): %v", ops, err)
	}
	return b.Results
}

func (h *harness) run(sc scenario, a rules.Algorithm) {
	h.t.Helper()
	l := sc.limit
	if h.clock == ServerClock {
		h.start = time.Now()
		if !sc.realTime {
			l.Unit = rules.Day
		}
	} else {
		h.start = base.Add(10 * time.Second)
		if sc.realTime || sc.batchOnly {
			h.start = base
		}
		h.now = h.start
	}
	for i, st := range sc.steps {
		h.advanceTo(st.at)
		entry := st.entry
		if entry == "" {
			entry = "a"
		}
		op := h.op(&l, entry, st.hits)
		op.Refund = st.refund
		got := h.do(false, op)[0]
		want := h.expect(op)
		name := fmt.Sprintf("step %d (+%v, %s, hits %d, refund %t)", i, st.at, entry, st.hits, st.refund)
		if h.clock == BatchClock {
			if got != st.want {
				h.t.Errorf("%s: %s = %+v, want %+v", name, a, got, st.want)
			}
			if got != want {
				h.t.Errorf("%s: %s = %+v, but the pure function gives %+v", name, a, got, want)
			}
			continue
		}
		gotR, wantR := got.ResetAfter, want.ResetAfter
		got.ResetAfter, st.want.ResetAfter = 0, 0
		if got != st.want {
			h.t.Errorf("%s: %s = %+v, want %+v (ResetAfter aside)", name, a, got, st.want)
		}
		if d := gotR - wantR; d > h.tol || d < -h.tol {
			h.t.Errorf("%s: %s ResetAfter = %v, want %v ± %v", name, a, gotR, wantR, h.tol)
		}
	}
}

// model is one key's state under the pure functions.
type model struct {
	fw limiter.FixedWindowState
	sw limiter.SlidingWindowState
	sl limiter.SlidingLogState
	tb limiter.TokenBucketState
}

// expect applies op to the model at the harness's time (the store's time
// under BatchClock, the local clock under ServerClock).
func (h *harness) expect(op limiter.Op) limiter.Result {
	m := h.model[op.Key]
	if m == nil {
		m = new(model)
		h.model[op.Key] = m
	}
	return m.apply(h.time(), op)
}

func (m *model) apply(now time.Time, op limiter.Op) limiter.Result {
	var r limiter.Result
	switch op.Algorithm {
	case rules.SlidingWindow:
		m.sw, r = limiter.SlidingWindow(m.sw, now, op)
	case rules.SlidingLog:
		m.sl, r = limiter.SlidingLog(m.sl, now, op)
	case rules.TokenBucket:
		m.tb, r = limiter.TokenBucket(m.tb, now, op)
	default:
		m.fw, r = limiter.FixedWindow(m.fw, now, op)
	}
	return r
}

// testConcurrency sends goroutines × requests single-hit batches on one key
// with a budget of limit and requires exactly limit to be admitted: no lost
// update, no double count. Time stands still (injected) or the window is a
// day, so nothing refills during the test.
func testConcurrency(t *testing.T, store limiter.Store, a rules.Algorithm, clock Clock, goroutines, requests int, limit uint32) {
	h := newHarness(t, store, clock, 0)
	h.now = base.Add(10 * time.Second)
	l := rules.Limit{RequestsPerUnit: limit, Unit: rules.Day, UnitMultiplier: 1, Algorithm: a}
	op := h.op(&l, "hot", 1)
	now := h.time()
	var admitted, refused atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}, Results: make([]limiter.Result, 1)}
			for range requests {
				if clock == ServerClock {
					b.Now = time.Now()
				}
				if err := store.Do(context.Background(), b); err != nil {
					failed.Store(err)
					return
				}
				if b.Results[0].Allowed {
					admitted.Add(1)
				} else {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("Do: %v", err)
	}
	if got := admitted.Load(); got != int64(limit) {
		t.Errorf("%s: %d goroutines × %d requests admitted %d, want exactly %d", a, goroutines, requests, got, limit)
	}
	if got := admitted.Load() + refused.Load(); got != int64(goroutines*requests) {
		t.Errorf("%s: %d decisions, want %d", a, got, goroutines*requests)
	}
	// Fixed windows count every hit, admitted or not.
	if a == rules.FixedWindow {
		op.Hits = 0
		r := h.do(false, op)[0]
		if want := uint64(goroutines * requests); r.Before != want {
			t.Errorf("fixed_window count after the test = %d, want %d", r.Before, want)
		}
	}
}

// testProperty drives random traffic on a few keys and requires the store to
// answer exactly as the pure functions; a fifth of the ops are refunds.
func testProperty(t *testing.T, store limiter.Store, a rules.Algorithm) {
	h := newHarness(t, store, BatchClock, 0)
	rng := rand.New(rand.NewPCG(7, uint64(a)))
	units := []rules.Unit{rules.Second, rules.Minute}
	for seq := range 40 {
		l := rules.Limit{
			RequestsPerUnit: uint32(rng.IntN(12)),
			Unit:            units[rng.IntN(len(units))],
			UnitMultiplier:  uint32(1 + rng.IntN(3)),
			Algorithm:       a,
		}
		if rng.IntN(3) == 0 {
			l.Burst = uint32(rng.IntN(15))
		}
		window := time.Duration(l.Unit.Seconds()*int64(l.UnitMultiplier)) * time.Second
		h.now = base.Add(time.Duration(rng.Int64N(int64(window))))
		for i := range 40 {
			switch rng.IntN(4) {
			case 0:
			case 1, 2:
				h.now = h.now.Add(time.Duration(rng.Int64N(int64(window) / 4)))
			default:
				h.now = h.now.Add(time.Duration(rng.Int64N(int64(window) * 2)))
			}
			h.now = h.now.Truncate(time.Microsecond)
			op := h.op(&l, fmt.Sprintf("seq%d_%d", seq, rng.IntN(2)), uint64(rng.IntN(4)))
			op.Refund = rng.IntN(5) == 0
			got := h.do(false, op)[0]
			if want := h.expect(op); got != want {
				t.Fatalf("seq %d step %d (%+v at %v): got %+v, the pure function gives %+v",
					seq, i, op, h.now, got, want)
			}
		}
	}
}

// testAllOrNothing checks STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a batch
// with an op over its limit records nothing, fixed windows included, and
// reports the unchanged state; a batch that fits records every op.
func testAllOrNothing(t *testing.T, newStore func(t *testing.T) limiter.Store, opts *Options) {
	algs := opts.algorithms()
	for _, a := range algs {
		for _, b := range algs {
			t.Run(a.String()+"+"+b.String(), func(t *testing.T) {
				clock := opts.clock(a)
				if opts.clock(b) == ServerClock {
					clock = ServerClock
				}
				h := newHarness(t, newStore(t), clock, opts.Tolerance)
				h.now = base.Add(10 * time.Second)
				la := rules.Limit{RequestsPerUnit: 5, Unit: rules.Day, UnitMultiplier: 1, Algorithm: a}
				lb := rules.Limit{RequestsPerUnit: 2, Unit: rules.Day, UnitMultiplier: 1, Algorithm: b}

				// Both fit: both recorded.
				rs := h.do(true, h.op(&la, "a", 1), h.op(&lb, "b", 1))
				if !rs[0].Allowed || !rs[1].Allowed || rs[0].After != 1 || rs[1].After != 1 {
					t.Fatalf("fitting batch: %+v, want both admitted and recorded", rs)
				}
				// b would go over: nothing is recorded.
				rs = h.do(true, h.op(&la, "a", 2), h.op(&lb, "b", 2))
				if !rs[0].Allowed || rs[1].Allowed {
					t.Errorf("batch over b's limit: Allowed %v, %v; want true, false", rs[0].Allowed, rs[1].Allowed)
				}
				if rs[0].Before != 1 || rs[0].After != 3 || rs[0].Remaining != 4 {
					t.Errorf("a in a refused batch: %+v, want Before 1, After 3, Remaining 4 (unchanged)", rs[0])
				}
				if rs[1].Before != 1 || rs[1].After != 3 || rs[1].Remaining != 1 {
					t.Errorf("b in a refused batch: %+v, want Before 1, After 3, Remaining 1 (unchanged)", rs[1])
				}
				rs = h.do(false, h.op(&la, "a", 0), h.op(&lb, "b", 0))
				if rs[0].Before != 1 || rs[1].Before != 1 {
					t.Errorf("after a refused batch: counts %d, %d; want 1, 1 (nothing recorded)", rs[0].Before, rs[1].Before)
				}
				// The same key twice: the second op sees the first.
				rs = h.do(true, h.op(&lb, "b", 1), h.op(&lb, "b", 1))
				if !rs[0].Allowed || rs[1].Allowed {
					t.Errorf("b twice, 1 left: Allowed %v, %v; want true, false", rs[0].Allowed, rs[1].Allowed)
				}
				rs = h.do(true, h.op(&lb, "b", 1))
				if !rs[0].Allowed || rs[0].After != 2 {
					t.Errorf("b once, 1 left: %+v, want admitted to 2 (the refused pair recorded nothing)", rs[0])
				}
				// A single op over its limit is not recorded either.
				rs = h.do(true, h.op(&lb, "b", 1))
				if rs[0].Allowed || rs[0].Before != 2 || rs[0].After != 3 {
					t.Errorf("b over, alone: %+v, want refused, Before 2, After 3", rs[0])
				}
				rs = h.do(false, h.op(&lb, "b", 0))
				if rs[0].Before != 2 {
					t.Errorf("b after a refused single op: count %d, want 2", rs[0].Before)
				}
			})
		}
	}
}

// testCanceled requires a canceled context to fail fast with an error that
// wraps limiter.ErrUnavailable.
func testCanceled(t *testing.T, store limiter.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	l := rules.Limit{RequestsPerUnit: 1, Unit: rules.Minute, UnitMultiplier: 1}
	h := newHarness(t, store, BatchClock, 0)
	b := &limiter.Batch{Now: base, Ops: []limiter.Op{h.op(&l, "a", 1)}, Results: make([]limiter.Result, 1)}
	err := store.Do(ctx, b)
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do with a canceled context = %v, want an error wrapping limiter.ErrUnavailable", err)
	}
}
