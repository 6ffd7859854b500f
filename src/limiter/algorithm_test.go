package limiter

import (
	"math"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// base is midnight UTC, so it starts a second, a minute, an hour and a day.
var base = time.Unix(1_699_920_000, 0)

// machine runs one key through the pure function of its algorithm. For
// fixed windows it starts a new count when the window changes, as the
// change of cache key does in a store.
type machine struct {
	fwStart int64
	fw      FixedWindowState
	sw      SlidingWindowState
	sl      SlidingLogState
	tb      TokenBucketState
}

func (m *machine) apply(now time.Time, op Op) Result {
	var r Result
	switch op.Algorithm {
	case rules.FixedWindow:
		if s := WindowStart(now, int64(op.Window/time.Second)); s != m.fwStart {
			m.fwStart, m.fw = s, FixedWindowState{}
		}
		m.fw, r = FixedWindow(m.fw, now, op)
	case rules.SlidingWindow:
		m.sw, r = SlidingWindow(m.sw, now, op)
	case rules.SlidingLog:
		m.sl, r = SlidingLog(m.sl, now, op)
	case rules.TokenBucket:
		m.tb, r = TokenBucket(m.tb, now, op)
	}
	return r
}

type step struct {
	at   time.Duration // since base
	hits uint64
	want Result
}

func runSteps(t *testing.T, op Op, steps []step) {
	t.Helper()
	var m machine
	for i, s := range steps {
		op.Hits = s.hits
		if got := m.apply(base.Add(s.at), op); got != s.want {
			t.Errorf("step %d (%v, hits %d): %s = %+v, want %+v", i, s.at, s.hits, op.Algorithm, got, s.want)
		}
	}
}

func ok(before, after, remaining uint64, reset time.Duration) Result {
	return Result{Before: before, After: after, Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func over(before, after, remaining uint64, reset time.Duration) Result {
	return Result{Before: before, After: after, Remaining: remaining, ResetAfter: reset}
}

const (
	ms = time.Millisecond
	s  = time.Second
)

func TestFixedWindow(t *testing.T) {
	t.Parallel()
	runSteps(t, Op{Algorithm: rules.FixedWindow, Limit: 3, Window: time.Minute}, []step{
		{10 * s, 1, ok(0, 1, 2, 50*s)},
		{10 * s, 1, ok(1, 2, 1, 50*s)},
		{10*s + 999*ms, 1, ok(2, 3, 0, 50*s)}, // whole seconds, as the anchor
		{11 * s, 1, over(3, 4, 0, 49*s)},      // recorded although over
		{11 * s, 0, over(4, 4, 0, 49*s)},      // a read of a key over its limit is over
		{59*s + 900*ms, 0, over(4, 4, 0, 1*s)},
		{60 * s, 2, ok(0, 2, 1, 60*s)}, // next window
		{60 * s, 2, over(2, 4, 0, 60*s)},
	})
	runSteps(t, Op{Algorithm: rules.FixedWindow, Limit: 10, Window: 5 * time.Minute}, []step{
		{299 * s, 10, ok(0, 10, 0, 1*s)},
		{300 * s, 1, ok(0, 1, 9, 300*s)},
	})
}

func TestSlidingWindow(t *testing.T) {
	t.Parallel()
	runSteps(t, Op{Algorithm: rules.SlidingWindow, Limit: 10, Window: time.Minute}, []step{
		// 10 at the start of a window: the next fits only when the
		// previous window weighs 9: ceil(10 × w) <= 9 for w <= 0.9,
		// 54 s before the end of the next window, 66 s from now.
		{0, 10, ok(0, 10, 0, 66*s)},
		{30 * s, 1, over(10, 11, 0, 36*s)},
		// 6 s into the next window: weight ceil(54/60 × 1e6) = 900000,
		// estimate ceil(10 × 0.9) = 9. One more then needs a weight of
		// 0.8: 48 s before the end, in 6 s.
		{66 * s, 1, ok(9, 10, 0, 6*s)},
		{72 * s, 0, ok(9, 9, 1, 0)}, // 1 + ceil(10 × 0.8) = 9: one fits now
		// Third window, halfway: Prev 1 weighs ceil(0.5) = 1.
		{150 * s, 9, ok(1, 10, 0, 30*s)},
		{150 * s, 1, over(10, 11, 0, 30*s)},
		{300 * s, 0, ok(0, 0, 10, 0)}, // two windows later: empty
	})
	runSteps(t, Op{Algorithm: rules.SlidingWindow, Limit: 3, Window: time.Second}, []step{
		{0, 3, ok(0, 3, 0, 1*s+333334*time.Microsecond)},
		// 1/3 s into the next window: weight ceil(2/3 × 1e6) = 666667,
		// estimate ceil(3 × 0.666667) = 3: not yet.
		{1*s + 333333*time.Microsecond, 1, over(3, 4, 0, 1*time.Microsecond)},
		{1*s + 333334*time.Microsecond, 1, ok(2, 3, 0, 333333*time.Microsecond)},
	})
}

func TestSlidingLog(t *testing.T) {
	t.Parallel()
	runSteps(t, Op{Algorithm: rules.SlidingLog, Limit: 3, Window: time.Minute}, []step{
		{0, 1, ok(0, 1, 2, 60*s)},
		{10 * s, 1, ok(1, 2, 1, 50*s)},
		{20 * s, 1, ok(2, 3, 0, 40*s)},
		{30 * s, 1, over(3, 4, 0, 30*s)},
		{60 * s, 1, ok(2, 3, 0, 10*s)}, // the hit of 0 s left at 60 s
		{200 * s, 2, ok(0, 2, 1, 60*s)},
		{200 * s, 2, over(2, 4, 1, 60*s)},
		{200 * s, 0, ok(2, 2, 1, 60*s)},
		{259*s + 999*ms, 1, ok(2, 3, 0, 1*ms)},
	})
}

func TestTokenBucket(t *testing.T) {
	t.Parallel()
	// 60 a minute: one token a second, 60 in the bucket.
	runSteps(t, Op{Algorithm: rules.TokenBucket, Limit: 60, Window: time.Minute}, []step{
		{0, 10, ok(0, 10, 50, 10*s)},
		{5 * s, 55, ok(5, 60, 0, 60*s)},
		{5*s + 500*ms, 1, over(60, 61, 0, 59*s+500*ms)}, // 59.5 tokens in use: 60 whole
		{6 * s, 1, ok(59, 60, 0, 60*s)},
		{100 * s, 0, ok(0, 0, 60, 0)},
	})
	// burst 1 spaces hits evenly: one every 100 ms.
	runSteps(t, Op{Algorithm: rules.TokenBucket, Limit: 10, Burst: 1, Window: time.Second}, []step{
		{0, 1, ok(0, 1, 0, 100*ms)},
		{50 * ms, 1, over(1, 2, 0, 50*ms)},
		{100 * ms, 1, ok(0, 1, 0, 100*ms)},
		{time.Second, 2, over(0, 2, 1, 0)},
	})
	// A burst above the rate: 5 at once, then one a second.
	runSteps(t, Op{Algorithm: rules.TokenBucket, Limit: 1, Burst: 5, Window: time.Second}, []step{
		{0, 5, ok(0, 5, 0, 5*s)},
		{1 * s, 2, over(4, 6, 1, 4*s)},
		{1 * s, 1, ok(4, 5, 0, 5*s)},
	})
	// 3 a second: T = ceil(1e6/3) = 333334 µs.
	runSteps(t, Op{Algorithm: rules.TokenBucket, Limit: 3, Window: time.Second}, []step{
		{0, 3, ok(0, 3, 0, 1000002*time.Microsecond)},
	})
}

func TestLimitZero(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		op := Op{Algorithm: a, Limit: 0, Burst: 5, Window: time.Minute}
		var m machine
		op.Hits = 1
		r := m.apply(base.Add(10*s), op)
		if r.Allowed || r.Remaining != 0 || r.After != 1 {
			t.Errorf("%s limit 0, hits 1: %+v, want refused with After 1 and Remaining 0", a, r)
		}
		op.Hits = 0
		r = m.apply(base.Add(10*s), op)
		if a != rules.FixedWindow && (!r.Allowed || r.Remaining != 0) {
			t.Errorf("%s limit 0, hits 0: %+v, want allowed with Remaining 0", a, r)
		}
		if a == rules.SlidingWindow || a == rules.SlidingLog {
			if r.ResetAfter != time.Minute {
				t.Errorf("%s limit 0: ResetAfter %v, want the window", a, r.ResetAfter)
			}
		}
	}
}

func TestSlidingLogForget(t *testing.T) {
	t.Parallel()
	op := Op{Algorithm: rules.SlidingLog, Limit: 5, Window: time.Minute, Hits: 2}
	var st SlidingLogState
	st, _ = SlidingLog(st, base, op)
	st, _ = SlidingLog(st, base.Add(s), op)
	st.Forget(2)
	op.Hits = 0
	st, r := SlidingLog(st, base.Add(2*s), op)
	if r.Before != 2 || r.ResetAfter != 58*s {
		t.Errorf("after Forget(2): %+v, want 2 logged hits, oldest at 0 s", r)
	}
	if got, want := st.IdleAt(time.Minute), base.Add(time.Minute).UnixMicro(); got != want {
		t.Errorf("IdleAt = %d, want %d", got, want)
	}
}

func TestSlidingLogRingWraps(t *testing.T) {
	t.Parallel()
	op := Op{Algorithm: rules.SlidingLog, Limit: 4, Window: 10 * time.Second, Hits: 1}
	var st SlidingLogState
	var r Result
	// One hit every 3 s keeps 4 in the window, or 3 once the first leaves:
	// the ring wraps many times without growing past the limit.
	for i := range 100 {
		st, r = SlidingLog(st, base.Add(time.Duration(i)*3*s), op)
		if !r.Allowed {
			t.Fatalf("hit %d refused: %+v", i, r)
		}
		if st.Cap() > 4 {
			t.Fatalf("ring grew to %d, above the limit", st.Cap())
		}
	}
	if st.Cap() != 4 {
		t.Errorf("Cap = %d, want the ring of the limit, 4", st.Cap())
	}
	if r.Before != 3 || r.ResetAfter != 1*s {
		t.Errorf("last hit: %+v, want 3 logged before and the oldest (288 s) leaving in 1 s", r)
	}
}

func TestClockGoesBack(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms[1:] {
		op := Op{Algorithm: a, Limit: 2, Window: time.Minute, Hits: 1}
		var m machine
		m.apply(base.Add(90*s), op)
		m.apply(base.Add(30*s), op) // an older clock must not free anything
		r := m.apply(base.Add(30*s), op)
		if r.Allowed {
			t.Errorf("%s: third hit admitted after the clock went back: %+v", a, r)
		}
	}
}

func TestOverflowSaturates(t *testing.T) {
	t.Parallel()
	huge := Op{Limit: math.MaxUint64, Burst: math.MaxUint64, Window: math.MaxInt64, Hits: math.MaxUint64}
	for _, a := range rules.Algorithms {
		if a == rules.SlidingLog {
			continue // it would log 2^64 hits: bounded by memory, not math
		}
		op := huge
		op.Algorithm = a
		var m machine
		m.apply(base, op)
		m.apply(base, op) // must not panic or wrap around
	}
	if got := mulDiv(math.MaxUint64, math.MaxUint64, 1); got != math.MaxUint64 {
		t.Errorf("mulDiv overflow = %d, want saturation", got)
	}
}
