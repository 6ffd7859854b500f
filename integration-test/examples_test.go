package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// The Envoy examples (examples/envoy) are decoded as Envoy reads them and
// checked for what Envoy itself does not check: a timeout, the V3
// transport, HTTP/2 and the service's default port on the cluster, the
// domain of the rules they ship with. Real Envoy runs them against the
// built service in envoyexamples_test.go.

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
