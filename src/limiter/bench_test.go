package limiter

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// sink keeps results alive so the compiler cannot drop the work.
var sink atomic.Uint64

// BenchmarkCacheKey builds the key of a two-entry descriptor in each
// format; "remote_address" has a '_' to escape, as most keys do.
func BenchmarkCacheKey(b *testing.B) {
	entries := []rules.Entry{{Key: "remote_address", Value: "10.12.34.56"}, {Key: "path", Value: "/api/v1/login"}}
	formats := []struct {
		name string
		key  func(dst []byte, prefix, domain string, entries []rules.Entry, l *rules.Limit, now time.Time) []byte
	}{
		{"", CacheKey},
		{"escaped_", EscapedCacheKey},
	}
	for _, f := range formats {
		for _, a := range []rules.Algorithm{rules.FixedWindow, rules.TokenBucket} {
			l := &rules.Limit{RequestsPerUnit: 100, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: a}
			b.Run(f.name+a.String(), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					buf := make([]byte, 0, 128)
					now := base
					n := 0
					for pb.Next() {
						now = now.Add(time.Millisecond)
						buf = f.key(buf[:0], "ratelimit_", "edge", entries, l, now)
						n += len(buf)
					}
					sink.Add(uint64(n))
				})
			})
		}
	}
}

// BenchmarkAlgorithm runs each pure function on one key with 1,000 a
// minute and one hit every 60 ms: traffic at the limit, so admitted and
// refused hits mix.
func BenchmarkAlgorithm(b *testing.B) {
	for _, a := range rules.Algorithms {
		op := Op{Algorithm: a, Limit: 1000, Window: time.Minute, Hits: 1}
		b.Run(a.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var m machine
				now := base
				var n uint64
				for pb.Next() {
					now = now.Add(60 * time.Millisecond)
					if m.apply(now, op).Allowed {
						n++
					}
				}
				sink.Add(n)
			})
		})
	}
}
