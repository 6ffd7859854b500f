package stats

import (
	"io"
	"math"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCountersAreExactUnderConcurrency(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				r.Counter("a.b").Inc()
			}
		}()
	}
	wg.Wait()
	if got := r.Counter("a.b").Value(); got != 16000 {
		t.Errorf("a.b = %d, want 16000", got)
	}
}

func TestWriteText(t *testing.T) {
	r := NewRegistry()
	r.Counter("z.last").Add(2)
	r.Counter("a.first").Inc()
	r.Gauge("m.gauge").Set(-3)
	r.CounterFunc("f.func", func() uint64 { return 7 })
	r.GaugeFunc("g.func", func() int64 { return 9 })
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := "a.first: 1\nf.func: 7\ng.func: 9\nm.gauge: -3\nz.last: 2\n"
	if b.String() != want {
		t.Errorf("WriteText = %q, want %q", b.String(), want)
	}
}

func TestPrometheusNames(t *testing.T) {
	tests := []struct {
		give       string
		wantName   string
		wantLabels string
	}{
		{"ratelimit.service.rate_limit.web.user.total_hits", "ratelimit_service_rate_limit_total_hits", "domain=web,key1=user"},
		{"ratelimit.service.rate_limit.web.path_/a.method.over_limit", "ratelimit_service_rate_limit_over_limit", "domain=web,key1=path_/a,key2=method"},
		{"ratelimit.service.call.should_rate_limit.redis_error", "ratelimit_service_should_rate_limit_error", "err_type=redis_error"},
		{"ratelimit_server.ShouldRateLimit.total_requests", "ratelimit_service_total_requests", "grpc_method=ShouldRateLimit"},
		{"ratelimit.service.config_load_success", "ratelimit_service_config_load_success", ""},
		{"ratelimit.redis.round-trips", "ratelimit_redis_round_trips", ""},
	}
	for _, tt := range tests {
		name, labels := promName(tt.give)
		var ls []string
		for _, l := range labels {
			ls = append(ls, l.Name+"="+l.Value)
		}
		if name != tt.wantName || strings.Join(ls, ",") != tt.wantLabels {
			t.Errorf("promName(%q) = %s{%s}, want %s{%s}", tt.give, name, strings.Join(ls, ","), tt.wantName, tt.wantLabels)
		}
	}
}

func TestPrometheusHandler(t *testing.T) {
	r := NewRegistry()
	r.Counter("ratelimit.service.rate_limit.web.user.total_hits").Add(5)
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if want := `ratelimit_service_rate_limit_total_hits{domain="web",key1="user"} 5`; !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %q:\n%s", want, body)
	}
}

func TestCountersSaturate(t *testing.T) {
	var c Counter
	for range 4 {
		c.Add(math.MaxInt64)
	}
	if got := c.Value(); got != math.MaxUint64 {
		t.Errorf("four adds of MaxInt64 = %d, want MaxUint64 (saturated)", got)
	}
	c.Inc()
	if got := c.Value(); got != math.MaxUint64 {
		t.Errorf("Inc on a saturated counter = %d, want MaxUint64", got)
	}
	r := NewRegistry()
	for range 4 {
		r.RuleCounter("d", []string{"k"}, "total_hits").Add(math.MaxInt64)
	}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if want := "ratelimit.service.rate_limit.d.k.total_hits: 18446744073709551615\n"; b.String() != want {
		t.Errorf("/stats = %q, want %q", b.String(), want)
	}
}

func TestSaturationUnderConcurrency(t *testing.T) {
	var c Counter
	c.Add(math.MaxUint64 - 1000)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				c.Add(3)
			}
		})
	}
	wg.Wait()
	if got := c.Value(); got != math.MaxUint64 {
		t.Errorf("counter = %d, want MaxUint64", got)
	}
}

func scrape(t *testing.T, r *Registry) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

// Values that differ only in characters a metric name cannot hold, or that
// hold the dots the text names are joined with, stay separate series and the
// scrape succeeds.
func TestRuleSeriesNeverCollide(t *testing.T) {
	r := NewRegistry()
	r.RuleCounter("web", []string{"remote_address_1.2.3.4"}, "total_hits").Add(1)
	r.RuleCounter("web", []string{"remote_address_1.2.3-4"}, "total_hits").Add(2)
	r.RuleCounter("web", []string{"a", "b.c"}, "total_hits").Add(3)
	r.RuleCounter("web", []string{"a", "b.c", "d"}, "total_hits").Add(4)
	// Levels that join to the same text name share its counter, as they
	// share one statsd name in the anchor: one series, never two.
	r.RuleCounter("web", []string{"a", "b", "c"}, "total_hits").Add(10)
	r.RuleCounter("web", []string{"bad\xff"}, "total_hits").Add(5)
	r.Counter("ratelimit.other-name").Inc()
	r.Counter("ratelimit.other_name").Inc() // same Prometheus name: dropped, not a failure
	code, body := scrape(t, r)
	if code != 200 {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="web",key1="remote_address_1.2.3.4"} 1`,
		`ratelimit_service_rate_limit_total_hits{domain="web",key1="remote_address_1.2.3-4"} 2`,
		`ratelimit_service_rate_limit_total_hits{domain="web",key1="a",key2="b.c"} 13`,
		`ratelimit_service_rate_limit_total_hits{domain="web",key1="a",key2="b.c",key3="d"} 4`,
		"ratelimit_service_rate_limit_total_hits{domain=\"web\",key1=\"bad\uFFFD\"} 5",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	if n := strings.Count(body, "ratelimit_other_name 1"); n != 1 {
		t.Errorf("ratelimit_other_name appears %d times, want once:\n%s", n, body)
	}
}

// A value cannot add a line to /stats.
func TestTextEscapesNames(t *testing.T) {
	r := NewRegistry()
	r.RuleCounter("web", []string{"user_a\nratelimit.fake: 999"}, "total_hits").Inc()
	r.RuleCounter("web", []string{"tab\tback\\slash\xff"}, "total_hits").Inc()
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := "ratelimit.service.rate_limit.web.tab\\tback\\\\slash\\xff.total_hits: 1\n" +
		"ratelimit.service.rate_limit.web.user_a\\nratelimit.fake: 999.total_hits: 1\n"
	if b.String() != want {
		t.Errorf("/stats =\n%q\nwant\n%q", b.String(), want)
	}
}

// TestTaggedCounters: counters of one name told apart by tags (the
// anchor's memcache "code") are each in /stats under gostats's tagged
// name, and one Prometheus series each with the tags as labels; timers
// are not in /stats.
func TestTaggedCounters(t *testing.T) {
	r := NewRegistry()
	r.CounterFunc("ratelimit.memcache.increment", func() uint64 { return 3 }, Label{"code", "success"})
	r.CounterFunc("ratelimit.memcache.increment", func() uint64 { return 1 }, Label{"code", "miss"})
	r.Timer("ratelimit_server.ShouldRateLimit.response_time").Record(time.Millisecond)
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if want := "ratelimit.memcache.increment.__code=miss: 1\nratelimit.memcache.increment.__code=success: 3\n"; b.String() != want {
		t.Errorf("/stats = %q, want %q", b.String(), want)
	}
	code, body := scrape(t, r)
	if code != 200 {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
	for _, want := range []string{
		`ratelimit_memcache_increment{code="success"} 3`,
		`ratelimit_memcache_increment{code="miss"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
}

func TestGoRuntime(t *testing.T) {
	r := NewRegistry()
	r.GoRuntime("ratelimit.go")
	counters, gauges := r.Snapshot(), r.Gauges()
	for _, name := range []string{"totalAlloc", "mallocs", "frees", "pauseTotalNs", "numGC"} {
		if _, ok := counters["ratelimit.go."+name]; !ok {
			t.Errorf("no counter ratelimit.go.%s", name)
		}
	}
	for _, name := range []string{"alloc", "sys", "heapAlloc", "heapSys", "heapIdle", "heapInuse", "heapReleased",
		"heapObjects", "nextGC", "lastGC", "gcCPUPercent", "numGoroutine"} {
		if _, ok := gauges["ratelimit.go."+name]; !ok {
			t.Errorf("no gauge ratelimit.go.%s", name)
		}
	}
	if gauges["ratelimit.go.numGoroutine"] < 1 || gauges["ratelimit.go.sys"] <= 0 || counters["ratelimit.go.mallocs"] == 0 {
		t.Errorf("implausible readings: %v %v", counters, gauges)
	}
}
