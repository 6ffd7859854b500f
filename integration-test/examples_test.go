package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// The Envoy examples (examples/envoy) are checked as Envoy would read
// them, their descriptors are computed from their route actions on sample
// requests, each must land on the rule of examples/compose/rules/demo.yaml
// it is meant for, and the built service must answer those descriptors OK
// and then OVER_LIMIT at the rule's limit.

const (
	envoyExamples = "../examples/envoy"
	demoRules     = "../examples/compose/rules/demo.yaml"
)

// parseRules parses rule files as the service does.
func parseRules(t *testing.T, files ...rules.File) *rules.Config {
	t.Helper()
	cfg, err := rules.Parse(files, rules.Options{})
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return cfg
}

func readRules(t *testing.T, path string) rules.File {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return rules.File{Name: filepath.Base(path), Data: data}
}

// sample is a request to one of the examples and the rules its
// descriptors are meant for, by FullKey, in the order Envoy sends them.
type sample struct {
	name string
	file string // the bootstrap, in examples/envoy
	req  sampleRequest
	want []string
}

var envoySamples = []sample{
	{name: "login", file: "envoy.yaml",
		req:  sampleRequest{path: "/login", remote: "192.0.2.1"},
		want: []string{"demo.path_/login.remote_address", "demo.remote_address"}},
	{name: "api_free_plan", file: "envoy.yaml",
		req:  sampleRequest{path: "/api/items", remote: "192.0.2.2", headers: map[string]string{"x-api-key": "key-free", "x-plan": "free"}},
		want: []string{"demo.api_key", "demo.generic_key_api.plan_free.api_key", "demo.remote_address"}},
	{name: "api_pro_plan", file: "envoy.yaml",
		req:  sampleRequest{path: "/api/items", remote: "192.0.2.3", headers: map[string]string{"x-api-key": "key-pro", "x-plan": "pro"}},
		want: []string{"demo.api_key", "demo.generic_key_api.plan_pro.api_key", "demo.remote_address"}},
	{name: "api_without_key", file: "envoy.yaml",
		req:  sampleRequest{path: "/api/items", remote: "192.0.2.4"},
		want: []string{"demo.remote_address"}},
	{name: "anything_else", file: "envoy.yaml",
		req:  sampleRequest{path: "/index.html", remote: "192.0.2.5"},
		want: []string{"demo.remote_address"}},
	{name: "tcp_connection", file: "envoy-tcp.yaml",
		want: []string{"demo.listener_tcp_echo"}},
}

// evaluated is a sample's descriptors with the rules they matched.
type evaluated struct {
	domain string
	descs  [][]rules.Entry
	limits []*rules.Limit
}

// evaluate computes the descriptors of a sample from the filters of its
// bootstrap and matches them against cfg.
func evaluate(t *testing.T, filters []rlsFilter, s sample, cfg *rules.Config) evaluated {
	t.Helper()
	var ev evaluated
	for _, f := range filters {
		ev.domain = f.domain
		if f.network != nil {
			ev.descs = append(ev.descs, networkDescriptors(f.network)...)
			continue
		}
		vh, rt := route(t, f.routes, s.req)
		if rt == nil {
			t.Fatalf("%s: no route for %s", s.name, s.req.path)
		}
		ev.descs = append(ev.descs, descriptors(t, routeLimits(vh, rt), s.req)...)
	}
	for _, d := range ev.descs {
		ev.limits = append(ev.limits, cfg.Match(ev.domain, d).Limit)
	}
	return ev
}

// checkSample checks that the evaluated descriptors land on s.want.
func checkSample(t *testing.T, s sample, ev evaluated) {
	t.Helper()
	var got []string
	for i, l := range ev.limits {
		if l == nil {
			got = append(got, fmt.Sprintf("no rule for %v", ev.descs[i]))
			continue
		}
		got = append(got, l.FullKey)
	}
	if !slices.Equal(got, s.want) {
		t.Errorf("%s: descriptors %v match %q, want %q", s.name, ev.descs, got, s.want)
	}
}

func TestEnvoyExamplesDecodeAndValidate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(envoyExamples, "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("examples/envoy: %v, %v", files, err)
	}
	cfg := parseRules(t, readRules(t, demoRules))
	var sawHTTP, sawNetwork bool
	for _, path := range files {
		b := loadBootstrap(t, path)
		filters := rateLimitFilters(t, b)
		if len(filters) == 0 {
			t.Errorf("%s: no rate-limit filter", path)
		}
		clusters := map[string]*clusterv3.Cluster{}
		for _, c := range b.GetStaticResources().GetClusters() {
			clusters[c.GetName()] = c
		}
		for _, f := range filters {
			if !cfg.HasDomain(f.domain) {
				t.Errorf("%s: filter domain %q is not a domain of %s", path, f.domain, demoRules)
			}
			checkRLSCluster(t, path, clusters[f.cluster], f.cluster)
			var svc interface {
				GetTransportApiVersion() corev3.ApiVersion
			}
			if f.http != nil {
				sawHTTP = true
				svc = f.http.GetRateLimitService()
				if f.http.GetTimeout() == nil {
					t.Errorf("%s: the HTTP filter has no timeout", path)
				}
				if f.http.GetEnableXRatelimitHeaders().String() != "DRAFT_VERSION_03" {
					t.Errorf("%s: enable_x_ratelimit_headers = %v, want DRAFT_VERSION_03", path, f.http.GetEnableXRatelimitHeaders())
				}
			} else {
				sawNetwork = true
				svc = f.network.GetRateLimitService()
				if f.network.GetTimeout() == nil {
					t.Errorf("%s: the network filter has no timeout", path)
				}
			}
			if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
				t.Errorf("%s: rate_limit_service.transport_api_version = %v, want V3", path, svc.GetTransportApiVersion())
			}
		}
	}
	if !sawHTTP || !sawNetwork {
		t.Errorf("examples/envoy: HTTP filter %v, network filter %v; want both", sawHTTP, sawNetwork)
	}
}

// checkRLSCluster: the filter's cluster exists, speaks HTTP/2 (gRPC needs
// it) and points at the service's default gRPC port.
func checkRLSCluster(t *testing.T, path string, c *clusterv3.Cluster, name string) {
	t.Helper()
	if c == nil {
		t.Errorf("%s: the filter calls cluster %q, which is not defined", path, name)
		return
	}
	opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	po := &upstreamhttpv3.HttpProtocolOptions{}
	if opts == nil || opts.UnmarshalTo(po) != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("%s: cluster %q does not set HTTP/2 (explicit_http_config.http2_protocol_options): gRPC fails over HTTP/1.1", path, name)
	}
	for _, e := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range e.GetLbEndpoints() {
			if p := lb.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); fmt.Sprint(p) != defaultGRPCPort(t) {
				t.Errorf("%s: cluster %q points at port %d, want the default GRPC_PORT %s", path, name, p, defaultGRPCPort(t))
			}
		}
	}
}

// TestEnvoyExamplesMatchRules: every sample request's descriptors land on
// the rule meant for them, and every rule of the demo rules is reached by
// some sample (a rule no action produces is dead weight or a typo).
func TestEnvoyExamplesMatchRules(t *testing.T) {
	cfg := parseRules(t, readRules(t, demoRules))
	reached := map[string]bool{}
	for _, s := range envoySamples {
		filters := rateLimitFilters(t, loadBootstrap(t, filepath.Join(envoyExamples, s.file)))
		ev := evaluate(t, filters, s, cfg)
		checkSample(t, s, ev)
		for _, l := range ev.limits {
			if l != nil {
				reached[l.FullKey] = true
			}
		}
	}
	for _, l := range cfg.Limits() {
		if !reached[l.FullKey] {
			t.Errorf("rule %s (%s) is reached by no sample of examples/envoy", l.FullKey, l.Source)
		}
	}
}

// TestEnvoyExamplesAgainstService sends the built service exactly the
// descriptors each sample makes: all of them together first, as Envoy
// does (OK), then each alone up to its rule's limit (OK) and one more
// (OVER_LIMIT).
func TestEnvoyExamplesAgainstService(t *testing.T) {
	rulesFile := readRules(t, demoRules)
	cfg := parseRules(t, rulesFile)
	p := start(t, map[string]string{rulesFile.Name: string(rulesFile.Data)})
	c := p.client(t)
	for _, s := range envoySamples {
		filters := rateLimitFilters(t, loadBootstrap(t, filepath.Join(envoyExamples, s.file)))
		ev := evaluate(t, filters, s, cfg)
		driveService(t, c, s.name, ev)
	}
}

// driveService checks the service's answers to the descriptors of ev, each
// counted apart (every sample uses its own client address or key).
func driveService(t *testing.T, c rlsv3.RateLimitServiceClient, name string, ev evaluated) {
	t.Helper()
	all := &rlsv3.RateLimitRequest{Domain: ev.domain}
	for _, d := range ev.descs {
		all.Descriptors = append(all.Descriptors, descriptor(d))
	}
	resp, err := c.ShouldRateLimit(callCtx(t), all)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("%s: first request %v: %v, want OK", name, ev.descs, resp)
	}
	for i, d := range ev.descs {
		l := ev.limits[i]
		if l == nil || l.Unlimited {
			continue
		}
		// The first request counted 1; fill up to the limit in one call,
		// then one more is over it.
		if n := l.Capacity() - 1; n > 0 {
			if code := ask(t, c, ev.domain, d, n); code != rlsv3.RateLimitResponse_OK {
				t.Errorf("%s: %v with %d more hits (to the limit %d of %s): %v, want OK", name, d, n, l.Capacity(), l.FullKey, code)
			}
		}
		if code := ask(t, c, ev.domain, d, 1); code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s: %v past the limit %d of %s: %v, want OVER_LIMIT", name, d, l.Capacity(), l.FullKey, code)
		}
	}
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, d []rules.Entry, hits uint32) rlsv3.RateLimitResponse_Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor(d)}})
	if err != nil {
		t.Fatalf("%v: %v", d, err)
	}
	return resp.GetOverallCode()
}

func descriptor(d []rules.Entry) *ratelimitv3.RateLimitDescriptor {
	out := &ratelimitv3.RateLimitDescriptor{}
	for _, e := range d {
		out.Entries = append(out.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
	}
	return out
}

// defaultGRPCPort is GRPC_PORT's default, from the settings' own tags.
func defaultGRPCPort(t *testing.T) string {
	t.Helper()
	return settingDefault(t, "GRPC_PORT")
}

// settingDefault is the default of an environment setting, read from the
// settings' own struct tags, so that the examples follow any change.
func settingDefault(t *testing.T, name string) string {
	t.Helper()
	st := reflect.TypeFor[settings.Settings]()
	for i := range st.NumField() {
		if f := st.Field(i); f.Tag.Get("envconfig") == name {
			return f.Tag.Get("default")
		}
	}
	t.Fatalf("settings has no %s", name)
	return ""
}
