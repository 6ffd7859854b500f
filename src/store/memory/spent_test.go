package memory

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// spentOp is the op of the i-th client spent before a flood: each
// algorithm, a limit of 3 an hour, spent three ways (three admitted hits
// leaving Remaining 0, one hits_addend of 3, that and one of 1000 refused).
func spentOp(i int, hits uint64) limiter.Op {
	a := rules.Algorithms[i%len(rules.Algorithms)]
	return op(a, fmt.Sprintf("spent_%s_%04d", a, i), 3, time.Hour, hits)
}

// spend puts the i-th spent client over its limit at now.
func spend(t *testing.T, s *Store, now time.Time, i int) {
	t.Helper()
	var hits []uint64
	switch i / len(rules.Algorithms) % 3 {
	case 0:
		hits = []uint64{1, 1, 1}
	case 1:
		hits = []uint64{3}
	default:
		hits = []uint64{3, 1000}
	}
	for _, h := range hits {
		if _, err := do(t, s, now, spentOp(i, h)); err != nil {
			t.Fatalf("spending %s: %v", spentOp(i, h).Key, err)
		}
	}
	if rs, _ := do(t, s, now, spentOp(i, 0)); rs[0].Remaining != 0 {
		t.Fatalf("%s: %+v after spending it, want Remaining 0", spentOp(i, 0).Key, rs[0])
	}
}

// TestSpentKeysOutliveAnyFlood is issue 24's first case: no flood of new
// keys, of any shape, gives a client over its limit a new limit before its
// window ends. The shapes: new values of a limit-1 rule (each one over its
// limit after one admitted hit), new values of the spent clients' own rule
// (three hits each), and hits_addend above the limit on every algorithm.
// When the store holds nothing but keys over their limit, it folds them
// into their rules' filters and refuses nothing (issue 36); once the
// window is over everyone starts afresh.
func TestSpentKeysOutliveAnyFlood(t *testing.T) {
	t.Parallel()
	const spentClients = 120
	tests := []struct {
		name  string
		flood func(i int) []limiter.Op
	}{
		{"limit_1_rule", func(i int) []limiter.Op {
			return []limiter.Op{op(rules.FixedWindow, fmt.Sprintf("one_%08d", i), 1, time.Hour, 1)}
		}},
		{"own_rule", func(i int) []limiter.Op {
			o := spentOp(i, 1)
			o.Key = fmt.Sprintf("flood_%s_%08d", o.Algorithm, i)
			return []limiter.Op{o, o, o}
		}},
		{"hits_addend", func(i int) []limiter.Op {
			o := spentOp(i, 1+uint64(i%3)*limiter.MaxHits/2)
			o.Key = fmt.Sprintf("addend_%s_%08d", o.Algorithm, i)
			return []limiter.Op{o}
		}},
		{"large_values", func(i int) []limiter.Op {
			return []limiter.Op{op(rules.TokenBucket, fmt.Sprintf("large_%08d_%04000d", i, i), 1, time.Hour, 1)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const maxBytes = 256 << 10
			s := newStore(t, Config{MaxBytes: maxBytes, SweepInterval: -1})
			now := base
			for i := range spentClients {
				spend(t, s, now, i)
			}
			var largest int64 // the largest key a shard may take past the ceiling
			for i := range 30_000 {
				now = now.Add(100 * time.Microsecond) // 3 s in all
				for _, o := range tt.flood(i) {
					largest = max(largest, allocBytes(len(o.Key))+entryBytes+logBytes+ringBytes(3)+slotBytes)
					if _, err := do(t, s, now, o); err != nil {
						t.Fatalf("flood op %d: %v, want an answer", i, err)
					}
				}
				// A 32nd above the ceiling (a new filter), and a key a shard.
				if got, bound := s.Bytes(), maxBytes+maxBytes/32+int64(len(s.shards))*largest; got > bound {
					t.Fatalf("after %d flood keys: Bytes = %d, above %d", i, got, bound)
				}
			}
			for i := range spentClients {
				o := spentOp(i, 1)
				rs, err := do(t, s, now, o)
				if err != nil || rs[0].Allowed || rs[0].Remaining != 0 {
					t.Errorf("%s after the flood: %+v, %v; want refused with Remaining 0", o.Key, rs[0], err)
				}
			}
			ev := s.Evictions()
			t.Logf("%d keys (%d compact), %d bytes; %+v", s.Len(), s.Records(), s.Bytes(), ev)
			if ev.Folded == 0 {
				t.Errorf("Evictions %+v, want keys folded", ev)
			}
			checkStore(t, s)

			// The window over, the spent clients start afresh, and so
			// does a new key.
			now = base.Add(2 * time.Hour)
			for i := range spentClients {
				o := spentOp(i, 1)
				if rs, err := do(t, s, now, o); err != nil || !rs[0].Allowed {
					t.Errorf("%s after its window: %+v, %v; want admitted", o.Key, rs[0], err)
				}
			}
			if rs, err := do(t, s, now, tt.flood(3_000_000)...); err != nil || !rs[0].Allowed {
				t.Errorf("a new key after the window: %+v, %v; want admitted", rs, err)
			}
			checkStore(t, s)
		})
	}
}

// compactAll turns every entry of s into a record, as a ceiling would.
func compactAll(s *Store) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for len(sh.order) > 0 {
			s.compact(sh, sh.order[0])
		}
		sh.mu.Unlock()
	}
}

// TestRecordsAreExact: a key kept as a record answers every later op as
// its entry would have, for fixed_window, sliding_window and
// token_bucket. A sliding log's record never admits more than its limit
// in a window (what it admits, an exact log admits too), and admits again
// once its newest hit has left the window.
func TestRecordsAreExact(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			// Spent as spentTwins says, then a hit every 7 min for three
			// hours, with the key compacted before every op.
			want, got, o := spentTwins(t, a)
			newest := base.Add(30 * time.Minute)
			for at := 31 * time.Minute; at < 3*time.Hour; at += 7 * time.Minute {
				compactAll(got)
				if got.Records() != 1 {
					t.Fatalf("+%v: %d records, want the key compacted", at, got.Records())
				}
				o.Hits = 1 + uint64(at/time.Minute)%2
				g, err := do(t, got, base.Add(at), o)
				if err != nil {
					t.Fatal(err)
				}
				if a != rules.SlidingLog {
					if w, _ := do(t, want, base.Add(at), o); g[0] != w[0] {
						t.Errorf("+%v, %d hits: %+v from the record, %+v from the entry", at, o.Hits, g[0], w[0])
					}
					continue
				}
				// The exact log sees only what the record admitted.
				switch {
				case g[0].Allowed:
					if w, _ := do(t, want, base.Add(at), o); !w[0].Allowed {
						t.Errorf("+%v, %d hits: the record admitted what the log refuses: %+v, %+v", at, o.Hits, g[0], w[0])
					}
					newest = base.Add(at)
				case !base.Add(at).Before(newest.Add(time.Hour)):
					t.Errorf("+%v, %d hits: refused %v after the newest hit left the window: %+v", at, o.Hits, base.Add(at).Sub(newest.Add(time.Hour)), g[0])
				}
			}
			checkStore(t, got)
		})
	}
}

// spentTwins returns two stores holding the same key of algorithm a over
// its limit of 5 an hour (2 hits at +0, +10, +30 and +30 min), and its op,
// for the tests that compare a store that compacts or folds the key with
// one that keeps its entry.
func spentTwins(t *testing.T, a rules.Algorithm) (want, got *Store, o limiter.Op) {
	t.Helper()
	want = newStore(t, Config{MaxBytes: -1, SweepInterval: -1})
	got = newStore(t, Config{MaxBytes: -1, SweepInterval: -1})
	o = op(a, "k_"+a.String(), 5, time.Hour, 2)
	o.Rule = "d.k"
	for _, at := range []time.Duration{0, 10 * time.Minute, 30 * time.Minute, 30 * time.Minute} {
		do(t, want, base.Add(at), o)
		do(t, got, base.Add(at), o)
	}
	return want, got, o
}

// spentKey is a key long enough that a record saves most of its entry.
func spentKey(i int) string { return fmt.Sprintf("spent_%04d_%0200d", i, i) }

// TestSpentKeysOutliveConcurrentFlood floods a small store from several
// goroutines with new keys over their limit of two rules at once, single
// ops and AllOrNothing batches, under -race, so that keys are compacted and
// folded into both rules' filters while others are looked up: no error,
// consistent bookkeeping, and every spent client still refused.
func TestSpentKeysOutliveConcurrentFlood(t *testing.T) {
	t.Parallel()
	const maxBytes, shards = 64 << 10, 4
	s := newStore(t, Config{MaxBytes: maxBytes, Shards: shards, SweepInterval: -1})
	for i := range 40 {
		spend(t, s, base, i)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			now := base
			for i := range 2000 {
				now = now.Add(time.Millisecond)
				ops := []limiter.Op{
					ruleOp(fmt.Sprint("d.flood_", g%2), rules.FixedWindow, fmt.Sprintf("flood_%d_%06d_%080d", g, i, i), 1, time.Hour, 1),
					spentOp(i%40, 1),
				}
				b := &limiter.Batch{Now: now, Ops: ops, AllOrNothing: i%2 == 0}
				if err := s.Do(t.Context(), b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	checkStore(t, s)
	for i := range 40 {
		if rs, err := do(t, s, base.Add(10*time.Second), spentOp(i, 1)); err != nil || rs[0].Allowed {
			t.Errorf("%s after the flood: %+v, %v; want refused", spentOp(i, 1).Key, rs[0], err)
		}
	}
	t.Logf("%d keys (%d records), %d bytes, %+v", s.Len(), s.Records(), s.Bytes(), s.Evictions())
}

// TestRecordAccountingCoversTheHeap calibrates recordBytes: keys over
// their limit, compacted, must take no more of the live heap than Bytes
// says. A map of records is 7/16 to 7/8 full, so Bytes, charging the
// emptiest, may say up to twice what they take; 115,000 records (449 a
// shard on average) are near the emptiest, 100,000 near the fullest.
func TestRecordAccountingCoversTheHeap(t *testing.T) {
	for _, keys := range []int{100_000, 115_000} {
		t.Run(fmt.Sprint(keys), func(t *testing.T) {
			s := New(Config{MaxBytes: -1, SweepInterval: -1, Now: func() time.Time { return base }})
			defer s.Close()
			before := heap()
			b := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
			for i := range keys {
				b.Ops[0] = op(rules.Algorithms[i%4], fmt.Sprintf("rl_d_user_%d_60_x", i), 1, time.Minute, 1)
				if err := s.Do(t.Context(), b); err != nil {
					t.Fatal(err)
				}
			}
			b.Ops[0] = limiter.Op{}
			compactAll(s)
			s.Sweep() // nothing is idle; the emptied maps of entries are rebuilt
			real := int64(heap() - before)
			acc := s.Bytes()
			t.Logf("%d records: %d B/record live, %d B/record accounted (%.2f×)", s.Records(), real/int64(keys), acc/int64(keys), float64(acc)/float64(real))
			if s.Records() != keys || acc < real || float64(acc) > 2.1*float64(real) {
				t.Errorf("%d records: Bytes = %d for a live heap of %d, want 1 to 2.1 times it", s.Records(), acc, real)
			}
		})
	}
}
