package memcached

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
)

// allocsPerDo runs b through s n times (its keys written once first) and
// returns the allocations per Do.
func allocsPerDo(t *testing.T, s *Store, b *limiter.Batch) float64 {
	t.Helper()
	ctx := t.Context()
	do := func() {
		b.Now = time.Now()
		if err := s.Do(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	do() // the keys exist and this instance wrote them in the window: incr
	return testing.AllocsPerRun(200, do)
}

// TestMemcachedAllocs bounds the allocations of the hot path, a
// fixed-window hit on keys this instance counts in already: one op (incr
// through the pipelined client), a batch of three (doCounts), and one op
// on two servers (the key's server picked as gomemcache does). Their
// requests come from a pool, and AllocsPerRun rounds down, so that a
// pooled request now and then dropped by GC does not count: the bounds are
// the counts measured.
func TestMemcachedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	sharded := newStore(t, Config{Addrs: []string{srv.Addr, harness.StartMemcached(t).Addr}})
	for _, st := range []*Store{s, sharded} {
		if err := st.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	hit := func(key string) limiter.Op {
		return limiter.Op{Key: uniqueKey(t, key), Limit: 1 << 40, Window: time.Hour, Hits: 1}
	}
	tests := []struct {
		name  string
		store *Store
		ops   []limiter.Op
		want  float64 // at most
	}{
		{"single_op", s, []limiter.Op{hit("one")}, 0},
		{"three_ops", s, []limiter.Op{hit("a"), hit("b"), hit("c")}, 0},
		{"single_op_two_servers", sharded, []limiter.Op{hit("two")}, 0},
	}
	for _, tt := range tests {
		b := &limiter.Batch{Ops: tt.ops, Results: make([]limiter.Result, len(tt.ops))}
		if got := allocsPerDo(t, tt.store, b); got > tt.want {
			t.Errorf("%s: %v allocs per Do, want at most %v", tt.name, got, tt.want)
		} else {
			t.Logf("%s: %v allocs per Do", tt.name, got)
		}
	}
}
