package service_test

import (
	"strconv"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/service"
)

// BenchmarkShouldRateLimit measures one decision through the service (proto
// request in, proto response out, no gRPC transport) on the memory store,
// over 10,000 users that stay within their limit.
func BenchmarkShouldRateLimit(b *testing.B) {
	const users = 10_000
	f := newFixture(b, service.Config{})
	reqs := make([]*rlsv3.RateLimitRequest, users)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0." + strconv.Itoa(i)}},
		}}}
	}
	var next atomic.Uint64
	var sink atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		var ok int64
		for pb.Next() {
			// The limit is 10 per minute: cycling over 10,000 users keeps
			// every user under it for the first 100,000 calls and over it
			// after, so both paths are measured in long runs.
			r := reqs[next.Add(1)%users]
			resp, err := f.svc.ShouldRateLimit(ctx, r)
			if err != nil {
				b.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		sink.Add(ok)
	})
	b.StopTimer()
	if b.N >= users && f.reg.Snapshot()["ratelimit.service.rate_limit.test.ip.total_hits"] < users {
		b.Fatalf("fewer than %d hits counted: the key set was not populated", users)
	}
}
