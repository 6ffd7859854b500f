package redis

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// BenchmarkStore measures one-op requests from 64 concurrent clients over
// 10,000 keys per algorithm against a local redis-server, and reports how
// many ops each pipeline carried and the CPU spent per op by this process
// (the callers and the store) and by Redis.
func BenchmarkStore(b *testing.B) {
	srv := harness.StartRedis(b, harness.RedisOptions{})
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "bench_user_" + strconv.Itoa(i)
	}
	for _, alg := range rules.Algorithms {
		b.Run(alg.String(), func(b *testing.B) {
			s := newStore(b, Config{URL: srv.Addr})
			prefix := alg.String() + "_"
			keyNames := make([]string, keys)
			for i := range keyNames {
				keyNames[i] = prefix + names[i]
			}
			var next atomic.Uint64
			var sink atomic.Uint64
			cpu := srv.StartCPU(b.Context())
			b.ReportAllocs()
			b.SetParallelism(64 / max(1, testingProcs()))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				batch := &limiter.Batch{Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
				var admitted uint64
				for pb.Next() {
					i := next.Add(1) % keys
					batch.Now = time.Now()
					batch.Ops[0] = limiter.Op{Key: keyNames[i], Algorithm: alg, Limit: 100_000, Window: 24 * time.Hour, Hits: 1}
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
			cpu.Report(b)
			reportDepth(b, s)
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

// BenchmarkStorePoolSize shows what REDIS_POOL_SIZE, the most pipelines in
// flight to a node, changes under load: little, since another pipeline
// starts only when deepQueue commands wait (fixed windows, 64 concurrent
// clients, 10,000 keys).
func BenchmarkStorePoolSize(b *testing.B) {
	srv := harness.StartRedis(b, harness.RedisOptions{})
	for _, pool := range []int{1, 2, 4, 10, 32} {
		b.Run("pool="+strconv.Itoa(pool), func(b *testing.B) {
			benchFixedWindow(b, srv, newStore(b, Config{URL: srv.Addr, PoolSize: pool}))
		})
	}
}

// BenchmarkStoreQueueDepth justifies deepQueue, the queued work (commands,
// a script op counting scriptWork) that starts another pipeline while one is
// in flight: 2 is about the former design, a pipeline per free connection;
// 1<<20 never starts a second one. Fixed windows (client-bound: two
// commands an op) and token buckets (Redis-bound: a script call an op); the
// default pool of 10, 64 concurrent clients, 10,000 keys.
func BenchmarkStoreQueueDepth(b *testing.B) {
	srv := harness.StartRedis(b, harness.RedisOptions{})
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.TokenBucket} {
		for _, deep := range []int{2, 16, 32, 64, 128, 1 << 20} {
			b.Run(alg.String()+"/deep="+strconv.Itoa(deep), func(b *testing.B) {
				s := newStore(b, Config{URL: srv.Addr})
				s.main.mu.Lock()
				s.main.deep = deep
				s.main.mu.Unlock()
				benchOps(b, srv, s, alg, 1)
			})
		}
	}
}

// BenchmarkStoreOpsPerRequest runs requests of one and of three ops (Envoy's
// usual remote_address / path / user chain), fixed windows and token
// buckets, on the default pool: a request of three fixed windows must not
// open more pipelines per request than one of one (req/roundtrip), since
// the load is client-bound (see request.deepWork).
func BenchmarkStoreOpsPerRequest(b *testing.B) {
	srv := harness.StartRedis(b, harness.RedisOptions{})
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.TokenBucket} {
		for _, nops := range []int{1, 3} {
			b.Run(alg.String()+"/ops="+strconv.Itoa(nops), func(b *testing.B) {
				benchOps(b, srv, newStore(b, Config{URL: srv.Addr}), alg, nops)
			})
		}
	}
}

// benchFixedWindow runs benchOps with fixed windows.
func benchFixedWindow(b *testing.B, srv *harness.RedisServer, s *Store) {
	b.Helper()
	benchOps(b, srv, s, rules.FixedWindow, 1)
}

// benchOps runs requests of nops ops of alg (on nops different keys) from
// 64 concurrent clients over 10,000 keys on s.
func benchOps(b *testing.B, srv *harness.RedisServer, s *Store, alg rules.Algorithm, nops int) {
	b.Helper()
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "depth_" + alg.String() + "_" + strconv.Itoa(i)
	}
	var next atomic.Uint64
	cpu := srv.StartCPU(b.Context())
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, testingProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		batch := &limiter.Batch{Ops: make([]limiter.Op, nops), Results: make([]limiter.Result, nops)}
		for pb.Next() {
			batch.Now = time.Now()
			for k := range batch.Ops {
				batch.Ops[k] = limiter.Op{Key: names[next.Add(1)%keys], Algorithm: alg, Limit: 1 << 40, Window: 24 * time.Hour, Hits: 1}
			}
			if err := s.Do(context.Background(), batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	cpu.Report(b)
	reportDepth(b, s)
	if rt, _ := s.Counters(); rt > 0 {
		b.ReportMetric(float64(b.N)/float64(rt), "req/roundtrip")
	}
}

// reportDepth reports the mean pipeline depth, ops per round trip.
func reportDepth(b *testing.B, s *Store) {
	b.Helper()
	if rt, ops := s.Counters(); rt > 0 {
		b.ReportMetric(float64(ops)/float64(rt), "ops/roundtrip")
	}
}

// testingProcs is GOMAXPROCS, the goroutines per SetParallelism unit.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
