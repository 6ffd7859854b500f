package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// TestStoreAllocs guards the allocations of the Redis store's hot path
// (Store.Do on one redis-server, go-redis included) per algorithm, for a
// one-op request and for a batch of three ops (three descriptors of one
// request), plus a group (one descriptor's three limits) and an
// AllOrNothing batch, which take decideLua. The bounds are the counts
// measured when the test was written: a change that adds an allocation
// fails it, and one that removes some should lower them.
func TestStoreAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	srv := storetest.StartRedis(t, storetest.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Allocations per Do, the same for every algorithm: per op its key's
	// copy and its go-redis command (a fixed window's INCRBY and EXPIRE
	// count as one op's), and per round trip about ten in the worker
	// (go-redis's pipeline execution and reply parsing, the wake-up). One
	// request at a time here; under load a round trip carries many
	// requests and its share per op falls (BenchmarkStore: 3 per op).
	bounds := struct{ one, three, group, aon float64 }{one: 14, three: 20, group: 16, aon: 16}
	for _, alg := range rules.Algorithms {
		want := bounds
		ops := func(n int, group uint32) []limiter.Op {
			o := make([]limiter.Op, n)
			for i := range o {
				o[i] = limiter.Op{Key: fmt.Sprintf("allocs_%s_%d_%d", alg, group, i), Algorithm: alg,
					Limit: 1 << 40, Window: time.Hour, Hits: 1, Group: group}
			}
			return o
		}
		for _, tt := range []struct {
			name  string
			b     *limiter.Batch
			bound float64
		}{
			{"one_op", &limiter.Batch{Ops: ops(1, 0)}, want.one},
			{"three_ops", &limiter.Batch{Ops: ops(3, 0)}, want.three},
			{"group_of_three", &limiter.Batch{Ops: ops(3, 7)}, want.group},
			{"all_or_nothing_three", &limiter.Batch{Ops: ops(3, 0), AllOrNothing: true}, want.aon},
		} {
			ctx := t.Context()
			do := func() {
				tt.b.Now = time.Now()
				if err := s.Do(ctx, tt.b); err != nil {
					t.Fatal(err)
				}
			}
			do() // load the scripts, size the pooled buffers
			allocs := testing.AllocsPerRun(200, do)
			t.Logf("%s/%s: %v allocs per Do", alg, tt.name, allocs)
			if allocs > tt.bound {
				t.Errorf("%s/%s: %v allocs per Store.Do, want at most %v", alg, tt.name, allocs, tt.bound)
			}
		}
	}
}
