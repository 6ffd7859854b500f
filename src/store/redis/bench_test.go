package redis

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// BenchmarkStore measures one-op requests from 64 concurrent clients over
// 10,000 keys per algorithm against a local redis-server, and reports how
// many ops each pipeline carried.
func BenchmarkStore(b *testing.B) {
	srv := storetest.StartRedis(b, storetest.RedisOptions{})
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "bench_user_" + strconv.Itoa(i)
	}
	for _, alg := range rules.Algorithms {
		b.Run(alg.String(), func(b *testing.B) {
			s := newStore(b, Config{URL: srv.Addr})
			prefix := alg.String() + "_"
			var next atomic.Uint64
			var sink atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(64 / max(1, testingProcs()))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				batch := &limiter.Batch{Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
				var admitted uint64
				for pb.Next() {
					i := next.Add(1) % keys
					batch.Now = time.Now()
					batch.Ops[0] = limiter.Op{Key: prefix + names[i], Algorithm: alg, Limit: 100_000, Window: 24 * time.Hour, Hits: 1}
					if err := s.Do(context.Background(), batch); err != nil {
						b.Error(err)
						return
					}
					if batch.Results[0].Allowed {
						admitted++
					}
				}
				sink.Add(admitted)
			})
			b.StopTimer()
			rt, ops := s.Counters()
			if rt > 0 {
				b.ReportMetric(float64(ops)/float64(rt), "ops/roundtrip")
			}
			if sink.Load() != uint64(b.N) {
				b.Errorf("%d of %d ops admitted", sink.Load(), b.N)
			}
			// The key set really was populated.
			if b.N >= keys {
				n, err := srv.Do(b.Context(), "EVAL", "return #redis.call('KEYS', ARGV[1])", "0", prefix+"*")
				if err != nil {
					b.Fatal(err)
				}
				if n != int64(keys) {
					b.Errorf("%d keys of %s in Redis, want %d", n, prefix, keys)
				}
			}
		})
	}
}

// BenchmarkStorePoolSize shows the trade-off of REDIS_POOL_SIZE, the
// number of pipelines in flight: fewer connections make deeper pipelines
// (fewer system calls on both sides), more connections hide a slow round
// trip. Fixed windows, 64 concurrent clients, 10,000 keys.
func BenchmarkStorePoolSize(b *testing.B) {
	srv := storetest.StartRedis(b, storetest.RedisOptions{})
	for _, pool := range []int{1, 2, 4, 10, 32} {
		b.Run("pool="+strconv.Itoa(pool), func(b *testing.B) {
			s := newStore(b, Config{URL: srv.Addr, PoolSize: pool})
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(64 / max(1, testingProcs()))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				batch := &limiter.Batch{Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
				for pb.Next() {
					batch.Now = time.Now()
					batch.Ops[0] = limiter.Op{Key: "pool_" + strconv.FormatUint(next.Add(1)%10_000, 10), Limit: 100_000, Window: 24 * time.Hour, Hits: 1}
					if err := s.Do(context.Background(), batch); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if rt, ops := s.Counters(); rt > 0 {
				b.ReportMetric(float64(ops)/float64(rt), "ops/roundtrip")
			}
		})
	}
}

// testingProcs is GOMAXPROCS, the goroutines per SetParallelism unit.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
