package writebehind

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memory"
	"github.com/ratelimitd/ratelimit/storetest"
)

var _ limiter.Store = (*Store)(nil)

// t0 is the start of a minute.
var t0 = time.Unix(1_699_920_000, 0)

// newLocal is a memory store that sweeps only when told.
func newLocal(tb testing.TB) *memory.Store {
	m := memory.New(memory.Config{SweepInterval: -1})
	tb.Cleanup(m.Close)
	return m
}

// newWB is a Store on shared with a local memory store of its own, flushed
// only when the test calls Flush.
func newWB(t *testing.T, shared limiter.Store, cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return t0 }
	}
	s := New(shared, newLocal(t), cfg)
	t.Cleanup(s.Close)
	return s
}

// fixed is a fixed-window op of limit a minute on key, one hit.
func fixed(key string, limit uint64) limiter.Op {
	return limiter.Op{Key: key, Algorithm: rules.FixedWindow, Limit: limit, Window: time.Minute, Hits: 1}
}

// hit sends ops at t0 and reports whether the first was allowed.
func hit(t *testing.T, s limiter.Store, ops ...limiter.Op) bool {
	t.Helper()
	b := &limiter.Batch{Now: t0, Ops: ops}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatalf("Do(%+v): %v", ops, err)
	}
	return b.Results[0].Allowed
}

// count reads key's count in s.
func count(t *testing.T, s limiter.Store, key string) uint64 {
	t.Helper()
	op := fixed(key, 1000)
	op.Hits = 0
	b := &limiter.Batch{Now: t0, Ops: []limiter.Op{op}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatalf("read %q: %v", key, err)
	}
	return b.Results[0].After
}

// failing is a shared store that fails as unreachable while down is set.
type failing struct {
	limiter.Store
	down atomic.Bool
}

func (f *failing) Do(ctx context.Context, b *limiter.Batch) error {
	if f.down.Load() {
		return fmt.Errorf("test: %w", limiter.ErrUnavailable)
	}
	return f.Store.Do(ctx, b)
}

// TestLocalSemantics: the local decisions keep the limiter's contract for
// fixed windows (shadow ops, groups, refunds, AllOrNothing).
func TestLocalSemantics(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) limiter.Store {
		return newWB(t, newLocal(t), Config{})
	}, storetest.Options{Algorithms: []rules.Algorithm{rules.FixedWindow}})
}

// TestFoldsTheFleetCount: each instance sees the others' hits after a
// flush, and the shared store holds every hit, refunds taken off.
func TestFoldsTheFleetCount(t *testing.T) {
	t.Parallel()
	shared := newLocal(t)
	a, b := newWB(t, shared, Config{}), newWB(t, shared, Config{})
	for range 3 {
		hit(t, a, fixed("k", 10))
	}
	for range 4 {
		hit(t, b, fixed("k", 10))
	}
	if got := count(t, shared, "k"); got != 0 {
		t.Fatalf("shared count before a flush = %d, want 0", got)
	}
	a.Flush(t.Context())
	b.Flush(t.Context())
	if got := count(t, shared, "k"); got != 7 {
		t.Errorf("shared count = %d, want 7", got)
	}
	if got := count(t, b, "k"); got != 7 {
		t.Errorf("b's view = %d, want 7 (its 4 and a's 3)", got)
	}
	hit(t, a, fixed("k", 10))
	refund := fixed("k", 10)
	refund.Hits, refund.Refund = 2, true
	hit(t, a, refund)
	a.Flush(t.Context())
	if got := count(t, shared, "k"); got != 6 {
		t.Errorf("shared count after a hit and a refund of 2 = %d, want 6", got)
	}
	if got := count(t, a, "k"); got != 6 {
		t.Errorf("a's view = %d, want 6", got)
	}
	if st := a.Stats(); st.Batches != 2 || st.Keys != 1 {
		t.Errorf("a.Stats() = %+v, want 2 batches, 1 key", st)
	}
}

// TestAllOrNothingRefusedSendsNothing: a refused AllOrNothing batch
// recorded nothing locally, so nothing is flushed; its allowed shadow op is.
func TestAllOrNothingRefusedSendsNothing(t *testing.T) {
	t.Parallel()
	shared := newLocal(t)
	s := newWB(t, shared, Config{})
	shadow := fixed("shadow", 10)
	shadow.Shadow = true
	b := &limiter.Batch{Now: t0, AllOrNothing: true, Ops: []limiter.Op{fixed("ok", 10), fixed("zero", 0), shadow}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	s.Flush(t.Context())
	for key, want := range map[string]uint64{"ok": 0, "zero": 0, "shadow": 1} {
		if got := count(t, shared, key); got != want {
			t.Errorf("shared count of %q = %d, want %d", key, got, want)
		}
	}
}

// TestBoundOnOneStore: three instances offered 3 × 10 hits an interval on
// one key of limit 100 admit at least 100 and at most 100 + 2 × 10.
func TestBoundOnOneStore(t *testing.T) {
	t.Parallel()
	shared := newLocal(t)
	checkBound(t, shared, func() *Store { return newWB(t, shared, Config{}) }, "k")
}

// checkBound offers 3 instances on shared 10 hits each per interval on
// each of keys (a limit of 100), 20 intervals, from a goroutine each, and
// checks each key's admitted total against the bound; the flushes carry
// every key in one batch.
func checkBound(t *testing.T, shared limiter.Store, mk func() *Store, keys ...string) {
	t.Helper()
	checkFleet(t, shared, []limiter.Store{mk(), mk(), mk()}, keys...)
}

// checkFleet offers each instance of fleet 10 hits per interval on each of
// keys (a limit of 100), 20 intervals, from a goroutine each, and checks
// each key's admitted total against the bound: the limit plus an
// interval's hits of every instance writing behind (a *Store) but one, or
// of every one when some instance counts in shared at once.
func checkFleet(t *testing.T, shared limiter.Store, fleet []limiter.Store, keys ...string) {
	t.Helper()
	const perInterval, limit, intervals = 10, 100, 20
	var behind []*Store
	for _, s := range fleet {
		if wb, ok := s.(*Store); ok {
			behind = append(behind, wb)
		}
	}
	unseen := len(behind) - 1
	if len(behind) < len(fleet) {
		unseen = len(behind)
	}
	admitted := make([]atomic.Int64, len(keys))
	run := func(n int, f func(i int)) {
		done := make(chan struct{}, n)
		for i := range n {
			go func() {
				defer func() { done <- struct{}{} }()
				f(i)
			}()
		}
		for range n {
			<-done
		}
	}
	for range intervals {
		run(len(fleet), func(i int) {
			for range perInterval {
				for k, key := range keys {
					b := &limiter.Batch{Now: t0, Ops: []limiter.Op{fixed(key, limit)}}
					if err := fleet[i].Do(context.Background(), b); err != nil {
						t.Error(err)
						return
					}
					if b.Results[0].Allowed {
						admitted[k].Add(1)
					}
				}
			}
		})
		run(len(behind), func(i int) { behind[i].Flush(context.Background()) })
	}
	offered := len(fleet) * perInterval * intervals
	bound := int64(limit + unseen*perInterval)
	for k, key := range keys {
		got := admitted[k].Load()
		if got < limit || got > bound {
			t.Errorf("%s: admitted %d of %d offered, want %d..%d", key, got, offered, limit, bound)
		}
		if c := count(t, shared, key); c != uint64(offered) {
			t.Errorf("%s: shared count = %d, want every hit offered: %d", key, c, offered)
		}
		t.Logf("%s: admitted %d, limit %d, bound %d", key, got, limit, bound)
	}
}

// TestOutageKeepsHits: with the shared store unreachable, decisions stay
// local and counted, the hits stay pending, and the next flush after the
// store returns merges them.
func TestOutageKeepsHits(t *testing.T) {
	t.Parallel()
	shared := &failing{Store: newLocal(t)}
	s := newWB(t, shared, Config{})
	hit(t, s, fixed("k", 10))
	shared.down.Store(true)
	s.Flush(t.Context())
	for range 3 {
		hit(t, s, fixed("k", 10))
	}
	s.Flush(t.Context())
	if st := s.Stats(); st.LocalOnly != 3 || st.Dropped != 0 {
		t.Errorf("Stats() in the outage = %+v, want 3 local-only decisions, none dropped", st)
	}
	shared.down.Store(false)
	s.Flush(t.Context())
	if got := count(t, shared, "k"); got != 4 {
		t.Errorf("shared count after the outage = %d, want 4", got)
	}
	hit(t, s, fixed("k", 10))
	if st := s.Stats(); st.LocalOnly != 3 {
		t.Errorf("LocalOnly = %d after the store returned, want 3", st.LocalOnly)
	}
}

// TestMaxKeys: past MaxKeys a new key is decided by the shared store; with
// the shared store unreachable its hits are decided locally and dropped.
func TestMaxKeys(t *testing.T) {
	t.Parallel()
	shared := &failing{Store: newLocal(t)}
	s := newWB(t, shared, Config{MaxKeys: 2})
	hit(t, s, fixed("a", 10))
	hit(t, s, fixed("b", 10))
	hit(t, s, fixed("c", 10))
	if got := count(t, shared, "c"); got != 1 {
		t.Errorf("shared count of the third key = %d, want 1 (decided there)", got)
	}
	if got := s.Stats().Keys; got != 2 {
		t.Errorf("keys tracked = %d, want 2", got)
	}
	shared.down.Store(true)
	hit(t, s, fixed("d", 10), fixed("a", 10))
	if st := s.Stats(); st.Dropped != 1 || st.Keys != 2 || st.LocalOnly != 1 {
		t.Errorf("Stats() = %+v, want 1 hit dropped, 2 keys, 1 local-only decision", st)
	}
	shared.down.Store(false)
	s.Flush(t.Context())
	if got := count(t, shared, "a"); got != 2 {
		t.Errorf("shared count of a tracked key = %d, want 2", got)
	}
}

// TestEndedWindowsForgotten: a key whose window ended is forgotten at the
// next flush, its pending hits unsent.
func TestEndedWindowsForgotten(t *testing.T) {
	t.Parallel()
	now := t0
	shared := newLocal(t)
	s := newWB(t, shared, Config{Now: func() time.Time { return now }})
	hit(t, s, fixed("k", 10))
	now = t0.Add(time.Minute)
	s.Flush(t.Context())
	if st := s.Stats(); st.Keys != 0 || st.Batches != 0 {
		t.Errorf("Stats() = %+v, want no key, no batch", st)
	}
}

// during is a shared store that runs f inside each Do, as if requests came
// while a flush waits for the store.
type during struct {
	limiter.Store
	f func()
}

func (d *during) Do(ctx context.Context, b *limiter.Batch) error {
	d.f()
	return d.Store.Do(ctx, b)
}

// TestFoldKeepsHitsDuringFlush: hits made while a flush waits for the
// store stay in the local count on top of the fleet's count it answers.
func TestFoldKeepsHitsDuringFlush(t *testing.T) {
	t.Parallel()
	shared := newLocal(t)
	other := newWB(t, shared, Config{})
	for range 5 {
		hit(t, other, fixed("k", 100))
	}
	other.Flush(t.Context())
	hook := &during{Store: shared, f: func() {}}
	s := newWB(t, hook, Config{})
	for range 3 {
		hit(t, s, fixed("k", 100))
	}
	hook.f = func() {
		hook.f = func() {}
		hit(t, s, fixed("k", 100))
		hit(t, s, fixed("k", 100))
	}
	s.Flush(t.Context())
	if got := count(t, s, "k"); got != 10 {
		t.Errorf("local count = %d, want 10: the fleet's 8 and the 2 hits made during the flush", got)
	}
}

// TestEachBatchHasTheTimeout: a flush of three batches, each taking most
// of the timeout, sends them all: the timeout bounds a batch, not the
// flush.
func TestEachBatchHasTheTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		shared := newLocal(t)
		slow := &during{Store: shared, f: func() { time.Sleep(30 * time.Millisecond) }}
		s := newWB(t, slow, Config{Timeout: 50 * time.Millisecond})
		for i := range 2*chunk + 1 {
			hit(t, s, fixed(fmt.Sprint("k", i), 10))
		}
		s.Flush(t.Context())
		if st := s.Stats(); st.Batches != 3 || count(t, shared, fmt.Sprint("k", 2*chunk)) != 1 {
			t.Errorf("Stats() = %+v, want 3 batches sent, the last one's key counted", st)
		}
		s.Close()
	})
}

// TestOtherAlgorithmsExact: an op of another algorithm is decided by the
// shared store; with it unreachable, locally, its hits dropped, never
// sent as a fixed window's.
func TestOtherAlgorithmsExact(t *testing.T) {
	t.Parallel()
	shared := &failing{Store: newLocal(t)}
	s := newWB(t, shared, Config{})
	bucket := limiter.Op{Key: "tb", Algorithm: rules.TokenBucket, Limit: 10, Window: time.Minute, Hits: 3}
	hit(t, s, bucket)
	read := bucket
	read.Hits = 0
	b := &limiter.Batch{Now: t0, Ops: []limiter.Op{read}}
	if err := shared.Do(t.Context(), b); err != nil || b.Results[0].After != 3 {
		t.Errorf("the shared store's token bucket after 3 hits: %+v, %v; want 3 in use", b.Results[0], err)
	}
	shared.down.Store(true)
	hit(t, s, bucket)
	shared.down.Store(false)
	s.Flush(t.Context())
	if st := s.Stats(); st.Dropped != 3 || st.Keys != 0 || st.Batches != 0 {
		t.Errorf("Stats() = %+v, want the 3 hits decided locally dropped, nothing tracked or sent", st)
	}
}

// TestFlushNeverBlocksADecision: while a flush waits for the shared store,
// decisions on the keys it carries go on. A decision that waited for the
// flush would wait until the flush is released, which only the decisions'
// end does here: the test fails after its bound instead (a bound on a
// hang, far above what 100 decisions take, never on their pace).
func TestFlushNeverBlocksADecision(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := &during{Store: newLocal(t), f: func() {
		once.Do(func() {
			close(entered)
			<-release
		})
	}}
	s := newWB(t, hook, Config{})
	hit(t, s, fixed("k", 1000))
	flushed := make(chan struct{})
	go func() {
		s.Flush(context.Background())
		close(flushed)
	}()
	<-entered
	decided := make(chan error, 1)
	go func() {
		b := &limiter.Batch{Now: t0, Ops: []limiter.Op{fixed("k", 1000)}}
		for range 100 {
			if err := s.Do(context.Background(), b); err != nil {
				decided <- err
				return
			}
		}
		decided <- nil
	}()
	select {
	case err := <-decided:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("decisions still wait 30 s after a flush began waiting for the shared store")
	}
	close(release)
	<-flushed
	if got := count(t, s, "k"); got != 101 {
		t.Errorf("local count = %d, want 101", got)
	}
}

// TestPendingSaturates: a key's unflushed sum stays within ±maxPending
// whatever hits_addend piles onto it.
func TestPendingSaturates(t *testing.T) {
	var e entry
	for _, d := range []int64{maxPending, limiter.MaxHits, limiter.MaxHits} {
		e.addPending(d)
	}
	if got := e.pending.Load(); got != maxPending {
		t.Errorf("pending = %d, want %d", got, int64(maxPending))
	}
	for _, d := range []int64{-maxPending, -maxPending, -maxPending, -limiter.MaxHits} {
		e.addPending(d)
	}
	if got := e.pending.Load(); got != -maxPending {
		t.Errorf("pending = %d, want %d", got, -int64(maxPending))
	}
}

// huge is a shared store whose every answer says the key holds the
// largest count a reply can carry.
type huge struct{}

func (huge) Do(_ context.Context, b *limiter.Batch) error {
	b.Results = b.Results[:len(b.Ops)]
	for i := range b.Ops {
		b.Results[i] = limiter.Result{Before: math.MaxUint64, After: math.MaxUint64}
	}
	return nil
}

// hitsBound is a local store that fails an op of more than
// limiter.MaxHits, the most the limiter's contract lets an op carry.
type hitsBound struct{ limiter.Store }

func (h hitsBound) Do(ctx context.Context, b *limiter.Batch) error {
	for _, op := range b.Ops {
		if op.Hits > limiter.MaxHits {
			return fmt.Errorf("op of %d hits, more than MaxHits", op.Hits)
		}
	}
	return h.Store.Do(ctx, b)
}

// TestFoldBoundsTheStoresCount: a store that answers a count past any
// range (its reply is not ours to trust) folds in as ops the limiter's
// contract allows, the key over its limit, and the next flush too.
func TestFoldBoundsTheStoresCount(t *testing.T) {
	s := New(huge{}, hitsBound{newLocal(t)}, Config{Now: func() time.Time { return t0 }})
	t.Cleanup(s.Close)
	for range 2 {
		hit(t, s, fixed("k", 1000))
		s.Flush(t.Context())
		if st := s.Stats(); st.Dropped != 0 {
			t.Fatalf("Stats() = %+v, want nothing dropped", st)
		}
		if got := count(t, s, "k"); got < 1000 {
			t.Fatalf("local count %d after the store said the key is full, want over the limit", got)
		}
	}
	if hit(t, s, fixed("k", 1000)) {
		t.Error("a hit on a key the store says is full was allowed")
	}
}
