package service_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// BenchmarkShouldRateLimit measures one decision through the service (proto
// request in, proto response out, no gRPC transport) on the memory store,
// over 10,000 users that stay within their limit.
func BenchmarkShouldRateLimit(b *testing.B) {
	const users = 10_000
	f := newFixture(b, service.Config{})
	reqs := userRequests(users)
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

// BenchmarkShouldRateLimitThree is BenchmarkShouldRateLimit with three
// descriptors per request, as Envoy's usual chain sends them: the client's
// address, the path (with the method, nested) and the user.
func BenchmarkShouldRateLimitThree(b *testing.B) {
	const users = 10_000
	f := newFixture(b, service.Config{})
	reqs := make([]*rlsv3.RateLimitRequest, users)
	for i := range reqs {
		reqs[i] = req(desc("ip", "10.0."+strconv.Itoa(i)), desc("path", "/api", "method", "GET"), desc("user", "u-"+strconv.Itoa(i)))
	}
	decideAll(b, f.svc, reqs)
}

// userRequests returns one request per user, each with one descriptor
// ip=10.0.<user>.
func userRequests(users int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, users)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0." + strconv.Itoa(i)}},
		}}}
	}
	return reqs
}

// decideAll calls svc with reqs in turn, b.N times, from parallel
// goroutines.
func decideAll(b *testing.B, svc *service.Service, reqs []*rlsv3.RateLimitRequest) {
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			if _, err := svc.ShouldRateLimit(ctx, reqs[next.Add(1)%uint64(len(reqs))]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkShouldRateLimitStatsd is BenchmarkShouldRateLimit with the
// statistics sent to statsd ("on") or not ("off"): a flusher on a real
// UDP socket every 10 ms, a thousand times as often as the default, so
// that its share of the CPU shows. Compare the two in one run, taking
// turns (-count with -bench 'Statsd/(off|on)' runs each in a row; run
// them alternately, as docs/BENCHMARKS.md says).
//
// "timer" records the response time without a flusher: the part of "on"
// that each decision pays.
func BenchmarkShouldRateLimitStatsd(b *testing.B) {
	for _, v := range []struct {
		name         string
		timer, flush bool
	}{{"off", false, false}, {"timer", true, false}, {"on", true, true}} {
		b.Run(v.name, func(b *testing.B) {
			const users = 10_000
			f := newFixture(b, service.Config{ResponseTime: v.timer})
			if v.flush {
				conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close()
				go func() {
					buf := make([]byte, 1<<16)
					for {
						if _, err := conn.Read(buf); err != nil {
							return
						}
					}
				}()
				s := stats.NewStatsd(f.reg, stats.StatsdConfig{Addr: conn.LocalAddr().String(), Interval: 10 * time.Millisecond})
				ctx, cancel := context.WithCancel(b.Context())
				done := make(chan struct{})
				go func() { defer close(done); s.Run(ctx) }()
				defer func() { cancel(); <-done }()
			}
			reqs := userRequests(users)
			decideAll(b, f.svc, reqs)
		})
	}
}

// BenchmarkShouldRateLimitLive is BenchmarkShouldRateLimit with the live
// view's recorder ("on") or without ("off"; LIVE_VIEW_ENABLED=false),
// ticked as the server's is (see the loop), for three kinds of
// traffic over 10,000 users with a limit of 10 a minute: "within" (8
// hits a user per window: the recorder's counters only), "near" (10 a
// window: the last two are near the limit and go to the sketch) and
// "over" (every user over the limit: one decision in 8 goes to the
// sketch). cpu-ns/op is the CPU time of the process per decision, which
// the load of a shared machine disturbs less than ns/op; compare on and
// off in separate processes taking turns (docs/BENCHMARKS.md).
func BenchmarkShouldRateLimitLive(b *testing.B) {
	const users = 10_000
	for _, tt := range []struct {
		name string
		// perWindow is the hits of a user per minute window; 0: no new
		// window, every user over the limit.
		perWindow int
	}{{"within", 8}, {"near", 10}, {"over", 0}} {
		for _, on := range []bool{false, true} {
			name := tt.name + "/off"
			if on {
				name = tt.name + "/on"
			}
			b.Run(name, func(b *testing.B) {
				// The clock is the system's nanoseconds within a minute
				// window that moves on as the traffic asks: the recorder
				// samples by the clock's bits, as in production, and ticks
				// on the same clock.
				var base atomic.Int64
				base.Store(epoch.UnixNano())
				clock := func() time.Time {
					return time.Unix(0, base.Load()+int64(time.Now().Nanosecond()%int(time.Millisecond)))
				}
				var rec *live.Recorder
				if on {
					rec = live.New(live.Config{Now: clock})
				}
				f := newFixture(b, service.Config{Live: rec, Now: clock})
				reqs := userRequests(users)
				if tt.perWindow == 0 {
					for range 11 {
						for _, r := range reqs {
							if _, err := f.svc.ShouldRateLimit(b.Context(), r); err != nil {
								b.Fatal(err)
							}
						}
					}
				}
				counted := func() int {
					rec.Tick(clock())
					var n int
					for _, v := range rec.Traffic(live.Window).Totals.Decisions {
						n += int(v)
					}
					return n
				}
				before := 0
				if on {
					before = counted()
				}
				window := uint64(users * tt.perWindow)
				// The server ticks every second. The benchmark's clock runs
				// a minute a window, so with windows it ticks ten times a
				// window; without, about once a second of its own.
				tickEvery := uint64(1_000_000)
				if window > 0 {
					tickEvery = window / 10
				}
				var next atomic.Uint64
				b.ReportAllocs()
				cpu, _ := harness.ProcessCPU()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := b.Context()
					for pb.Next() {
						i := next.Add(1)
						if window > 0 && i%window == 0 {
							base.Add(int64(time.Minute))
						}
						if on && i%tickEvery == 0 {
							rec.Tick(clock())
						}
						if _, err := f.svc.ShouldRateLimit(ctx, reqs[i%users]); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.StopTimer()
				if end, ok := harness.ProcessCPU(); ok {
					b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/op")
				}
				if on {
					n := counted() - before
					// The series span five minutes of the benchmark's
					// clock, which moves a minute a window.
					if n == 0 || n > b.N || (n < b.N && time.Duration(base.Load()-epoch.UnixNano()) < 4*time.Minute) {
						b.Fatalf("the recorder counted %d decisions of %d", n, b.N)
					}
				}
			})
		}
	}
}

// BenchmarkShouldRateLimitUnmatched measures a decision of one descriptor
// that no rule matches (a key no rule has, over 10,000 values) with the
// live view's recorder ("on") or without ("off"): the cost of recording
// what matched nothing. The recorder is not ticked: past its first 256
// a second, one in 16 is recorded, as under any load worth measuring.
func BenchmarkShouldRateLimitUnmatched(b *testing.B) {
	reqs := userRequests(10_000)
	for _, r := range reqs {
		r.Descriptors[0].Entries[0].Key = "usr"
	}
	for _, on := range []bool{false, true} {
		name := "off"
		var rec *live.Recorder
		if on {
			name, rec = "on", live.New(live.Config{})
		}
		b.Run(name, func(b *testing.B) {
			f := newFixture(b, service.Config{Live: rec})
			cpu, _ := harness.ProcessCPU()
			decideAll(b, f.svc, reqs)
			if end, ok := harness.ProcessCPU(); ok {
				b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}
