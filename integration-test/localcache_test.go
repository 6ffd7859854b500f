package integration

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// localCacheGauges are envoyproxy/ratelimit's gauges of its local cache
// (LOCAL_CACHE_SIZE_IN_BYTES), after six calls on a key limited to three:
// four misses, the fourth of which puts the key in the cache, then two hits.
var localCacheGauges = map[string]int64{
	"hitCount":       2,
	"missCount":      4,
	"lookupCount":    6,
	"entryCount":     1,
	"evacuateCount":  0,
	"expiredCount":   0,
	"overwriteCount": 0,
}

// TestLocalCacheGauges: with LOCAL_CACHE_SIZE_IN_BYTES, the anchor's eight
// ratelimit.localcache gauges reach statsd under its names and Prometheus
// under the names statsd_exporter gives them without a mapping
// (ratelimit_localcache_hitCount...), with freecache's meanings;
// averageAccessTime is a Unix time in seconds, of the calls.
func TestLocalCacheGauges(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	port, lines := statsdUDP(t)
	p := start(t, map[string]string{"web.yaml": statsdRules}, redisEnv(r,
		"LOCAL_CACHE_SIZE_IN_BYTES=1048576", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
		"USE_STATSD=true", "STATSD_HOST=127.0.0.1", fmt.Sprintf("STATSD_PORT=%d", port),
		"STATSD_PROTOCOL=udp", "STATS_FLUSH_INTERVAL=100ms")...)
	c := p.client(t)
	before := time.Now().Unix()
	for i := range 6 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "dave")); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	after := time.Now().Unix()
	inCalls := func(what string, v int64) {
		t.Helper()
		if v < before || v > after {
			t.Errorf("%s = %d, want the Unix time of the calls, %d..%d", what, v, before, after)
		}
	}

	got := newStatsdTotals()
	got.until(t, lines, "the local cache's gauges after the calls", func() bool {
		return got.values["ratelimit.localcache.lookupCount"] == "6"
	})
	got.flushes(t, lines, "ratelimit.localcache.lookupCount", 1)
	for name, want := range localCacheGauges {
		if v := got.values["ratelimit.localcache."+name]; v != strconv.FormatInt(want, 10) {
			t.Errorf("statsd: ratelimit.localcache.%s = %q, want %d", name, v, want)
		}
	}
	at, err := strconv.ParseInt(got.values["ratelimit.localcache.averageAccessTime"], 10, 64)
	if err != nil {
		t.Fatalf("statsd: ratelimit.localcache.averageAccessTime: %v", err)
	}
	inCalls("statsd: ratelimit.localcache.averageAccessTime", at)

	mfs := scrapeMetrics(t, p, "http://"+p.prom+"/metrics")
	gauge := func(name string) (int64, bool) {
		m := series(mfs, "ratelimit_localcache_"+name, "")
		if m == nil || m.GetGauge() == nil {
			t.Errorf("Prometheus: no gauge ratelimit_localcache_%s", name)
			return 0, false
		}
		return int64(m.GetGauge().GetValue()), true
	}
	for name, want := range localCacheGauges {
		if v, ok := gauge(name); ok && v != want {
			t.Errorf("Prometheus: ratelimit_localcache_%s = %d, want %d", name, v, want)
		}
	}
	if v, ok := gauge("averageAccessTime"); ok {
		inCalls("Prometheus: ratelimit_localcache_averageAccessTime", v)
	}
}
