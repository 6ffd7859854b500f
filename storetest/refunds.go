package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// refundScenarios are algorithm a's cases of refunds (limiter.Op.Refund,
// is_negative_hits): hits given back within the limit and over it, more
// than was spent (never below zero), and on a key never hit (nothing to
// give back). The steps are at one instant, so each state is that of n
// hits at once (figures.reset).
func refundScenarios(a rules.Algorithm) []scenario {
	f := figures{a}
	// read is what a read of a key holding n of 10 answers, allowed.
	read := func(n uint64) limiter.Result { return ok(n, n, 10-min(n, 10), f.reset(n, 10)) }
	// After a refused hit of 1 on 10: a fixed window holds 11.
	spent := f.afterOver(10, 1)
	scs := []scenario{
		{name: "refund_gives_back", limit: f.perMinute(10), steps: []step{
			{hits: 3, refund: true, want: read(0)}, // a key never hit: nothing to give back
			{hits: 6, want: ok(0, 6, 4, f.reset(6, 10))},
			{hits: 4, refund: true, want: read(2)},
			{hits: 8, want: ok(2, 10, 0, f.reset(10, 10))},
			{hits: 1, want: over(10, 11, 0, f.reset(10, 10))},
			// Never refused, even while still over the limit.
			{hits: 1, refund: true, want: read(spent - 1)},
			// More than was spent: nothing goes below zero, so no more
			// than the limit is admitted after it.
			{hits: limiter.MaxHits, refund: true, want: read(0)},
			{hits: 10, want: ok(0, 10, 0, f.reset(10, 10))},
			{hits: 1, want: over(10, 11, 0, f.reset(10, 10))},
			{hits: 0, refund: true, want: read(spent)}, // a refund of 0 is a read
		}},
		{name: "refund_keys_independent", limit: f.perMinute(10), steps: []step{
			{entry: "a", hits: 5, want: ok(0, 5, 5, f.reset(5, 10))},
			{entry: "b", hits: 5, refund: true, want: read(0)},
			{entry: "a", hits: 0, want: read(5)},
		}},
	}
	return append(scs, f.exactRefunds())
}

// exactRefunds is the case of exact Remaining and ResetAfter of refunds as
// time passes, one per algorithm (the tables of refund_test.go in the
// limiter).
func (f figures) exactRefunds() scenario {
	const s, ms = time.Second, time.Millisecond
	sc := scenario{name: "refund_remaining_and_reset", batchOnly: true}
	switch f.a {
	case rules.FixedWindow:
		sc.limit = f.perMinute(10)
		sc.steps = []step{
			{at: 10 * s, hits: 8, want: ok(0, 8, 2, 50*s)},
			{at: 11 * s, hits: 5, refund: true, want: ok(3, 3, 7, 49*s)},
			// The next window's key: the refund reaches only its own count.
			{at: 60 * s, hits: 5, refund: true, want: ok(0, 0, 10, 60*s)},
			{at: 60 * s, hits: 10, want: ok(0, 10, 0, 60*s)},
		}
	case rules.SlidingWindow:
		sc.limit = f.perMinute(10)
		sc.steps = []step{
			{at: 0, hits: 6, want: ok(0, 6, 4, 0)},
			{at: 10 * s, hits: 4, refund: true, want: ok(2, 2, 8, 0)},
			{at: 20 * s, hits: 8, want: ok(2, 10, 0, 46*s)},
			// Next window, halfway: the previous 10 weigh 5.
			{at: 90 * s, hits: 3, want: ok(5, 8, 2, 0)},
			// The current window's 3 first, then 2 of the previous 10.
			{at: 90 * s, hits: 5, refund: true, want: ok(4, 4, 6, 0)},
			{at: 90 * s, hits: 100, refund: true, want: ok(0, 0, 10, 0)},
			{at: 90 * s, hits: 10, want: ok(0, 10, 0, 36*s)},
		}
	case rules.SlidingLog:
		sc.limit = f.perMinute(5)
		sc.steps = []step{
			{at: 0, hits: 2, want: ok(0, 2, 3, 60*s)},
			{at: 10 * s, hits: 3, want: ok(2, 5, 0, 50*s)},
			// The newest leave first: those of 10 s.
			{at: 20 * s, hits: 3, refund: true, want: ok(2, 2, 3, 40*s)},
			{at: 30 * s, hits: 1, refund: true, want: ok(1, 1, 4, 30*s)},
			{at: 70 * s, hits: 3, refund: true, want: ok(0, 0, 5, 0)},
			{at: 70 * s, hits: 5, want: ok(0, 5, 0, 60*s)},
		}
	default: // token bucket, one token a second
		sc.limit = f.perMinute(60)
		sc.steps = []step{
			{at: 0, hits: 50, want: ok(0, 50, 10, 50*s)},
			{at: 10 * s, hits: 15, refund: true, want: ok(25, 25, 35, 25*s)},
			{at: 10 * s, hits: 35, want: ok(25, 60, 0, 60*s)},
			{at: 10*s + 500*ms, hits: 1, refund: true, want: ok(59, 59, 1, 58*s+500*ms)},
			{at: 20 * s, hits: 1000, refund: true, want: ok(0, 0, 60, 0)},
			{at: 20 * s, hits: 60, want: ok(0, 60, 0, 60*s)},
		}
	}
	return sc
}

// testRefundBatch: refunds of several keys in one batch, beside a hit,
// each given back on its own key as the pure function says (a store that
// sends a batch of hits in one go must not take refunds for hits).
func testRefundBatch(t *testing.T, store limiter.Store, a rules.Algorithm, clock Clock) {
	h := newHarness(t, store, clock, time.Second)
	h.now = base.Add(10 * time.Second)
	l := rules.Limit{RequestsPerUnit: 10, Unit: rules.Day, UnitMultiplier: 1, Algorithm: a}
	hit := func(entry string, hits uint64, refund bool) limiter.Op {
		op := h.op(&l, entry, hits)
		op.Refund = refund
		return op
	}
	for _, ops := range [][]limiter.Op{
		{hit("a", 3, false), hit("b", 4, false)},
		{hit("a", 2, true), hit("b", 1, true), hit("c", 1, false), hit("d", 5, true)},
		{hit("a", 0, false), hit("b", 0, false), hit("c", 0, false), hit("d", 0, false)}, // what the store kept
	} {
		got := h.do(false, ops...)
		for i, op := range ops {
			want := h.expect(op)
			got[i].ResetAfter, want.ResetAfter = 0, 0 // the clock may move under ServerClock
			if got[i] != want {
				t.Errorf("%s: op %d (%s, hits %d, refund %t) = %+v, the pure function gives %+v",
					a, i, op.Key, op.Hits, op.Refund, got[i], want)
			}
		}
	}
}

// testRefundConcurrency runs algorithm a's refunds under concurrency, on
// one key of 100 a day (nothing refills during the test):
//
//   - exact: from a full key, goroutines each refund one hit and then hit
//     once, many times over. Each hit follows a refund of its own, so
//     every hit must be admitted and, once all are done, the key is full
//     again: no refund or hit lost, none counted twice.
//   - never below zero: from a full key, goroutines refund far more than
//     was spent, all at once. The key must then be empty, not below, and
//     admit exactly 100 single hits sent at once.
func testRefundConcurrency(t *testing.T, newStore func(t *testing.T) limiter.Store, a rules.Algorithm, clock Clock) {
	const goroutines, rounds, limit = 32, 50, 100
	setup := func(t *testing.T) (*harness, limiter.Op) {
		h := newHarness(t, newStore(t), clock, 0)
		h.now = base.Add(10 * time.Second)
		l := rules.Limit{RequestsPerUnit: limit, Unit: rules.Day, UnitMultiplier: 1, Algorithm: a}
		op := h.op(&l, "hot", limit)
		if r := h.do(false, op)[0]; !r.Allowed || r.Remaining != 0 {
			t.Fatalf("filling the key: %+v, want all %d admitted", r, limit)
		}
		op.Hits = 1
		return h, op
	}
	// hammer runs f(b) rounds times on each of goroutines goroutines, b
	// being a batch of op of its own.
	hammer := func(t *testing.T, h *harness, op limiter.Op, f func(b *limiter.Batch) error) {
		var failed atomic.Value
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				b := &limiter.Batch{Ops: []limiter.Op{op}, Results: make([]limiter.Result, 1)}
				for range rounds {
					b.Now = h.time()
					if err := f(b); err != nil {
						failed.Store(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatalf("Do: %v", err)
		}
	}
	t.Run("refunds_exact_under_concurrency", func(t *testing.T) {
		h, op := setup(t)
		var admitted atomic.Int64
		hammer(t, h, op, func(b *limiter.Batch) error {
			b.Ops[0].Refund, b.Ops[0].Hits = true, 1
			if err := h.store.Do(context.Background(), b); err != nil {
				return err
			}
			b.Ops[0].Refund = false
			if err := h.store.Do(context.Background(), b); err != nil {
				return err
			}
			if b.Results[0].Allowed {
				admitted.Add(1)
			}
			return nil
		})
		if got := admitted.Load(); got != goroutines*rounds {
			t.Errorf("%s: %d hits admitted, each after a refund of its own, want all %d", a, got, goroutines*rounds)
		}
		op.Hits = 0
		if r := h.do(false, op)[0]; r.After != limit || r.Remaining != 0 {
			t.Errorf("%s: after as many refunds as hits the key holds %+v, want full again (%d)", a, r, limit)
		}
	})
	t.Run("refunds_never_below_zero_under_concurrency", func(t *testing.T) {
		h, op := setup(t)
		op.Refund, op.Hits = true, 1000
		hammer(t, h, op, func(b *limiter.Batch) error {
			return h.store.Do(context.Background(), b)
		})
		op.Refund, op.Hits = false, 0
		if r := h.do(false, op)[0]; r.After != 0 || r.Remaining != limit {
			t.Fatalf("%s: after refunds of more than was spent the key holds %+v, want empty, %d left", a, r, limit)
		}
		op.Hits = 1
		var admitted atomic.Int64
		hammer(t, h, op, func(b *limiter.Batch) error {
			if err := h.store.Do(context.Background(), b); err != nil {
				return err
			}
			if b.Results[0].Allowed {
				admitted.Add(1)
			}
			return nil
		})
		if got := admitted.Load(); got != limit {
			t.Errorf("%s: %d of %d hits admitted after refunds of more than was spent, want exactly the limit, %d",
				a, got, goroutines*rounds, limit)
		}
	})
}

// testRefundLists: refunds of a descriptor with several limits
// (rules.Limit.Limits), a shadow one among them, through a limiter: the
// refund reaches every limit, each floored at zero, and the descriptor is
// OK whatever its limits say; with stop_increment, a refund beside a
// descriptor over its limit is not held back. Under concurrency, requests
// that reserve and then refund leave every limit as it was.
func testRefundLists(t *testing.T, newStore func(t *testing.T) limiter.Store, opts *Options) {
	second := rules.FixedWindow
	if supports(opts, rules.TokenBucket) && opts.clock(rules.TokenBucket) == BatchClock {
		second = rules.TokenBucket
	}
	// list is a day's fixed window of 10, a week of weekly of the second
	// algorithm, and a shadow fixed window of 4 a day.
	list := func(weekly int) string {
		return fmt.Sprintf(`      - {unit: day, requests_per_unit: 10}
      - {unit: week, requests_per_unit: %d, algorithm: %s}
      - {unit: day, requests_per_unit: 4, shadow_mode: true}
`, weekly, second)
	}
	now := base.Add(10 * time.Second)
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("gives_back/stop_increment=%t", stop), func(t *testing.T) {
			t.Parallel()
			domain, limits := shadowDomain(t, list(6))
			l := limiter.New(newStore(t), limiter.Config{StopIncrementWhenOverLimit: stop})
			check := func(hits uint64, refund, beside bool) (limiter.Status, [3]uint32) {
				t.Helper()
				each := make([]limiter.Status, 3)
				ds := []limiter.Descriptor{
					{Entries: []rules.Entry{{Key: "user", Value: "x"}}, Limit: limits["user"], Hits: hits, Refund: refund, Each: each},
				}
				if beside {
					// A descriptor always over its limit.
					ds = append(ds, limiter.Descriptor{Entries: []rules.Entry{{Key: "block", Value: "x"}}, Limit: limits["block"], Hits: 1})
				}
				out := make([]limiter.Status, len(ds))
				if err := l.Check(t.Context(), domain, now, ds, out); err != nil {
					t.Fatal(err)
				}
				return out[0], [3]uint32{each[0].Remaining, each[1].Remaining, each[2].Remaining}
			}
			// The shadow limit would refuse 5: a fixed window counts them
			// all (5 of 4), but with stop_increment it records only what it
			// admits (none); a refund of 3 then leaves 2 of 4, or none.
			shadowLeft, shadowRefunded := uint32(0), uint32(2)
			if stop {
				shadowLeft, shadowRefunded = 4, 4
			}
			check(5, false, false)
			if _, left := check(0, false, false); left != [3]uint32{5, 1, shadowLeft} {
				t.Fatalf("after a hit of 5: %v left, want [5 1 %d]", left, shadowLeft)
			}
			st, left := check(3, true, true)
			if want := [3]uint32{8, 4, shadowRefunded}; st.Code != limiter.OK || left != want {
				t.Errorf("refund of 3 beside a descriptor over its limit: %+v, limits %v left; want OK, %v", st, left, want)
			}
			if st.Counts != (limiter.Counts{TotalNegativeHits: 3}) {
				t.Errorf("refund of 3 counts %+v, want only TotalNegativeHits 3", st.Counts)
			}
			if _, left := check(1000, true, false); left != [3]uint32{10, 6, 4} {
				t.Errorf("after a refund of 1000: %v left, want every limit empty", left)
			}
		})
	}
	t.Run("exact_under_concurrency", func(t *testing.T) {
		t.Parallel()
		const goroutines, rounds = 32, 25
		// The weekly limit of 64 admits every reserve (at most 32 are
		// out at once), so that each refund gives back its own.
		domain, limits := shadowDomain(t, list(64))
		l := limiter.New(newStore(t), limiter.Config{})
		entries := []rules.Entry{{Key: "user", Value: "hot"}}
		var failed atomic.Value
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				out := make([]limiter.Status, 1)
				for range rounds {
					for _, refund := range []bool{false, true} {
						ds := []limiter.Descriptor{{Entries: entries, Limit: limits["user"], Hits: 1, Refund: refund}}
						if err := l.Check(context.Background(), domain, now, ds, out); err != nil {
							failed.Store(err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatalf("Check: %v", err)
		}
		each := make([]limiter.Status, 3)
		ds := []limiter.Descriptor{{Entries: entries, Limit: limits["user"], Each: each}}
		if err := l.Check(t.Context(), domain, now, ds, make([]limiter.Status, 1)); err != nil {
			t.Fatal(err)
		}
		// The fixed windows counted every hit, admitted or not, and the
		// weekly limit admitted every one: each refund found its own.
		if left := [3]uint32{each[0].Remaining, each[1].Remaining, each[2].Remaining}; left != [3]uint32{10, 64, 4} {
			t.Errorf("after %d reserves and refunds the limits have %v left, want all of them, [10 64 4]", goroutines*rounds, left)
		}
	})
}
