package writebehind

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/redis"
)

// BenchmarkDo: one hot key decided from many goroutines, by the memory
// store alone and written behind (to a memory store standing for the
// shared one, flushed by no one: its cost is not the decision's).
func BenchmarkDo(b *testing.B) {
	for _, tt := range []struct {
		name string
		mk   func(b *testing.B) limiter.Store
	}{
		{"memory", func(b *testing.B) limiter.Store { return newLocal(b) }},
		{"write_behind", func(b *testing.B) limiter.Store {
			s := New(newLocal(b), newLocal(b), Config{})
			b.Cleanup(s.Close)
			return s
		}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			s := tt.mk(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				batch := &limiter.Batch{Now: t0, Ops: []limiter.Op{fixed("hot", 1<<40)}}
				for pb.Next() {
					if err := s.Do(context.Background(), batch); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkFlush: what one key written behind costs the instance and
// redis-server (cpu-ns/op, redis-cpu-ns/op: an op is one key of a flush),
// for docs/SCALING.md. Every round hits 10,000 keys of one window once
// each, then flushes them: 20 batches of 512 keys, one round trip each.
func BenchmarkFlush(b *testing.B) {
	srv := harness.StartRedis(b, harness.RedisOptions{})
	shared, err := redis.New(b.Context(), redis.Config{SocketType: "tcp", URL: srv.Addr})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = shared.Close() })
	s := New(shared, newLocal(b), Config{Now: func() time.Time { return t0 }})
	b.Cleanup(s.Close)
	const round = 10_000
	keys := make([]string, round)
	for i := range keys {
		keys[i] = fmt.Sprint("flush_", i)
	}
	batch := &limiter.Batch{Now: t0, Ops: []limiter.Op{{}}}
	cpu := srv.StartCPU(b.Context())
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(round, b.N-done)
		for _, k := range keys[:n] {
			batch.Ops[0] = fixed(k, 1<<40)
			if err := s.Do(b.Context(), batch); err != nil {
				b.Fatal(err)
			}
		}
		s.Flush(b.Context())
		done += n
	}
	b.StopTimer()
	cpu.Report(b)
}
