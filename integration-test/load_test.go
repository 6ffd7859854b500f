package integration

import (
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimit/cmd/ratelimit-bench/bench"
	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

const loadRules = `domain: load
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`

// loadConcurrency is how many calls the load tests keep in flight: far
// more than this process and the -race binary can serve at once on the
// machine's cores, so that calls queue inside the service and its
// scheduling, not the store, sets their latency.
const loadConcurrency = 1024

// TestHealthyStoreUnderLoad keeps loadConcurrency calls in flight against
// the -race binary on a healthy Redis, with the settings at their defaults
// (REQUEST_TIMEOUT, REDIS_TIMEOUT, the breaker, MAX_CONCURRENT_REQUESTS).
// Each call allowed a minute, far beyond what any takes: no call fails,
// and the store's breaker never trips. Then each allowed Envoy's default
// 20 ms, which many cannot meet while so many queue in the process: those
// fail on their own deadline or are shed, but the breaker still never
// trips, and no call is refused as if the store were down. A busy process
// is not a failing store. (Before issue 25 calls failed after a fixed
// 15 ms, and the deadlines they missed while queued in the process opened
// the breaker.) No bound is put on the calls' latency: the machine may be
// busy.
func TestHealthyStoreUnderLoad(t *testing.T) {
	tests := []struct {
		name   string
		env    func(t *testing.T) []string
		prefix string // of the store's statistics
	}{
		{"redis", func(t *testing.T) []string { return redisEnv(storetest.StartRedis(t, storetest.RedisOptions{})) }, "ratelimit.redis."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := launchWith(t, launchOpts{defaultBudget: true}, map[string]string{"load.yaml": loadRules},
				append(tt.env(t), "LOG_LEVEL=warn")...)
			p.waitHealth(t, http.StatusOK)
			run := func(calls int64, deadline time.Duration) *bench.Result {
				t.Helper()
				res, err := bench.Run(t.Context(), p.grpc, 4, bench.Load{
					Domain:      "load",
					Descriptors: []string{"user=u-{0..9999}"},
					Concurrency: loadConcurrency,
					Requests:    calls,
					Timeout:     deadline,
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%d calls allowed %v, %d in flight: %.0f calls/s, p50 %v, p99 %v, max %v; errors %v", res.Requests, deadline,
					loadConcurrency, res.RPS(), res.Latency.P50, res.Latency.P99, res.Latency.Max, res.Errors)
				return res
			}
			const calls = 16 * loadConcurrency
			if res := run(calls, time.Minute); res.Requests != calls || res.OK != calls || res.ErrorCount() != 0 {
				t.Errorf("%d calls: %d OK, %d OVER_LIMIT, errors by code %v; want every call OK", res.Requests, res.OK, res.OverLimit, res.Errors)
			}
			st := p.stats(t)
			for _, name := range []string{
				tt.prefix + "breaker_trips",
				tt.prefix + "breaker_open_rejections",
				"ratelimit.service.call.should_rate_limit.redis_error",
				"ratelimit.service.call.should_rate_limit.load_shed",
			} {
				if st[name] != 0 {
					t.Errorf("%s = %d under load on a healthy store, want 0", name, st[name])
				}
			}

			res := run(8*loadConcurrency, 20*time.Millisecond)
			if n := res.Errors[codes.Unavailable]; n != 0 {
				t.Errorf("%d calls Unavailable with Envoy's deadline on a healthy store, want none", n)
			}
			st = p.stats(t)
			for _, name := range []string{tt.prefix + "breaker_trips", tt.prefix + "breaker_open_rejections"} {
				if st[name] != 0 {
					t.Errorf("%s = %d after calls missed their own deadline on a healthy store, want 0", name, st[name])
				}
			}
		})
	}
}
