package writebehind

import (
	"context"
	"testing"

	"github.com/ratelimitd/ratelimit/src/limiter"
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
