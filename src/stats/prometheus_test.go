package stats

import (
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/ratelimitd/ratelimit/harness"
)

// gather scrapes h and parses the exposition, failing the test on a status
// other than 200 or a body that does not parse.
func gather(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics = %d:\n%s", rec.Code, rec.Body)
	}
	body := rec.Body.String()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return mfs
}

// find returns the metric of family name whose labels are exactly want
// (name=value,...), failing the test when there is none.
func find(t *testing.T, mfs map[string]*dto.MetricFamily, name, want string) *dto.Metric {
	t.Helper()
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("no family %s; have %v", name, familyNames(mfs))
	}
	var seen []string
	for _, m := range mf.GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		got := strings.Join(ls, ",")
		if got == want {
			return m
		}
		seen = append(seen, got)
	}
	t.Fatalf("%s{%s} not found; have %q", name, want, seen)
	return nil
}

func familyNames(mfs map[string]*dto.MetricFamily) []string {
	var out []string
	for n := range mfs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// cumulative returns a histogram's buckets as bound -> cumulative count.
func cumulative(m *dto.Metric) map[float64]uint64 {
	out := map[float64]uint64{}
	for _, b := range m.GetHistogram().GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) {
			continue // the count
		}
		out[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	return out
}

// TestResponseTimeHistogram: the response-time timer is the anchor's
// ratelimit_service_response_time_seconds histogram, in seconds, or in
// milliseconds with ResponseTimeMillis (the anchor's compatibility
// switch); other timers are in seconds whatever the switch says.
func TestResponseTimeHistogram(t *testing.T) {
	r := NewRegistry()
	tm := r.Timer("ratelimit_server.ShouldRateLimit.response_time")
	tm.RecordN(200*time.Microsecond, 8) // under the 0.25 ms bound
	tm.Record(3 * time.Millisecond)     // between 2.5 ms and 5 ms
	tm.Record(40 * time.Millisecond)    // between 25 ms and 50 ms
	rt := r.Timer("ratelimit.redis.round_trip")
	rt.Record(3 * time.Millisecond)

	mfs := gather(t, r.Handler())
	m := find(t, mfs, "ratelimit_service_response_time_seconds", "grpc_method=ShouldRateLimit")
	if got := mfs["ratelimit_service_response_time_seconds"].GetType(); got != dto.MetricType_HISTOGRAM {
		t.Errorf("type %v, want histogram", got)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 10 {
		t.Errorf("count %d, want 10", h.GetSampleCount())
	}
	if want := 8*200e-6 + 3e-3 + 40e-3; math.Abs(h.GetSampleSum()-want) > 1e-12 {
		t.Errorf("sum %v, want %v (exact)", h.GetSampleSum(), want)
	}
	cum := cumulative(m)
	for bound, want := range map[float64]uint64{.0001: 0, .00025: 8, .0025: 8, .005: 9, .025: 9, .05: 10, 10: 10} {
		if cum[bound] != want {
			t.Errorf("le=%v: %d, want %d (all: %v)", bound, cum[bound], want, cum)
		}
	}
	if len(cum) != len(LatencyBuckets) {
		t.Errorf("%d buckets, want %d", len(cum), len(LatencyBuckets))
	}
	rtm := find(t, mfs, "ratelimit_redis_round_trip_seconds", "")
	if got := cumulative(rtm)[.005]; got != 1 {
		t.Errorf("round trip le=0.005: %d, want 1", got)
	}

	// In milliseconds, as the anchor's legacy unit: 0.2 ms is under the
	// 0.25 bound only now read as milliseconds, so the 8 go to le=0.25.
	ms := gather(t, r.PrometheusHandler(PrometheusConfig{ResponseTimeMillis: true}))
	m = find(t, ms, "ratelimit_service_response_time_seconds", "grpc_method=ShouldRateLimit")
	cum = cumulative(m)
	for bound, want := range map[float64]uint64{.1: 0, .25: 8, 2.5: 8, 5: 9, 10: 9} {
		if cum[bound] != want {
			t.Errorf("milliseconds: le=%v: %d, want %d (all: %v)", bound, cum[bound], want, cum)
		}
	}
	if want := 8*0.2 + 3 + 40.0; math.Abs(m.GetHistogram().GetSampleSum()-want) > 1e-9 {
		t.Errorf("milliseconds: sum %v, want %v", m.GetHistogram().GetSampleSum(), want)
	}
	if got := cumulative(find(t, ms, "ratelimit_redis_round_trip_seconds", ""))[.005]; got != 1 {
		t.Errorf("the switch changed another timer: round trip le=0.005: %d, want 1", got)
	}
}

// A fine bucket counts under a bound only when all of it fits: no value
// is ever counted under a bound it exceeds.
func TestRegroupNeverUndercounts(t *testing.T) {
	for v := uint64(1); v < 1<<41; v = v*17/16 + 1 {
		var b [timerBuckets]uint64
		b[bucketOf(v)] = 1
		_, cum := regroup(&b, 1e-9, LatencyBuckets)
		for _, bound := range LatencyBuckets {
			if float64(v)*1e-9 > bound && cum[bound] != 0 {
				t.Fatalf("%d ns counted under le=%v", v, bound)
			}
			// ...and counts under the bound 6.25 % above it at the
			// latest: a fine bucket is at most 1/16 of its low end wide.
			if float64(v)*1e-9*1.0625 <= bound && cum[bound] != 1 {
				t.Fatalf("%d ns not counted under le=%v", v, bound)
			}
		}
	}
}

func TestValueHistogram(t *testing.T) {
	r := NewRegistry()
	h := r.Histogram("ratelimit.redis.pipeline_commands", []float64{1, 2, 4, 8})
	for _, v := range []uint64{1, 1, 2, 3, 8, 9, 100} {
		h.Observe(v)
	}
	if r.Histogram("ratelimit.redis.pipeline_commands", nil) != h {
		t.Error("a second call made another histogram")
	}
	m := find(t, gather(t, r.Handler()), "ratelimit_redis_pipeline_commands", "")
	want := map[float64]uint64{1: 2, 2: 3, 4: 4, 8: 5}
	if got := cumulative(m); !mapsEqual(got, want) {
		t.Errorf("buckets %v, want %v", got, want)
	}
	if m.GetHistogram().GetSampleCount() != 7 || m.GetHistogram().GetSampleSum() != 124 {
		t.Errorf("count %d sum %v, want 7 and 124", m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum())
	}
}

func mapsEqual(a, b map[float64]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// anchorStyleMapping is a statsd_exporter mapping in the dialect of
// envoyproxy/ratelimit's default one (the deprecated timer_type included,
// which the anchor's users' files still carry), plus what a custom mapping
// may ask for: drop, scale, help, a summary, honor_labels.
const anchorStyleMapping = `
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "rl_hits"
    labels:
      domain: "$1"
      descriptor: "$2"
  - match: "ratelimit\\.service\\.rate_limit\\.(.*)\\.(.*)\\.(.*)\\.over_limit"
    match_type: regex
    name: "rl_over"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    name: "rl_within"
    action: drop
  - match: "ratelimit_server.*.response_time"
    name: "rl_response_seconds"
    timer_type: histogram
    scale: 0.001
    buckets: [0.0005, 0.001, 0.005]
    labels:
      rpc: "$1"
  - match: "ratelimit.redis.round_trip"
    name: "rl_round_trip_ms"
    observer_type: summary
    summary_options:
      quantiles:
        - quantile: 0.5
          error: 0.05
        - quantile: 0.99
          error: 0.001
      max_age: 1m
      age_buckets: 2
  - match: "ratelimit.memcache.increment"
    name: "rl_incr"
    help: "memcached increments"
    match_metric_type: counter
    labels:
      code: "all"
  - match: "ratelimit.memcache.add"
    name: "rl_add"
    honor_labels: true
    labels:
      code: "all"
  - match: "ratelimit.service.config_load_success"
    name: "rl_loads"
    scale: 2
`

func writeMapping(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mapping.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMapper: with PROMETHEUS_MAPPER_YAML, series are named by the
// mapping from the statsd names, as statsd_exporter names the anchor's.
func TestMapper(t *testing.T) {
	mp, err := LoadMapper(writeMapping(t, anchorStyleMapping), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry()
	r.RuleCounter("web", []string{"user_alice"}, "total_hits").Add(3)
	// The IPv4 address is one level in statsd names, as the anchor writes it.
	r.RuleCounter("web", []string{"remote_address_10.0.0.1"}, "total_hits").Add(4)
	r.RuleCounter("web", []string{"a", "b"}, "over_limit").Add(5)
	// Two rules that a mapping makes one series add up.
	r.RuleCounter("web", []string{"a", "b", "c"}, "over_limit").Add(6)
	r.RuleCounter("web", []string{"user_alice"}, "within_limit").Add(7)
	r.Timer("ratelimit_server.ShouldRateLimit.response_time").RecordN(200*time.Microsecond, 4)
	r.Timer("ratelimit_server.ShouldRateLimit.response_time").Record(3 * time.Millisecond)
	r.CounterFunc("ratelimit.memcache.increment", func() uint64 { return 1 }, Label{"code", "success"})
	r.CounterFunc("ratelimit.memcache.add", func() uint64 { return 2 }, Label{"code", "success"})
	r.Counter("ratelimit.service.config_load_success").Add(3)
	r.Counter("ratelimit.unmapped-name").Add(9)
	r.Gauge("ratelimit.memory.keys").Set(11)

	mfs := gather(t, r.PrometheusHandler(PrometheusConfig{Mapper: mp}))
	counter := func(name, labels string, want float64) {
		t.Helper()
		if got := find(t, mfs, name, labels).GetCounter().GetValue(); got != want {
			t.Errorf("%s{%s} = %v, want %v", name, labels, got, want)
		}
	}
	counter("rl_hits", "descriptor=user_alice,domain=web", 3)
	counter("rl_hits", "descriptor=remote_address_10_0_0_1,domain=web", 4)
	// The regex's greedy (.*) takes "a" and then "b.c" apart as the
	// anchor's would: web.a.b and web.a.b.c are two series here.
	counter("rl_over", "domain=web,key1=a,key2=b", 5)
	counter("rl_over", "domain=web.a,key1=b,key2=c", 6)
	counter("rl_incr", "code=all", 1) // the mapping's label wins over the tag
	counter("rl_add", "code=success", 2)
	counter("rl_loads", "", 6) // scaled
	counter("ratelimit_unmapped_name", "", 9)
	if got := find(t, mfs, "ratelimit_memory_keys", "").GetGauge().GetValue(); got != 11 {
		t.Errorf("ratelimit_memory_keys = %v, want 11", got)
	}
	if mfs["rl_incr"].GetHelp() != "memcached increments" {
		t.Errorf("rl_incr help %q", mfs["rl_incr"].GetHelp())
	}
	if _, ok := mfs["rl_within"]; ok {
		t.Error("rl_within is exported; its mapping drops it")
	}
	for n := range mfs {
		if strings.Contains(n, "within_limit") {
			t.Errorf("%s: a dropped statistic is exported under its own name", n)
		}
	}
	// The timer in milliseconds, scaled by the mapping to seconds, in the
	// mapping's buckets (timer_type and buckets: the legacy keys).
	m := find(t, mfs, "rl_response_seconds", "rpc=ShouldRateLimit")
	if got, want := cumulative(m), map[float64]uint64{.0005: 4, .001: 4, .005: 5}; !mapsEqual(got, want) {
		t.Errorf("rl_response_seconds buckets %v, want %v", got, want)
	}
	if got, want := m.GetHistogram().GetSampleSum(), 4*200e-6+3e-3; math.Abs(got-want) > 1e-12 {
		t.Errorf("rl_response_seconds sum %v, want %v", got, want)
	}
}

// An unmapped timer is a summary (statsd_exporter's default observer) in
// milliseconds; its quantiles cover the mapping's max_age, stepping as
// the scrapes go, and its count and sum all time.
func TestMapperSummaryWindow(t *testing.T) {
	mp, err := LoadMapper(writeMapping(t, anchorStyleMapping), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r := NewRegistry()
	rt := r.Timer("ratelimit.redis.round_trip")
	other := r.Timer("ratelimit.memcache.round_trip")
	h := r.PrometheusHandler(PrometheusConfig{Mapper: mp, Now: func() time.Time { return now }, ScrapeReuse: -1})
	quantile := func(mfs map[string]*dto.MetricFamily, q float64) float64 {
		t.Helper()
		for _, qq := range find(t, mfs, "rl_round_trip_ms", "").GetSummary().GetQuantile() {
			if qq.GetQuantile() == q {
				return qq.GetValue()
			}
		}
		t.Fatalf("no quantile %v", q)
		return 0
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= want/32 }

	rt.RecordN(10*time.Millisecond, 100)
	other.Record(time.Millisecond)
	mfs := gather(t, h)
	if got := quantile(mfs, 0.5); !near(got, 10) {
		t.Errorf("p50 = %v ms, want about 10", got)
	}
	if mfs["ratelimit_memcache_round_trip"].GetType() != dto.MetricType_SUMMARY {
		t.Errorf("unmapped timer: %v, want a summary", mfs["ratelimit_memcache_round_trip"].GetType())
	}
	// 40 s later (the window is 1m in 2 steps: a snapshot each 30 s at
	// most, at a scrape), faster round trips; the slow ones are still in
	// the window.
	now = now.Add(40 * time.Second)
	gather(t, h)
	rt.RecordN(2*time.Millisecond, 300)
	if got := quantile(gather(t, h), 0.5); !near(got, 2) {
		t.Errorf("p50 after 300 fast = %v ms, want about 2", got)
	}
	if got := quantile(gather(t, h), 0.99); !near(got, 10) {
		t.Errorf("p99 = %v ms, want about 10 (the slow ones are in the window)", got)
	}
	// 70 s after the start, the slow ones have left the window.
	now = now.Add(30 * time.Second)
	mfs = gather(t, h)
	if got := quantile(mfs, 0.99); !near(got, 2) {
		t.Errorf("p99 after the window moved = %v ms, want about 2", got)
	}
	s := find(t, mfs, "rl_round_trip_ms", "").GetSummary()
	if s.GetSampleCount() != 400 || math.Abs(s.GetSampleSum()-(100*10+300*2)) > 1e-9 {
		t.Errorf("count %d sum %v, want 400 and 1600 (all time)", s.GetSampleCount(), s.GetSampleSum())
	}
	// Nothing new for a whole window: no quantile.
	now = now.Add(2 * time.Minute)
	gather(t, h)
	if got := quantile(gather(t, h), 0.5); !math.IsNaN(got) {
		t.Errorf("p50 of an empty window = %v, want NaN", got)
	}
}

// A mapping that does not load stops the start with an error that names
// the file; so does a file that is not there.
func TestMapperErrorsNameTheFile(t *testing.T) {
	tests := []struct {
		name string
		give string
		want string
	}{
		{name: "not_yaml", give: "mappings: [", want: "yaml"},
		{name: "no_name", give: "mappings:\n  - match: a.b\n", want: "metric name"},
		{name: "bad_label", give: "mappings:\n  - match: a.b\n    name: x\n    labels:\n      \"a-b\": c\n", want: "label"},
		{name: "bad_regex", give: "mappings:\n  - match: \"(\"\n    match_type: regex\n    name: x\n", want: "regex"},
		{name: "bad_observer", give: "mappings:\n  - match: a.b\n    name: x\n    observer_type: pie\n", want: "observer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeMapping(t, tt.give)
			_, err := LoadMapper(p, nil)
			if err == nil {
				t.Fatalf("LoadMapper(%q) succeeded", tt.give)
			}
			if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("LoadMapper error %q, want it to name %s and say %q", err, p, tt.want)
			}
		})
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	if _, err := LoadMapper(missing, nil); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("LoadMapper(missing) = %v, want an error naming it", err)
	}
}

// Statistics a request names go through the mapping too: what the mapping
// makes of them can be neither an invalid series nor a failed scrape.
func TestMapperHostileNames(t *testing.T) {
	mp, err := LoadMapper(writeMapping(t, anchorStyleMapping), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry()
	r.RuleCounter("web", []string{"user_\xff\n"}, "total_hits").Inc()
	r.RuleCounter("web", []string{"9lives"}, "shadow_mode").Inc()
	r.RuleCounter("w\"eb", []string{"}"}, "near_limit").Inc()
	mfs := gather(t, r.PrometheusHandler(PrometheusConfig{Mapper: mp}))
	find(t, mfs, "rl_hits", "descriptor=user_\uFFFD\n,domain=web")
	// Unmapped: the name escaped as statsd_exporter escapes it.
	find(t, mfs, "ratelimit_service_rate_limit_web_9lives_shadow_mode", "")
}

// TestScrapesShareOneGathering: scrapes at once, or within ScrapeReuse of
// the last gathering, are served one gathering; a scrape later gathers
// again; gzip is served to those who ask.
func TestScrapesShareOneGathering(t *testing.T) {
	r := NewRegistry()
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	// An hour: the release of an idle exposition (a real timer) never
	// comes within the test, however slow the machine.
	const reuse = time.Hour
	h := r.PrometheusHandler(PrometheusConfig{Now: clock, ScrapeReuse: reuse}).(*scrapeCache)
	c := r.Counter("ratelimit.x")
	c.Add(3)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { gather(t, h) })
	}
	wg.Wait()
	if h.gathered != 1 {
		t.Errorf("8 scrapes at once gathered %d times, want 1", h.gathered)
	}
	c.Add(4)
	if got := find(t, gather(t, h), "ratelimit_x", "").GetCounter().GetValue(); got != 3 {
		t.Errorf("a scrape within the reuse time: %v, want the 3 gathered", got)
	}
	mu.Lock()
	now = now.Add(reuse)
	mu.Unlock()
	if got := find(t, gather(t, h), "ratelimit_x", "").GetCounter().GetValue(); got != 7 || h.gathered != 2 {
		t.Errorf("a scrape the reuse time later: %v after %d gatherings, want 7 after 2", got, h.gathered)
	}

	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept-Encoding", "deflate, gzip;q=1.0")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	zr, err := gzip.NewReader(rec.Body)
	if err != nil || rec.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip asked: Content-Encoding %q, %v", rec.Header().Get("Content-Encoding"), err)
	}
	body, _ := io.ReadAll(zr)
	if !strings.Contains(string(body), "ratelimit_x 7") {
		t.Errorf("gzipped exposition:\n%s", body)
	}
}

// TestIdleExpositionIsReleased: the exposition is held no longer than it
// may be served, so an idle service keeps no copy of its series.
func TestIdleExpositionIsReleased(t *testing.T) {
	r := NewRegistry()
	r.Counter("ratelimit.x").Inc()
	h := r.PrometheusHandler(PrometheusConfig{ScrapeReuse: 10 * time.Millisecond}).(*scrapeCache)
	gather(t, h)
	harness.WaitFor(t, 10*time.Second, "the exposition, held after a scrape with a reuse of 10 ms, let go", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.text == nil
	})
}
