package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// refundStep is a step of runRefunds: hits consumed, or given back when
// refund is set.
type refundStep struct {
	at     time.Duration // since base
	hits   uint64
	refund bool
	want   Result
}

func runRefunds(t *testing.T, op Op, steps []refundStep) {
	t.Helper()
	var m machine
	for i, s := range steps {
		op.Hits, op.Refund = s.hits, s.refund
		if got := m.apply(base.Add(s.at), op); got != s.want {
			t.Errorf("step %d (%v, hits %d, refund %v): %s = %+v, want %+v", i, s.at, s.hits, s.refund, op.Algorithm, got, s.want)
		}
	}
}

func TestRefundFixedWindow(t *testing.T) {
	t.Parallel()
	runRefunds(t, Op{Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute}, []refundStep{
		{at: 10 * s, hits: 0, refund: true, want: ok(0, 0, 10, 50*s)}, // nothing to give back
		{at: 10 * s, hits: 8, want: ok(0, 8, 2, 50*s)},
		{at: 11 * s, hits: 5, refund: true, want: ok(3, 3, 7, 49*s)},
		{at: 12 * s, hits: 7, want: ok(3, 10, 0, 48*s)},
		{at: 12 * s, hits: 4, want: over(10, 14, 0, 48*s)}, // recorded although over
		// Still over after the refund: never refused, Remaining 0.
		{at: 13 * s, hits: 2, refund: true, want: ok(12, 12, 0, 47*s)},
		// More than was spent: the count stops at 0, never below.
		{at: 14 * s, hits: 1000, refund: true, want: ok(0, 0, 10, 46*s)},
		{at: 14 * s, hits: 10, want: ok(0, 10, 0, 46*s)},
		{at: 14 * s, hits: 1, want: over(10, 11, 0, 46*s)},
		// The next window: a refund reaches only its own count.
		{at: 60 * s, hits: 5, refund: true, want: ok(0, 0, 10, 60*s)},
		{at: 60 * s, hits: 10, want: ok(0, 10, 0, 60*s)},
	})
}

func TestRefundSlidingWindow(t *testing.T) {
	t.Parallel()
	runRefunds(t, Op{Algorithm: rules.SlidingWindow, Limit: 10, Window: time.Minute}, []refundStep{
		{at: 0, hits: 6, want: ok(0, 6, 4, 0)},
		{at: 10 * s, hits: 4, refund: true, want: ok(2, 2, 8, 0)},
		{at: 20 * s, hits: 8, want: ok(2, 10, 0, 46*s)},
		// Next window, halfway: Prev 10 weighs 5, Curr 3.
		{at: 90 * s, hits: 3, want: ok(5, 8, 2, 0)},
		// Curr first (3), then Prev (10 → 8, weighing 4).
		{at: 90 * s, hits: 5, refund: true, want: ok(4, 4, 6, 0)},
		// Everything back: the estimate stops at 0.
		{at: 90 * s, hits: 100, refund: true, want: ok(0, 0, 10, 0)},
		{at: 90 * s, hits: 10, want: ok(0, 10, 0, 36*s)},
		{at: 90 * s, hits: 1, want: over(10, 11, 0, 36*s)},
	})
}

func TestRefundSlidingLog(t *testing.T) {
	t.Parallel()
	runRefunds(t, Op{Algorithm: rules.SlidingLog, Limit: 5, Window: time.Minute}, []refundStep{
		{at: 0, hits: 2, want: ok(0, 2, 3, 60*s)},
		{at: 10 * s, hits: 3, want: ok(2, 5, 0, 50*s)},
		{at: 20 * s, hits: 1, want: over(5, 6, 0, 40*s)},
		// The newest leave first: those of 10 s.
		{at: 20 * s, hits: 3, refund: true, want: ok(2, 2, 3, 40*s)},
		{at: 30 * s, hits: 1, refund: true, want: ok(1, 1, 4, 30*s)},
		// Past the window the log is empty: nothing to give back.
		{at: 70 * s, hits: 3, refund: true, want: ok(0, 0, 5, 0)},
		{at: 70 * s, hits: 5, want: ok(0, 5, 0, 60*s)},
		{at: 80 * s, hits: 99, refund: true, want: ok(0, 0, 5, 0)},
		{at: 80 * s, hits: 5, want: ok(0, 5, 0, 60*s)},
		{at: 80 * s, hits: 1, want: over(5, 6, 0, 60*s)},
	})
}

func TestRefundTokenBucket(t *testing.T) {
	t.Parallel()
	// One token a second, 60 in the bucket.
	runRefunds(t, Op{Algorithm: rules.TokenBucket, Limit: 60, Window: time.Minute}, []refundStep{
		{at: 0, hits: 50, want: ok(0, 50, 10, 50*s)},
		{at: 10 * s, hits: 15, refund: true, want: ok(25, 25, 35, 25*s)},
		{at: 10 * s, hits: 35, want: ok(25, 60, 0, 60*s)},
		{at: 10 * s, hits: 1, want: over(60, 61, 0, 60*s)},
		// Half a token in use rounds up; a refund of 1 takes back a
		// whole T, so 59.5 → 58.5 in use: 59 whole.
		{at: 10*s + 500*ms, hits: 1, refund: true, want: ok(59, 59, 1, 58*s+500*ms)},
		// Never past a full bucket.
		{at: 20 * s, hits: 1000, refund: true, want: ok(0, 0, 60, 0)},
		{at: 20 * s, hits: 60, want: ok(0, 60, 0, 60*s)},
		{at: 20 * s, hits: 1, want: over(60, 61, 0, 60*s)},
	})
	// A bucket of capacity 0 has nothing to give back.
	runRefunds(t, Op{Algorithm: rules.TokenBucket, Limit: 0, Window: time.Minute}, []refundStep{
		{at: 0, hits: 3, refund: true, want: ok(0, 0, 0, 0)},
	})
}

// TestRefundUndoesAHit holds every algorithm to the rule that a refund of
// the hits just admitted, at the same instant, gives back exactly those:
// every later op answers as if the hit had never been, on random traffic.
func TestRefundUndoesAHit(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(11, uint64(a)))
			for seq := range 200 {
				op := Op{Algorithm: a, Limit: uint64(1 + rng.IntN(12)), Window: time.Duration(1+rng.IntN(3)) * time.Minute}
				if a == rules.TokenBucket && rng.IntN(2) == 0 {
					op.Burst = uint64(1 + rng.IntN(15))
				}
				var with, without machine
				now := base.Add(time.Duration(rng.Int64N(int64(op.Window))))
				probe := rng.IntN(30)
				for i := range 30 {
					now = now.Add(time.Duration(rng.Int64N(int64(op.Window) / 3))).Truncate(time.Microsecond)
					op.Hits, op.Refund = uint64(rng.IntN(4)), false
					if i == probe {
						// with: hit and refund at once; without: neither.
						r := with.apply(now, op)
						if !r.Allowed && a != rules.FixedWindow {
							continue // refused: nothing recorded, nothing to give back
						}
						op.Refund = true
						with.apply(now, op)
						continue
					}
					if got, want := with.apply(now, op), without.apply(now, op); got != want {
						t.Fatalf("seq %d step %d (%+v): with a hit and its refund %+v, without %+v", seq, i, op, got, want)
					}
				}
			}
		})
	}
}

// TestRefundNeverBelowZero: however much is given back, and however
// often, a key admits no more than its limit afterwards.
func TestRefundNeverBelowZero(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		op := Op{Algorithm: a, Limit: 7, Window: time.Minute}
		var m machine
		now := base.Add(30 * s)
		op.Hits = 3
		m.apply(now, op)
		op.Refund = true
		for _, h := range []uint64{4, MaxHits, math.MaxUint64} {
			op.Hits = h
			if r := m.apply(now, op); !r.Allowed || r.After != 0 || r.Remaining != 7 {
				t.Errorf("%s: refund of %d = %+v, want allowed, 0 in use, 7 left", a, h, r)
			}
		}
		op.Refund, op.Hits = false, 1
		admitted := 0
		for range 20 {
			if m.apply(now, op).Allowed {
				admitted++
			}
		}
		if admitted != 7 {
			t.Errorf("%s: %d admitted after refunds of more than was spent, want the limit, 7", a, admitted)
		}
	}
}

// TestRefundIsARead: a refund of 0 hits answers as a read, allowed.
func TestRefundIsARead(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		for _, hits := range []uint64{2, 9} {
			name := fmt.Sprintf("%s/%d", a, hits)
			op := Op{Algorithm: a, Limit: 5, Window: time.Minute, Hits: hits}
			var m machine
			now := base.Add(10 * s)
			m.apply(now, op)
			op.Hits = 0
			read := m.apply(now, op)
			op.Refund = true
			got := m.apply(now, op)
			read.Allowed = true
			if got != read {
				t.Errorf("%s: refund of 0 = %+v, want the read %+v, allowed", name, got, read)
			}
		}
	}
}

// TestCheckSendsRefundsApart: a refund goes to the store as a refund op,
// never answered from the near cache; with StopIncrementWhenOverLimit a
// request's refunds go first, in a batch that is not AllOrNothing, and its
// hits after them in one that is.
func TestCheckSendsRefundsApart(t *testing.T) {
	t.Parallel()
	perMinute := &rules.Limit{FullKey: "d.k", RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	refund := Descriptor{Entries: []rules.Entry{{Key: "k", Value: "r"}}, Limit: perMinute, Hits: 4, Refund: true}
	hit := Descriptor{Entries: []rules.Entry{{Key: "k", Value: "h"}}, Limit: perMinute, Hits: 2}
	now := time.Unix(1_700_000_029, 0)
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("stop_%v", stop), func(t *testing.T) {
			t.Parallel()
			var batches []Batch
			store := storeFunc(func(_ context.Context, b *Batch) error {
				batches = append(batches, Batch{AllOrNothing: b.AllOrNothing, Ops: append([]Op(nil), b.Ops...)})
				for i := range b.Ops {
					b.Results[i] = Result{Before: 3, After: 3, Allowed: true, Remaining: 7, ResetAfter: 31 * s}
					if !b.Ops[i].Refund {
						b.Results[i] = Result{Before: 3, After: 5, Allowed: true, Remaining: 5, ResetAfter: 31 * s}
					}
				}
				return nil
			})
			cache := NewNearCache(1 << 20)
			// The refund's key is known over the limit: it must reach the
			// store all the same.
			cache.Remember("d_k_r_1699999980", 10, now, now.Add(time.Minute))
			l := New(store, Config{StopIncrementWhenOverLimit: stop, NearCache: cache})
			out := make([]Status, 2)
			if err := l.Check(t.Context(), "d", now, []Descriptor{hit, refund}, out); err != nil {
				t.Fatal(err)
			}
			want := [][]Op{{
				{Key: "d_k_h_1699999980", Limit: 10, Window: time.Minute, Hits: 2, Rule: "d.k"},
				{Key: "d_k_r_1699999980", Limit: 10, Window: time.Minute, Hits: 4, Refund: true, Rule: "d.k"},
			}}
			if stop {
				want = [][]Op{{want[0][1]}, {want[0][0]}}
			}
			if len(batches) != len(want) {
				t.Fatalf("%d batches, want %d: %+v", len(batches), len(want), batches)
			}
			for k := range want {
				if !slices.Equal(batches[k].Ops, want[k]) {
					t.Errorf("batch %d: %+v, want %+v", k, batches[k].Ops, want[k])
				}
				if aon := stop && !batches[k].Ops[0].Refund; batches[k].AllOrNothing != aon {
					t.Errorf("batch %d: AllOrNothing %v, want %v", k, batches[k].AllOrNothing, aon)
				}
			}
			if st := out[1]; st.Code != OK || st.Limit != perMinute || st.Counts != (Counts{TotalNegativeHits: 4}) || st.ResetAfter != 31*s {
				t.Errorf("refund's status = %+v, want OK with only TotalNegativeHits 4", st)
			}
			if st := out[0]; st.Code != OK || st.Counts.TotalHits != 2 || st.Remaining != 5 {
				t.Errorf("hit's status = %+v, want OK, 2 hits, 5 left", st)
			}
			if _, over := cache.Over("d_k_r_1699999980", 10, now); over {
				t.Error("the refunded key is still in the near cache")
			}
		})
	}
}

// TestRefundOverLimitIsOK: a refund that leaves its key over the limit is
// still OK, with nothing left.
func TestRefundOverLimitIsOK(t *testing.T) {
	t.Parallel()
	lim := &rules.Limit{FullKey: "d.k", RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	l := New(results(Result{Before: 12, After: 12, Allowed: true, ResetAfter: 5 * s}), Config{})
	out := make([]Status, 1)
	ds := []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: lim, Hits: 1, Refund: true}}
	if err := l.Check(t.Context(), "d", base, ds, out); err != nil {
		t.Fatal(err)
	}
	if st := out[0]; st.Code != OK || st.Remaining != 0 || st.Counts != (Counts{TotalNegativeHits: 1}) {
		t.Errorf("refund of a key over its limit = %+v, want OK, nothing left, TotalNegativeHits 1", st)
	}
}

// TestRefundList: a refund reaches every limit of a list that applies,
// shadow limits included, and the descriptor is OK with the least left.
func TestRefundList(t *testing.T) {
	t.Parallel()
	lim := list(t, ladder+"      - {unit: second, requests_per_unit: 1, shadow_mode: true}\n")
	var got []Op
	l := New(storeFunc(func(_ context.Context, b *Batch) error {
		got = append(got, b.Ops...)
		for i := range b.Results {
			b.Results[i] = Result{Allowed: true, Remaining: uint64(9 - i), ResetAfter: time.Duration(i) * s}
		}
		return nil
	}), Config{StopIncrementWhenOverLimit: true})
	each := make([]Status, len(lim.Limits))
	ds := []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: lim, Hits: 3, Refund: true, Skip: 1 << 1, Each: each}}
	out := make([]Status, 1)
	if err := l.Check(t.Context(), "d", base, ds, out); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d ops, want 3 (the skipped limit has none): %+v", len(got), got)
	}
	for _, op := range got {
		if !op.Refund || op.Hits != 3 || op.Group != 1 {
			t.Errorf("op %+v, want a refund of 3 in group 1", op)
		}
	}
	// The shadow limit (9-2 = 7 left) never decides: the hour's, 8 left.
	if st := out[0]; st.Code != OK || st.Limit != lim.Limits[2] || st.Remaining != 8 {
		t.Errorf("descriptor = %+v, want OK decided by the hour's limit with 8 left", st)
	}
	for k, st := range each {
		want := Counts{TotalNegativeHits: 3}
		if k == 1 {
			want = Counts{}
		}
		if st.Code != OK || st.Counts != want {
			t.Errorf("limit %d: %+v, want OK, %+v", k, st, want)
		}
	}
}
