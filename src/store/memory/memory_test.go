package memory

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/storetest"
)

var _ limiter.Store = (*Store)(nil)

// base is midnight UTC.
var base = time.Unix(1_699_920_000, 0)

func newStore(t *testing.T, cfg Config) *Store {
	t.Helper()
	s := New(cfg)
	t.Cleanup(s.Close)
	return s
}

func TestSuite(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) limiter.Store {
		return newStore(t, Config{SweepInterval: -1})
	}, storetest.Options{})
}

func TestSuiteOneShard(t *testing.T) {
	t.Parallel()
	// Every key in one shard: AllOrNothing batches lock it once.
	storetest.Run(t, func(t *testing.T) limiter.Store {
		return newStore(t, Config{SweepInterval: -1, Shards: 1})
	}, storetest.Options{})
}

// clock is an injected clock for the sweeper.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func op(a rules.Algorithm, key string, limit uint64, window time.Duration, hits uint64) limiter.Op {
	return limiter.Op{Key: key, Algorithm: a, Limit: limit, Window: window, Hits: hits}
}

func do(t *testing.T, s *Store, now time.Time, ops ...limiter.Op) ([]limiter.Result, error) {
	t.Helper()
	b := &limiter.Batch{Now: now, Ops: ops, Results: make([]limiter.Result, len(ops))}
	err := s.Do(t.Context(), b)
	return b.Results, err
}

func TestSweepReclaimsIdleKeys(t *testing.T) {
	t.Parallel()
	clk := &clock{now: base}
	s := newStore(t, Config{Now: clk.Now, SweepInterval: -1})
	now := base.Add(10 * time.Second)
	for _, o := range []limiter.Op{
		op(rules.FixedWindow, "fw", 5, time.Minute, 1),       // idle at the window end: base+60s
		op(rules.SlidingWindow, "sw", 5, time.Minute, 1),     // two windows after its start: base+120s
		op(rules.SlidingLog, "sl", 5, time.Minute, 1),        // its last hit leaves: base+70s
		op(rules.TokenBucket, "tb", 60, time.Minute, 3),      // full again: base+13s
		op(rules.FixedWindow, "read", 5, time.Minute, 0),     // a read creates no key
		op(rules.SlidingLog, "refused", 0, time.Minute, 1),   // a refused op leaves an empty log
		op(rules.TokenBucket, "refused2", 0, time.Minute, 1), // and a full bucket
	} {
		if _, err := do(t, s, now, o); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Len(); got != 6 {
		t.Fatalf("Len = %d, want 6", got)
	}
	tests := []struct {
		at   time.Duration
		want int // keys left
	}{
		{12 * time.Second, 4},
		{13 * time.Second, 3},
		{60 * time.Second, 2},
		{70 * time.Second, 1},
		{119 * time.Second, 1},
		{120 * time.Second, 0},
	}
	for _, tt := range tests {
		clk.Set(base.Add(tt.at))
		s.Sweep()
		if got := s.Len(); got != tt.want {
			t.Errorf("Sweep at +%v: Len = %d, want %d", tt.at, got, tt.want)
		}
	}
}

func TestIdleKeyNotYetSweptStartsAfresh(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{SweepInterval: -1})
	o := op(rules.FixedWindow, "k", 2, time.Minute, 2)
	do(t, s, base, o)
	// The same key after its window (only a clock skew does that): a new count.
	rs, _ := do(t, s, base.Add(2*time.Minute), o)
	if rs[0].Before != 0 || !rs[0].Allowed {
		t.Errorf("reused key after its window: %+v, want a fresh count", rs[0])
	}
}

// TestAllOrNothingTakesBackANewKeyReadTwice: a refused all-or-nothing
// batch that created a key and read it again (a descriptor's own
// hits_addend 0, for the same key) takes the key back whole, and the read
// does not touch what is gone (it indexed the shard's order out of range:
// a request could make the store panic).
func TestAllOrNothingTakesBackANewKeyReadTwice(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		s := newStore(t, Config{Shards: 1, SweepInterval: -1})
		if _, err := do(t, s, base, op(a, "other", 5, time.Minute, 1)); err != nil {
			t.Fatal(err)
		}
		hit, read := op(a, "fresh", 2, time.Minute, 5), op(a, "fresh", 2, time.Minute, 0)
		b := &limiter.Batch{Now: base, Ops: []limiter.Op{hit, read}, AllOrNothing: true}
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		if b.Results[0].Allowed || b.Results[1].Remaining != 2 {
			t.Errorf("%s: results %+v, want the hit refused and the read of an unchanged key", a, b.Results)
		}
		if s.Len() != 1 {
			t.Errorf("%s: %d keys held, want only the other", a, s.Len())
		}
		rs, err := do(t, s, base, op(a, "fresh", 2, time.Minute, 1), op(a, "other", 5, time.Minute, 1))
		if err != nil || !rs[0].Allowed || rs[0].Before != 0 || rs[1].Before != 1 {
			t.Errorf("%s: after the batch: %+v, %v; want fresh new and other at 1", a, rs, err)
		}
	}
}

func TestSweeperRunsAndStops(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{SweepInterval: time.Second})
		if _, err := do(t, s, time.Now(), op(rules.FixedWindow, "k", 5, time.Second, 1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // the bubble's fake clock
		synctest.Wait()
		if got := s.Len(); got != 0 {
			t.Errorf("Len after the sweeper ran = %d, want 0", got)
		}
		s.Close()
		s.Close() // idempotent
		// synctest.Test fails if the sweeper outlives Close.
	})
}

// TestMaxKeys: at MaxKeys a new key is not refused while keys under their
// limit are left; it takes the place of the least recently used of them,
// and idle keys go first.
func TestMaxKeys(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxKeys: 3, Shards: 1, SweepInterval: -1})
	at := func(sec int) time.Time { return base.Add(time.Duration(sec) * time.Second) }
	for i := range 3 {
		if _, err := do(t, s, at(i), op(rules.FixedWindow, fmt.Sprint("k", i), 5, time.Minute, 1)); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if _, err := do(t, s, at(3), op(rules.FixedWindow, "k0", 5, time.Minute, 1)); err != nil {
		t.Fatal(err)
	}
	// k1 is now the least recently used.
	if _, err := do(t, s, at(4), op(rules.FixedWindow, "k3", 5, time.Minute, 1)); err != nil {
		t.Fatalf("a key beyond MaxKeys: %v, want it admitted", err)
	}
	if got := s.Len(); got != 3 {
		t.Errorf("Len = %d, want 3", got)
	}
	for key, want := range map[string]uint64{"k0": 2, "k1": 0, "k2": 1, "k3": 1} {
		rs, _ := do(t, s, at(5), op(rules.FixedWindow, key, 5, time.Minute, 0))
		if rs[0].Before != want {
			t.Errorf("%s holds %d hits, want %d", key, rs[0].Before, want)
		}
	}
	if got, want := s.Evictions(), (Evictions{UnderLimit: 1}); got != want {
		t.Errorf("Evictions = %+v, want %+v", got, want)
	}
	// Reads of a missing key create none.
	if _, err := do(t, s, at(5), op(rules.FixedWindow, "new", 5, time.Minute, 0)); err != nil || s.Len() != 3 {
		t.Errorf("a read when full: err %v, Len %d", err, s.Len())
	}
	// Once the window is over, the idle keys make room and nothing is lost.
	if _, err := do(t, s, at(60), op(rules.FixedWindow, "k4", 5, time.Minute, 1)); err != nil {
		t.Fatal(err)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len = %d, want 1 (the idle keys reclaimed)", got)
	}
	if got, want := s.Evictions(), (Evictions{ReclaimedIdle: 3, UnderLimit: 1}); got != want {
		t.Errorf("Evictions = %+v, want %+v", got, want)
	}
	checkStore(t, s)
}

// TestMaxKeysAllOrNothing: a batch never fails for lack of room and never
// evicts its own keys; a refused batch leaves none of its new keys.
func TestMaxKeysAllOrNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxKeys: 1, Shards: 1, SweepInterval: -1})
	if _, err := do(t, s, base, op(rules.FixedWindow, "x", 5, time.Minute, 1)); err != nil {
		t.Fatal(err)
	}
	b := &limiter.Batch{Now: base, AllOrNothing: true, Ops: []limiter.Op{
		op(rules.FixedWindow, "a", 5, time.Minute, 1),
		op(rules.SlidingLog, "b", 5, time.Minute, 1),
		op(rules.FixedWindow, "a", 5, time.Minute, 1),
	}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatalf("Do = %v, want no error at MaxKeys", err)
	}
	if b.Results[2].Before != 1 || !b.Results[1].Allowed {
		t.Errorf("results %+v: the batch lost its own keys", b.Results)
	}
	// x made room; a and b pass MaxKeys by the batch's keys.
	if got := s.Len(); got != 2 {
		t.Errorf("Len after the batch = %d, want 2", got)
	}
	checkStore(t, s)

	b = &limiter.Batch{Now: base, AllOrNothing: true, Ops: []limiter.Op{
		op(rules.TokenBucket, "c", 5, time.Minute, 1),
		op(rules.SlidingWindow, "d", 0, time.Minute, 1), // refused
	}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatalf("Do = %v, want no error", err)
	}
	if b.Results[1].Allowed {
		t.Fatalf("an op over a limit of 0 was admitted")
	}
	if got := s.Len(); got != 0 {
		t.Errorf("Len after the refused batch = %d, want 0 (a and b made room, c and d undone)", got)
	}
	checkStore(t, s)
}

func TestDoGrowsShortResults(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{SweepInterval: -1})
	b := &limiter.Batch{Now: base, Ops: []limiter.Op{op(rules.TokenBucket, "a", 5, time.Minute, 1)}}
	if err := s.Do(t.Context(), b); err != nil || len(b.Results) != 1 || !b.Results[0].Allowed {
		t.Errorf("Do with nil Results: err %v, Results %+v", err, b.Results)
	}
}

// TestMemoryReturns fills the store, lets every key go idle, sweeps, and
// requires most of the heap the keys took to be given back. It asserts on
// memory only, never on time.
func TestMemoryReturns(t *testing.T) {
	const keys = 100_000
	clk := &clock{now: base}
	s := newStore(t, Config{Now: clk.Now, SweepInterval: -1})
	before := heap()
	fill(t, s, keys)
	full := heap()
	clk.Set(base.Add(2 * time.Minute))
	if n := s.Sweep(); n != keys {
		t.Fatalf("Sweep removed %d keys, want %d", n, keys)
	}
	after := heap()
	t.Logf("%d keys: %.0f B/key live, %.0f B/key left after the sweep",
		keys, float64(full-before)/keys, float64(max(after, before)-before)/keys)
	if grown, kept := full-before, max(after, before)-before; kept > grown/4 {
		t.Errorf("after the sweep the heap keeps %d of the %d bytes the keys took, want under a quarter", kept, grown)
	}
}

// fill adds n fixed-window keys, one hit each, at base.
func fill(tb testing.TB, s *Store, n int) {
	b := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
	for i := range n {
		b.Ops[0] = op(rules.FixedWindow, fmt.Sprintf("ratelimit_domain_remote_address_10.%d.%d.%d_1699920000", i>>16, i>>8&255, i&255), 100, time.Minute, 1)
		if err := s.Do(tb.Context(), b); err != nil {
			tb.Fatal(err)
		}
	}
	if s.Len() != n {
		tb.Fatalf("Len = %d after %d distinct keys", s.Len(), n)
	}
}

// heap is the live heap after a full collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestNewKeysRemoveIdleOnes checks that a stream of new keys removes idle
// keys as it goes, without the sweeper: where every request brings a new
// key, the idle ones would otherwise pile up for a whole SweepInterval.
func TestNewKeysRemoveIdleOnes(t *testing.T) {
	t.Parallel()
	clk := &clock{now: base}
	s := newStore(t, Config{Now: clk.Now, SweepInterval: -1, Shards: 1})
	const perSecond = 2000
	now := base
	for sec := range 10 {
		for i := range perSecond {
			if _, err := do(t, s, now, op(rules.FixedWindow, fmt.Sprintf("k-%d-%d", sec, i), 5, time.Second, 1)); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(time.Second)
	}
	// 20,000 keys were made, 2,000 of them in their window: with three
	// looks per new key, about a third of those held are idle.
	if got := s.Len(); got > 2*perSecond {
		t.Errorf("Len = %d after 10 s of %d new keys a second, want at most %d (the idle ones removed as new ones come)", got, perSecond, 2*perSecond)
	}
	if got := s.Evictions().ReclaimedIdle; got == 0 {
		t.Error("no key counted as reclaimed")
	}
	clk.Set(now.Add(-time.Second / 2)) // within the last second's window
	s.Sweep()
	if got := s.Len(); got != perSecond {
		t.Errorf("Len after a sweep = %d, want %d (the last second's keys)", got, perSecond)
	}
}
