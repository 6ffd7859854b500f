package integration

import (
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/ratelimitd/ratelimit/harness"
)

// The Istio example's patches, applied as Istio applies them to a listener
// the test writes (the rate-limit filter inserted before the router, the
// virtual host's rate_limits merged in), run in real Envoy against the
// built service with the rules the example adds to the ConfigMap.

// istioBootstrap is a listener with one virtual host (named as Istio names
// the one the patch matches) routing everything to the upstream, with the
// EnvoyFilter's two patches applied, and the clusters of the upstream and
// of the service under the name Istio gives it.
const istioBootstrap = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: istio
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: istio
          use_remote_address: true
          route_config:
            name: istio
            virtual_hosts:
            - {{.VirtualHost}}
          http_filters:
          - {{.Filter}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:{{.Upstream}}{{.RLS}}
`

// istioEnvoy applies the EnvoyFilter in file to istioBootstrap and starts
// Envoy with it in front of up and p.
func istioEnvoy(t *testing.T, file string, up *upstream, p *proc) *envoyProc {
	t.Helper()
	ef := loadEnvoyFilter(t, istioExample+"/"+file)
	vh := &routev3.VirtualHost{Domains: []string{"*"}, Routes: []*routev3.Route{{
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "upstream"}}},
	}}}
	var filter string
	for _, patch := range ef.spec.GetConfigPatches() {
		switch patch.GetApplyTo() {
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			// INSERT_BEFORE the router: the filter, as the patch has it.
			filter = string(patchJSON(t, patch))
		case networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST:
			// The virtual host the patch matches: by name when it gives one.
			vh.Name = patch.GetMatch().GetRouteConfiguration().GetVhost().GetName()
			if vh.Name == "" {
				vh.Name = "istio"
			}
			// MERGE is a proto merge of the value into the virtual host.
			frag := &routev3.VirtualHost{}
			if err := protojson.Unmarshal(patchJSON(t, patch), frag); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			proto.Merge(vh, frag)
		}
	}
	vhJSON, err := protojson.Marshal(vh)
	if err != nil {
		t.Fatal(err)
	}
	return startEnvoy(t, envoyConfig(t, istioBootstrap, map[string]string{
		"VirtualHost": string(vhJSON),
		"Filter":      filter,
		"Upstream":    httpCluster("upstream", up.addr),
		"RLS":         rlsCluster(ratelimitCluster(t), p.grpc),
	}))
}

// TestRealEnvoyIstioExample drives both EnvoyFilters' requests through
// real Envoy: each is admitted up to its rule's limit and refused after,
// the hits land on the rules meant for them, and every rule the example
// adds is reached.
func TestRealEnvoyIstioExample(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	counts := newRedisCounts(t, r)
	ruleFiles := map[string]string{}
	var cm configMapObject
	readYAML(t, istioExample+"/rules.yaml", &cm)
	for name, text := range cm.Data {
		ruleFiles[name] = text
	}
	p := start(t, ruleFiles, redisEnv(r)...)
	up := startUpstream(t)

	tests := []struct {
		file  string
		cases []envoyHTTPCase
	}{
		{file: "gateway-envoyfilter.yaml", cases: []envoyHTTPCase{
			// (remote_address) 100 a minute; (path=/login)(remote_address)
			// 5 per 5 minutes, a sliding window: the login rule decides.
			{name: "gateway_login", path: "/login", admitted: 5,
				rules:   []string{"ingress.path_/login.remote_address", "ingress.remote_address"},
				counted: map[string]int64{"ingress_remote_address_127.0.0.1_": 6}},
			// Only (remote_address): 100 a minute, a fixed window.
			{name: "gateway_other", path: "/products", admitted: 100,
				rules:   []string{"ingress.remote_address"},
				counted: map[string]int64{"ingress_remote_address_127.0.0.1_": 101}},
		}},
		{file: "sidecar-envoyfilter.yaml", cases: []envoyHTTPCase{
			// (generic_key=httpbin)(user=alice) 10 a minute and
			// (path=/status/418), matched by /status/*, 5 a minute.
			{name: "sidecar_user_status", path: "/status/418", headers: map[string]string{"x-user-id": "alice"}, admitted: 5,
				rules:   []string{"httpbin.generic_key_httpbin.user", "httpbin.path_/status/*"},
				counted: map[string]int64{"httpbin_generic_key_httpbin_user_alice_": 6, "httpbin_path_/status/418_": 6}},
			// (generic_key=httpbin)(user=bob); (path=/get) has no rule.
			{name: "sidecar_user_other_path", path: "/get", headers: map[string]string{"x-user-id": "bob"}, admitted: 10,
				rules:   []string{"httpbin.generic_key_httpbin.user"},
				counted: map[string]int64{"httpbin_generic_key_httpbin_user_bob_": 11}},
		}},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSuffix(tt.file, ".yaml"), func(t *testing.T) {
			e := istioEnvoy(t, tt.file, up, p)
			addr := e.listener(t, "istio")
			for _, c := range tt.cases {
				t.Run(c.name, func(t *testing.T) {
					counts.flush(t)
					awaitWindowRoom(t, time.Minute, 5*time.Second)
					driveEnvoy(t, p, addr, up, c)
					for prefix, want := range c.counted {
						if got := counts.fixedWindowSum(t, prefix); got != want {
							t.Errorf("Redis %s*: %d hits, want %d", prefix, got, want)
						}
					}
				})
			}
		})
	}

	// A token bucket of 20 a second holding 40, for each API key: the
	// first 40 in a burst pass, and within the time the burst took no
	// more than the refill allows.
	t.Run("gateway_api_key", func(t *testing.T) {
		e := istioEnvoy(t, "gateway-envoyfilter.yaml", up, p)
		addr := e.listener(t, "istio")
		counts.flush(t)
		began := time.Now()
		admitted := 0
		for range 200 {
			r := httpGet(t, addr, "/api/v1/things", map[string]string{"x-api-key": "k1"})
			if r.code == 429 {
				break
			}
			if r.code != 200 {
				t.Fatalf("HTTP %d %q", r.code, r.body)
			}
			admitted++
		}
		refill := int(20*time.Since(began).Seconds()) + 1
		if admitted < 40 || admitted > 40+refill {
			t.Errorf("admitted %d before the first 429 in %v, want 40 to %d (burst 40, 20 a second)", admitted, time.Since(began), 40+refill)
		}
	})

	cfg := istioRules(t)
	everyRuleReached(t, p, cfg, "examples/istio")
}
