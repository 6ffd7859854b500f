package stats

import (
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
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
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := "a.first: 1\nf.func: 7\nm.gauge: -3\nz.last: 2\n"
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
			ls = append(ls, l[0]+"="+l[1])
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
