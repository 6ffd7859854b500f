package stats

import (
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the registry in the Prometheus exposition format. Names are
// those of envoyproxy/ratelimit's default statsd-exporter mapping, so
// dashboards built on the anchor keep working:
//
//	per rule (RuleCounter)                     -> ratelimit_service_rate_limit_<stat>{domain=D,key1=K1[,key2=K2...]}
//	ratelimit.service.call.should_rate_limit.E -> ratelimit_service_should_rate_limit_error{err_type=E}
//	ratelimit_server.M.total_requests          -> ratelimit_service_total_requests{grpc_method=M}
//
// Any other name has the characters a metric name cannot hold replaced by
// underscores; the tags of a tagged counter (see CounterFunc) are labels.
// Timers are left out.
//
// One bad series never fails the scrape: series are built from the
// registered structure, label values are made valid UTF-8, a series that
// would repeat another is dropped, and the handler serves every metric it
// could gather (promhttp.ContinueOnError) instead of answering 500.
func (r *Registry) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{r})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

type collector struct{ r *Registry }

// Describe sends nothing: the metric set changes as rules do, which makes
// this an "unchecked" collector.
func (collector) Describe(chan<- *prometheus.Desc) {}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	seen := map[string]struct{}{}
	var id strings.Builder
	c.r.metrics.Range(func(_, v any) bool {
		m := v.(*metric)
		if m.timer != nil {
			return true
		}
		name, labels := m.promName, m.labels
		if labels == nil {
			name, labels = promName(m.name)
			if len(m.tags) > 0 {
				labels = append(slices.Clip(labels), m.tags...)
			}
		}
		keys := make([]string, len(labels))
		vals := make([]string, len(labels))
		id.Reset()
		id.WriteString(name)
		for i, l := range labels {
			keys[i] = l.Name
			vals[i] = strings.ToValidUTF8(l.Value, "\uFFFD")
			id.WriteByte(0)
			id.WriteString(keys[i])
			id.WriteByte(0)
			id.WriteString(vals[i])
		}
		if _, dup := seen[id.String()]; dup {
			return true
		}
		seen[id.String()] = struct{}{}

		kind, value := prometheus.CounterValue, 0.0
		switch {
		case m.counter != nil:
			value = float64(m.counter.Value())
		case m.fn != nil:
			value = float64(m.fn())
		case m.gauge != nil:
			kind, value = prometheus.GaugeValue, float64(m.gauge.Value())
		case m.gaugeFn != nil:
			kind, value = prometheus.GaugeValue, float64(m.gaugeFn())
		}
		desc := prometheus.NewDesc(name, "", keys, nil)
		if pm, err := prometheus.NewConstMetric(desc, kind, value, vals...); err == nil {
			ch <- pm
		}
		return true
	})
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

// promSafe replaces the characters a metric name cannot hold.
func promSafe(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

var ruleStats = map[string]bool{
	"total_hits": true, "over_limit": true, "near_limit": true, "within_limit": true,
	"shadow_mode": true, "over_limit_with_local_cache": true,
}

// promName maps a statsd-style name chosen by the code to a Prometheus name
// and labels. Per-rule statistics are registered with their structure
// instead (RuleCounter); the rule shape is still recognised here for names
// registered with Counter.
func promName(name string) (string, []Label) {
	parts := strings.Split(name, ".")
	switch {
	case len(parts) == 6 || len(parts) == 7:
		if parts[0] == "ratelimit" && parts[1] == "service" && parts[2] == "rate_limit" && ruleStats[parts[len(parts)-1]] {
			labels := []Label{{"domain", parts[3]}, {"key1", parts[4]}}
			if len(parts) == 7 {
				labels = append(labels, Label{"key2", parts[5]})
			}
			return "ratelimit_service_rate_limit_" + parts[len(parts)-1], labels
		}
	case len(parts) == 5 && strings.HasPrefix(name, "ratelimit.service.call.should_rate_limit."):
		return "ratelimit_service_should_rate_limit_error", []Label{{"err_type", parts[4]}}
	case len(parts) == 3 && parts[0] == "ratelimit_server" && parts[2] == "total_requests":
		return "ratelimit_service_total_requests", []Label{{"grpc_method", parts[1]}}
	}
	return promSafe(name), nil
}
