package limiter_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// TestShadowLimitNearCache: a shadow limit is never answered from the
// near cache nor put in it, so it keeps counting while the enforced limit
// beside it is answered from the cache; and with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT a request the cache refuses
// still counts in the shadow limit, as it would alone.
func TestShadowLimitNearCache(t *testing.T) {
	t.Parallel()
	cfg, err := rules.Parse([]rules.File{{Name: "d.yaml", Data: []byte(`domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 1, shadow_mode: true}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	entries := []rules.Entry{{Key: "user", Value: "a"}}
	lim := cfg.Match("d", entries).Limit
	for _, stop := range []bool{false, true} {
		mem := memory.New(memory.Config{})
		t.Cleanup(mem.Close)
		store := &countingStore{Store: mem}
		l := limiter.New(store, limiter.Config{NearCache: limiter.NewNearCache(1 << 20), StopIncrementWhenOverLimit: stop})
		now := time.Unix(1_700_000_000, 0)
		check := func(hits uint64) (limiter.Status, []limiter.Status) {
			t.Helper()
			out, each := make([]limiter.Status, 1), make([]limiter.Status, 2)
			if err := l.Check(t.Context(), "d", now, []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: hits, Each: each}}, out); err != nil {
				t.Fatal(err)
			}
			return out[0], each
		}
		var refused uint64
		for i := range 6 {
			st, each := check(1)
			if want := i >= 2; (st.Code == limiter.OverLimit) != want || st.Limit != lim.Limits[0] {
				t.Errorf("stop=%t: hit %d: %+v, want over %t decided by the enforced limit", stop, i+1, st, want)
			}
			if i >= 3 && st.Counts.OverLimitWithLocalCache != 1 {
				t.Errorf("stop=%t: hit %d: %+v, want the enforced limit answered from the near cache", stop, i+1, st)
			}
			if each[1].Counts.OverLimitWithLocalCache != 0 || each[1].Counts.TotalHits != 1 {
				t.Errorf("stop=%t: hit %d: shadow limit %+v, want counted by the store", stop, i+1, each[1])
			}
			refused += each[1].Counts.ShadowOverLimit
		}
		if refused != 5 {
			t.Errorf("stop=%t: the shadow limit would have refused %d hits, want 5", stop, refused)
		}
		// Only the shadow limit's op reaches the store once the enforced
		// key is cached: 2 ops a hit for the first 3, then 1.
		if got := store.ops.Load(); got != 3*2+3 {
			t.Errorf("stop=%t: store saw %d ops, want 9", stop, got)
		}
	}
}
