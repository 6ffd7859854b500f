package limiter

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestTakeBackRestores: an op taken back with no op in between leaves a
// state that answers every later op as the state before it did.
func TestTakeBackRestores(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, alg := range rules.Algorithms {
		for seq := range 200 {
			op := Op{Algorithm: alg, Limit: uint64(1 + rng.IntN(8)), Window: time.Duration(1+rng.IntN(3)) * time.Second}
			now := time.Unix(1_700_000_000, 0)
			var sw SlidingWindowState
			var sl, slCopy SlidingLogState
			var tb TokenBucketState
			var fw FixedWindowState
			for step := range 12 {
				now = now.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
				op.Hits = uint64(rng.IntN(3))
				// A copy of the log: SlidingLog updates its ring in place.
				slCopy = SlidingLogState{ring: append([]int64(nil), sl.ring...), head: sl.head, n: sl.n}
				var r Result
				switch alg {
				case rules.SlidingWindow:
					var after SlidingWindowState
					after, r = SlidingWindow(sw, now, op)
					if r.Allowed {
						after = after.TakeBack(after.Start, op.Window, op.Hits)
					}
					sameAnswers(t, alg, seq, step, op, now, func(o Op, at time.Time) Result { _, x := SlidingWindow(sw, at, o); return x },
						func(o Op, at time.Time) Result { _, x := SlidingWindow(after, at, o); return x })
				case rules.SlidingLog:
					var after SlidingLogState
					after, r = SlidingLog(slCopy, now, op)
					if r.Allowed && op.Hits > 0 {
						after.TakeBack(after.at(after.n-1), op.Hits)
					}
					sameAnswers(t, alg, seq, step, op, now, func(o Op, at time.Time) Result { return readLog(sl, at, o) },
						func(o Op, at time.Time) Result { return readLog(after, at, o) })
				case rules.TokenBucket:
					var after TokenBucketState
					after, r = TokenBucket(tb, now, op)
					after = after.TakeBack(tb.TAT, after.TAT, op)
					if after != tb {
						t.Fatalf("token_bucket seq %d step %d: took back to %+v, want %+v", seq, step, after, tb)
					}
				default:
					var after FixedWindowState
					after, r = FixedWindow(fw, now, op)
					if after.TakeBack(op.Hits) != fw {
						t.Fatalf("fixed_window seq %d step %d: took back to %+v, want %+v", seq, step, after.TakeBack(op.Hits), fw)
					}
				}
				_ = r
				// Move on with the op recorded.
				sw, _ = SlidingWindow(sw, now, op)
				sl, _ = SlidingLog(sl, now, op)
				tb, _ = TokenBucket(tb, now, op)
				fw, _ = FixedWindow(fw, now, op)
			}
		}
	}
}

// readLog is SlidingLog's answer on a copy of s, which it leaves unchanged.
func readLog(s SlidingLogState, at time.Time, o Op) Result {
	c := SlidingLogState{ring: append([]int64(nil), s.ring...), head: s.head, n: s.n}
	_, r := SlidingLog(c, at, o)
	return r
}

// sameAnswers holds two states to the same answers for later ops.
func sameAnswers(t *testing.T, alg rules.Algorithm, seq, step int, op Op, now time.Time, want, got func(Op, time.Time) Result) {
	t.Helper()
	for _, d := range []time.Duration{0, op.Window / 3, op.Window, 2 * op.Window} {
		for hits := range uint64(3) {
			o := op
			o.Hits = hits
			if w, g := want(o, now.Add(d)), got(o, now.Add(d)); w != g {
				t.Fatalf("%s seq %d step %d: after a take-back, %d hits at +%v give %+v, want %+v", alg, seq, step, hits, d, g, w)
			}
		}
	}
}

// TestTakeBackLeavesOthers: hits recorded by other ops after the one taken
// back stay.
func TestTakeBackLeavesOthers(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	op := Op{Limit: 10, Window: time.Minute, Hits: 2}

	var log SlidingLogState
	log, _ = SlidingLog(log, now, op)
	mine := now.Add(time.Second)
	log, _ = SlidingLog(log, mine, op)
	log, _ = SlidingLog(log, now.Add(2*time.Second), Op{Limit: 10, Window: time.Minute, Hits: 3})
	log.TakeBack(mine.UnixMicro(), 2)
	if log.Len() != 5 || log.at(1) != now.UnixMicro() || log.at(2) != now.Add(2*time.Second).UnixMicro() {
		t.Errorf("log after the take-back: %d entries, %v; want the other 5", log.Len(), log.ring)
	}

	bucket := Op{Algorithm: rules.TokenBucket, Limit: 10, Window: 10 * time.Second, Hits: 2}
	var tb TokenBucketState
	tb, _ = TokenBucket(tb, now, bucket)
	before := tb.TAT
	tb, _ = TokenBucket(tb, now, bucket) // ours
	after := tb.TAT
	tb, _ = TokenBucket(tb, now, bucket) // another
	if got := tb.TakeBack(before, after, bucket).TAT; got != after {
		t.Errorf("bucket TAT after the take-back: %d, want %d (the other op's tokens stay)", got, after)
	}

	sw := SlidingWindowState{Start: 60_000_000, Prev: 5, Curr: 1}
	if got := sw.TakeBack(0, time.Minute, 3); got.Prev != 2 || got.Curr != 1 {
		t.Errorf("sliding window: %+v, want 3 hits taken from Prev", got)
	}
	if got := sw.TakeBack(-60_000_000, time.Minute, 3); got != sw {
		t.Errorf("sliding window: %+v, want the hits of a window gone left alone", got)
	}
	if got := (FixedWindowState{Count: 1}).TakeBack(3); got.Count != 0 {
		t.Errorf("fixed window: %+v, want 0", got)
	}
}
