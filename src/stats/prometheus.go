package stats

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the registry in the Prometheus exposition format. Names are
// mapped as envoyproxy/ratelimit's default statsd-exporter mapping does, so
// dashboards built on the anchor keep working:
//
//	ratelimit.service.rate_limit.D.K1[.K2].stat -> ratelimit_service_rate_limit_stat{domain=D,key1=K1[,key2=K2]}
//	ratelimit.service.call.should_rate_limit.E  -> ratelimit_service_should_rate_limit_error{err_type=E}
//	ratelimit_server.M.total_requests           -> ratelimit_service_total_requests{grpc_method=M}
//
// Any other name has its dots and dashes replaced by underscores.
func (r *Registry) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{r})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

type collector struct{ r *Registry }

// Describe sends nothing: the metric set changes as rules do, which makes
// this an "unchecked" collector.
func (collector) Describe(chan<- *prometheus.Desc) {}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for name, v := range c.r.Snapshot() {
		pname, labels := promName(name)
		keys := make([]string, 0, len(labels))
		vals := make([]string, 0, len(labels))
		for _, l := range labels {
			keys = append(keys, l[0])
			vals = append(vals, l[1])
		}
		desc := prometheus.NewDesc(pname, "", keys, nil)
		if m, err := prometheus.NewConstMetric(desc, prometheus.CounterValue, float64(v), vals...); err == nil {
			ch <- m
		}
	}
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

var ruleStats = map[string]bool{
	"total_hits": true, "over_limit": true, "near_limit": true, "within_limit": true,
	"shadow_mode": true, "over_limit_with_local_cache": true,
}

// promName maps a statsd-style name to a Prometheus name and labels.
func promName(name string) (string, [][2]string) {
	parts := strings.Split(name, ".")
	switch {
	case len(parts) == 6 || len(parts) == 7:
		if parts[0] == "ratelimit" && parts[1] == "service" && parts[2] == "rate_limit" && ruleStats[parts[len(parts)-1]] {
			labels := [][2]string{{"domain", parts[3]}, {"key1", parts[4]}}
			if len(parts) == 7 {
				labels = append(labels, [2]string{"key2", parts[5]})
			}
			return "ratelimit_service_rate_limit_" + parts[len(parts)-1], labels
		}
	case len(parts) == 5 && strings.HasPrefix(name, "ratelimit.service.call.should_rate_limit."):
		return "ratelimit_service_should_rate_limit_error", [][2]string{{"err_type", parts[4]}}
	case len(parts) == 3 && parts[0] == "ratelimit_server" && parts[2] == "total_requests":
		return "ratelimit_service_total_requests", [][2]string{{"grpc_method", parts[1]}}
	}
	return unsafeChars.ReplaceAllString(name, "_"), nil
}
