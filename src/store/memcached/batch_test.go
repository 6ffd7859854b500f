package memcached

import (
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
)

// TestCountBatchFallbacks runs a batch of fixed-window ops (doCounts)
// whose first commands miss: keys another instance created (add answers
// "not stored", then incr) and keys gone from memcached since this
// instance wrote them (incr misses, then add). Every hit is counted once.
func TestCountBatchFallbacks(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	a := newStore(t, Config{Addrs: []string{srv.Addr}})
	b := newStore(t, Config{Addrs: []string{srv.Addr}})
	now := time.Now()
	ops := []limiter.Op{
		{Key: uniqueKey(t, "x"), Limit: 10, Window: time.Hour, Hits: 1},
		{Key: uniqueKey(t, "y"), Limit: 10, Window: time.Hour, Hits: 2},
		{Key: uniqueKey(t, "z"), Limit: 10, Window: time.Hour, Hits: 3},
	}
	check := func(what string, r []limiter.Result, before uint64) {
		t.Helper()
		for i := range r {
			if want := before*ops[i].Hits + ops[i].Hits; r[i].After != want || !r[i].Allowed {
				t.Errorf("%s: op %d: %+v, want admitted to %d", what, i, r[i], want)
			}
		}
	}
	check("a creates", do(t, a, false, now, ops...), 0)
	check("b adds, not stored, incr", do(t, b, false, now, ops...), 1)
	check("a incr", do(t, a, false, now, ops...), 2)
	if err := memcache.New(srv.Addr).DeleteAll(); err != nil {
		t.Fatal(err)
	}
	check("a incr misses, add", do(t, a, false, now, ops...), 0)
	st := a.OpStats()
	if st.IncrementMiss != 3 || st.AddSuccess != 6 {
		t.Errorf("OpStats() = %+v, want 3 incr misses and 6 adds", st)
	}
}
