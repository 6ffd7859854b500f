package limiter_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// countingStore counts the ops that reach the store.
type countingStore struct {
	limiter.Store
	ops atomic.Int64
}

func (s *countingStore) Do(ctx context.Context, b *limiter.Batch) error {
	s.ops.Add(int64(len(b.Ops)))
	return s.Store.Do(ctx, b)
}

func TestNearCacheAnswersKnownOverLimitKeys(t *testing.T) {
	mem := memory.New(memory.Config{})
	t.Cleanup(mem.Close)
	store := &countingStore{Store: mem}
	l := limiter.New(store, limiter.Config{NearCache: limiter.NewNearCache(1 << 20)})
	now := time.Unix(1_700_000_000, 0) // the start of a minute window plus 20 s
	entries := []rules.Entry{{Key: "user", Value: "a"}}
	lim := &rules.Limit{FullKey: "d.user", RequestsPerUnit: 2, Unit: rules.Minute, UnitMultiplier: 1}
	check := func(l *limiter.Limiter, lim *rules.Limit) limiter.Status {
		t.Helper()
		out := make([]limiter.Status, 1)
		if err := l.Check(t.Context(), "d", now, []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for range 3 {
		check(l, lim)
	}
	if store.ops.Load() != 3 {
		t.Fatalf("store saw %d ops, want 3", store.ops.Load())
	}
	st := check(l, lim)
	if st.Code != limiter.OverLimit || st.Counts.OverLimitWithLocalCache != 1 || st.Counts.OverLimit != 1 {
		t.Errorf("4th check = %+v, want OverLimit answered from the near cache", st)
	}
	if store.ops.Load() != 3 {
		t.Errorf("store saw %d ops, want the 4th answered without it", store.ops.Load())
	}
	if want := 40 * time.Second; st.ResetAfter != want {
		t.Errorf("ResetAfter = %v, want %v (the window end)", st.ResetAfter, want)
	}

	// The same descriptor with a higher per-request limit is not answered
	// from the entry of the lower one (envoyproxy/ratelimit #1077).
	higher := *lim
	higher.RequestsPerUnit = 100
	if st := check(l, &higher); st.Code != limiter.OK {
		t.Errorf("with limit 100: %+v, want OK from the store", st)
	}
	if store.ops.Load() != 4 {
		t.Errorf("store saw %d ops, want the override to reach it", store.ops.Load())
	}

	// Shadow-mode rules are never cached: they keep answering OK.
	shadow := *lim
	shadow.ShadowMode = true
	shadow.FullKey = "d.shadow"
	entries = []rules.Entry{{Key: "shadow", Value: "a"}}
	for i := range 5 {
		if st := check(l, &shadow); st.Code != limiter.OK || st.Counts.OverLimitWithLocalCache != 0 {
			t.Errorf("shadow check %d = %+v, want OK from the store", i, st)
		}
	}
}

// TestRefundReachesPastNearCache: a key the near cache knows over its
// limit is refunded in the store all the same, and the next request is
// decided by the store again, which has room.
func TestRefundReachesPastNearCache(t *testing.T) {
	mem := memory.New(memory.Config{})
	t.Cleanup(mem.Close)
	store := &countingStore{Store: mem}
	l := limiter.New(store, limiter.Config{NearCache: limiter.NewNearCache(1 << 20)})
	now := time.Unix(1_700_000_000, 0)
	lim := &rules.Limit{FullKey: "d.user", RequestsPerUnit: 5, Unit: rules.Minute, UnitMultiplier: 1}
	check := func(hits uint64, refund bool) limiter.Status {
		t.Helper()
		out := make([]limiter.Status, 1)
		d := limiter.Descriptor{Entries: []rules.Entry{{Key: "user", Value: "a"}}, Limit: lim, Hits: hits, Refund: refund}
		if err := l.Check(t.Context(), "d", now, []limiter.Descriptor{d}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	check(5, false)                                          // reserve the whole limit
	if st := check(1, false); st.Code != limiter.OverLimit { // now in the near cache
		t.Fatalf("6th hit = %+v, want OverLimit", st)
	}
	if st := check(1, false); st.Counts.OverLimitWithLocalCache != 1 {
		t.Fatalf("7th hit = %+v, want answered from the near cache", st)
	}
	// A refund of 0 is a read: it frees nothing, and the key stays known.
	if st := check(0, true); st.Code != limiter.OK || st.Remaining != 0 {
		t.Errorf("refund of 0 = %+v, want OK with nothing left", st)
	}
	if st := check(1, false); st.Counts.OverLimitWithLocalCache != 1 {
		t.Errorf("hit after a refund of 0 = %+v, want answered from the near cache", st)
	}
	ops := store.ops.Load()
	// The store counted the hit it refused (6 in use), not the one the
	// near cache answered.
	if st := check(4, true); st.Code != limiter.OK || st.Remaining != 3 {
		t.Errorf("refund of 4 = %+v, want OK with 3 left", st)
	}
	if got := store.ops.Load(); got != ops+1 {
		t.Errorf("the refund made %d store ops, want 1", got-ops)
	}
	if st := check(3, false); st.Code != limiter.OK || st.Counts.OverLimitWithLocalCache != 0 {
		t.Errorf("hit of 3 after the refund = %+v, want OK from the store", st)
	}
	if got := store.ops.Load(); got != ops+2 {
		t.Errorf("the hit after the refund made %d store ops, want 1", got-ops-1)
	}
}
