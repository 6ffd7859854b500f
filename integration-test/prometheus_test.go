package integration

import (
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ratelimitd/ratelimit/harness"
)

// scrapeMetrics gets url and parses the Prometheus exposition.
func scrapeMetrics(t *testing.T, p *proc, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := p.get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d:\n%s", url, code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("GET %s does not parse: %v\n%s", url, err, body)
	}
	return mfs
}

// series returns the metric of family name with exactly the labels want
// (name=value,... sorted by name); nil when there is none.
func series(mfs map[string]*dto.MetricFamily, name, want string) *dto.Metric {
	for _, m := range mfs[name].GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		if strings.Join(ls, ",") == want {
			return m
		}
	}
	return nil
}

const promRules = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// TestPrometheusSeries runs the binary on Redis behind a proxy that adds
// 50 ms to every reply, with USE_PROMETHEUS, and reads the new series
// over the wire: the response time per RPC (gRPC one call in eight, /json
// every call) in seconds, or in milliseconds with
// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS; the decisions by domain and
// code; the Redis round trips (always seconds) and pipeline sizes; the
// time of the last rules loaded. Both Prometheus endpoints agree.
func TestPrometheusSeries(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	px := harness.StartProxy(t, r.Addr)
	const latency = 50 * time.Millisecond
	for _, tt := range []struct {
		name string
		env  []string
		unit float64 // of the response time, per second
	}{
		{name: "seconds", unit: 1},
		{name: "milliseconds", env: []string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true"}, unit: 1000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			px.SetLatency(0)
			env := append([]string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + px.Addr,
				"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0"}, tt.env...)
			before := time.Now().Unix()
			p := start(t, map[string]string{"web.yaml": promRules}, env...)
			px.SetLatency(latency)
			c := p.client(t)
			for i := range 8 { // the first is timed and counts for 8
				if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", tt.name+"-a")); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			for range 2 {
				if code, body := p.postJSON(t, `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"`+tt.name+`-b"}]}]}`); code != http.StatusOK {
					t.Fatalf("/json = %d %s", code, body)
				}
			}
			if _, err := c.ShouldRateLimit(callCtx(t), request("elsewhere", "user", "x")); err != nil {
				t.Fatal(err)
			}

			mfs := scrapeMetrics(t, p, "http://"+p.prom+"/metrics")
			debug := scrapeMetrics(t, p, "http://"+p.debug+"/metrics")
			for name := range mfs {
				if _, ok := debug[name]; !ok {
					t.Errorf("%s on PROMETHEUS_ADDR but not on the debug port", name)
				}
			}

			rt := func(method string, wantCount uint64) {
				t.Helper()
				m := series(mfs, "ratelimit_service_response_time_seconds", "grpc_method="+method)
				if m == nil {
					t.Fatalf("no ratelimit_service_response_time_seconds{grpc_method=%q}", method)
				}
				h := m.GetHistogram()
				if h.GetSampleCount() != wantCount {
					t.Errorf("%s: count %d, want %d", method, h.GetSampleCount(), wantCount)
				}
				mean := h.GetSampleSum() / float64(h.GetSampleCount())
				if lo, hi := latency.Seconds()*tt.unit, 2*tt.unit; mean < lo || mean > hi {
					t.Errorf("%s: mean %v, want between %v and %v (a Redis round trip of %v, in 1/%v s)", method, mean, lo, hi, latency, tt.unit)
				}
			}
			rt("ShouldRateLimit", 8)
			rt("json", 2)

			trips := series(mfs, "ratelimit_redis_round_trip_seconds", "")
			if trips == nil || trips.GetHistogram().GetSampleCount() < 10 {
				t.Fatalf("ratelimit_redis_round_trip_seconds: %v, want at least 10 round trips", trips)
			}
			var under uint64
			for _, b := range trips.GetHistogram().GetBucket() {
				if b.GetUpperBound() < latency.Seconds() {
					under = b.GetCumulativeCount()
				}
			}
			if under != 0 {
				t.Errorf("%d round trips under the proxy's %v", under, latency)
			}
			cmds := series(mfs, "ratelimit_redis_pipeline_commands", "")
			if cmds == nil || cmds.GetHistogram().GetSampleSum() < 10 {
				t.Errorf("ratelimit_redis_pipeline_commands: %v, want a command or more for each of 10 decisions", cmds)
			}

			for labels, want := range map[string]float64{
				"code=OK,domain=web": 10, "code=OVER_LIMIT,domain=web": 0,
				"code=OK,domain=_unknown": 1,
			} {
				m := series(mfs, "ratelimit_service_decisions", labels)
				if m == nil || m.GetCounter().GetValue() != want {
					t.Errorf("ratelimit_service_decisions{%s} = %v, want %v", labels, m, want)
				}
			}
			loaded := series(mfs, "ratelimit_service_config_load_success_timestamp_seconds", "")
			if v := loaded.GetGauge().GetValue(); v < float64(before) || v > float64(time.Now().Unix()) {
				t.Errorf("config_load_success_timestamp_seconds = %v, want between %d and now", v, before)
			}
		})
	}
}

// TestPrometheusMapper: PROMETHEUS_MAPPER_YAML names the series from the
// statsd names, on both Prometheus endpoints; a file that does not load
// stops the start with an error naming it.
func TestPrometheusMapper(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "mapping.yaml")
	if err := os.WriteFile(good, []byte(`
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "web_hits"
    labels:
      domain: "$1"
      who: "$2"
  - match: "ratelimit_server.*.response_time"
    name: "rl_latency_seconds"
    timer_type: histogram
    scale: 0.001
    labels:
      rpc: "$1"
  - match: "ratelimit.go.*"
    name: "dropped"
    action: drop
`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, map[string]string{"web.yaml": promRules},
		"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0", "PROMETHEUS_MAPPER_YAML="+good)
	for range 3 {
		if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "alice")); err != nil {
			t.Fatal(err)
		}
	}
	for _, url := range []string{"http://" + p.prom + "/metrics", "http://" + p.debug + "/metrics"} {
		mfs := scrapeMetrics(t, p, url)
		// A rule without a value counts under its key, as the anchor's.
		if m := series(mfs, "web_hits", "domain=web,who=user"); m.GetCounter().GetValue() != 3 {
			t.Errorf("%s: web_hits{domain=web,who=user} = %v, want 3", url, m)
		}
		if m := series(mfs, "rl_latency_seconds", "rpc=ShouldRateLimit"); m.GetHistogram().GetSampleCount() != 8 ||
			m.GetHistogram().GetSampleSum() > 1 || math.IsNaN(m.GetHistogram().GetSampleSum()) {
			t.Errorf("%s: rl_latency_seconds = %v, want 8 decisions of well under a second", url, m)
		}
		for name := range mfs {
			if strings.HasPrefix(name, "ratelimit_go_") || name == "dropped" {
				t.Errorf("%s: %s is exported; the mapping drops it", url, name)
			}
		}
		// Unmapped statistics keep their statsd names, escaped.
		if series(mfs, "ratelimit_service_config_load_success", "") == nil {
			t.Errorf("%s: no ratelimit_service_config_load_success", url)
		}
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("mappings:\n  - match: a.b\n    name: \"not a name\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, path, want string }{
		{"invalid", bad, "doesn't match"},
		{"missing", filepath.Join(dir, "missing.yaml"), "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := launch(t, map[string]string{"web.yaml": promRules}, "USE_STATSD=false", "USE_PROMETHEUS=true",
				"PROMETHEUS_ADDR=127.0.0.1:0", "PROMETHEUS_MAPPER_YAML="+tt.path)
			if code := p.wait(t, 30*time.Second); code == 0 {
				t.Fatal("started with a mapping that does not load")
			}
			logs := p.logs()
			for _, w := range []string{"PROMETHEUS_MAPPER_YAML", tt.path, tt.want} {
				if !strings.Contains(logs, w) {
					t.Errorf("stderr does not say %q:\n%s", w, logs)
				}
			}
		})
	}
}
