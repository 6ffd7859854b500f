package kubernetes

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// The Helm chart (charts/ratelimit) is rendered with Helm's own packages,
// as `helm template` does, and its objects pass the same checks as the
// plain manifests.

const chartDir = "../../charts/ratelimit"

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return ch
}

// render renders the chart with values (YAML) for a release named
// "ratelimit", validating the values against values.schema.json.
func render(t *testing.T, ch *chart.Chart, values string) (map[string]string, error) {
	t.Helper()
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals,
		chartutil.ReleaseOptions{Name: "ratelimit", Namespace: "rl", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// renderObjects renders and decodes the chart's objects.
func renderObjects(t *testing.T, ch *chart.Chart, values string) *objects {
	t.Helper()
	out, err := render(t, ch, values)
	if err != nil {
		t.Fatalf("rendering: %v", err)
	}
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	slices.Sort(names)
	objs := newObjects()
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		decodeObjects(t, name, []byte(out[name]), objs)
	}
	return objs
}

func TestChartRenders(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name   string
		values string
		want   want
	}{
		{name: "defaults", values: ``,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memory", replicas: 1}},
		{name: "redis", values: `
replicaCount: 3
store:
  type: redis
  redis: {url: "redis-master:6379", auth: {existingSecret: redis, key: password}}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "redis", replicas: 3}},
		{name: "memcache_autoscaled", values: `
store:
  type: memcache
  memcache: {hostPorts: ["memcached-0.memcached:11211", "memcached-1.memcached:11211"]}
autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 6}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memcache", hpa: true}},
		{name: "tls", values: `
tls: {enabled: true, secretName: ratelimit-tls, clientCA: true}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memory", tlsSecret: "ratelimit-tls"}},
		{name: "json_published_over_mTLS", values: `
tls: {enabled: true, secretName: ratelimit-tls, clientCA: true}
service: {json: true}
networkPolicy: {jsonFrom: [{namespaceSelector: {matchLabels: {team: payments}}}]}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memory", tlsSecret: "ratelimit-tls", json: true}},
		{name: "no_network_policy", values: `
networkPolicy: {enabled: false}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memory", noNetworkPolicy: true}},
		{name: "existing_rules", values: `
rules: {existingConfigMap: my-rules}
`,
			want: want{name: "ratelimit", rulesConfigMap: "my-rules", external: true, backend: "memory"}},
		{name: "metrics", values: `
metrics: {enabled: true, serviceMonitor: {enabled: true, labels: {release: prometheus}}}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memory", serviceMonitor: true}},
		{name: "inline_rules", values: `
rules:
  files:
    default.yaml: null
    api.yaml: |
      domain: api
      descriptors:
        - key: api_key
          rate_limit: {unit: minute, requests_per_unit: 60, algorithm: sliding_window}
`,
			want: want{name: "ratelimit", rulesConfigMap: "ratelimit-rules", backend: "memory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRatelimit(t, renderObjects(t, ch, tt.values), tt.want)
		})
	}
}

// TestChartNetworkPolicyPeers: the peers of the values are the rules'
// sources, each for its own port; no peers lets in any source.
func TestChartNetworkPolicyPeers(t *testing.T) {
	objs := renderObjects(t, loadChart(t), `
service: {json: true}
metrics: {enabled: true}
networkPolicy:
  grpcFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: envoy-gateway-system}}}]
  jsonFrom: [{podSelector: {matchLabels: {app: billing}}}]
`)
	np := objs.networkPolicies["ratelimit"]
	if np == nil {
		t.Fatal("no NetworkPolicy ratelimit")
	}
	from := map[string]string{}
	for _, r := range np.Spec.Ingress {
		from[r.Ports[0].Port.String()] = fmt.Sprint(r.From)
	}
	for port, want := range map[string]string{
		"grpc":    "envoy-gateway-system",
		"http":    "billing",
		"metrics": "[]",
	} {
		if !strings.Contains(from[port], want) {
			t.Errorf("port %s: from %s, want %s", port, from[port], want)
		}
	}
}

// TestChartRefusesBadValues: values that would give a pod that cannot
// start, or that silently does something else, fail at render time with
// a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name   string
		values string
		want   string
	}{
		{name: "unknown_store", values: `store: {type: dynamo}`, want: "/store/type"},
		{name: "redis_without_url", values: `store: {type: redis}`, want: "store.redis.url"},
		{name: "memcache_without_servers", values: `store: {type: memcache}`, want: "store.memcache"},
		{name: "tls_without_secret", values: `tls: {enabled: true}`, want: "tls.secretName"},
		{name: "service_monitor_without_metrics", values: `metrics: {serviceMonitor: {enabled: true}}`, want: "metrics.enabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(t, ch, tt.values)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("rendering with %s: error %v, want one naming %s", tt.values, err, tt.want)
			}
		})
	}
}

// TestChartLint: Helm's linter (the lint package behind `helm lint`)
// finds no warning or error with the default values. INFO messages (an
// icon is recommended) do not fail `helm lint` either; they are logged.
func TestChartLint(t *testing.T) {
	l := lint.All(chartDir, nil, "rl", false)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		} else {
			t.Logf("helm lint: %s", m)
		}
	}
}
