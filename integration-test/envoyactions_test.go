package integration

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// httpBootstrap is a bootstrap with one HTTP listener ("http", codec
// AUTO, so gRPC clients reach it in plaintext too) whose routes and filters
// (before the router) the test gives, an access log of every request to
// AccessLog (the rate-limit filter's dynamic metadata, the response flags
// and the status), and the clusters of the upstream and of the service.
const httpBootstrap = `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: http
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: http
          codec_type: AUTO
          use_remote_address: true
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {{.AccessLog}}
              log_format:
                text_format_source:
                  inline_string: "%RESPONSE_CODE% %REQ(:PATH)% flags=%RESPONSE_FLAGS% md=%DYNAMIC_METADATA(envoy.filters.http.ratelimit)%\n"
          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:{{.Routes}}
          http_filters:{{.Filters}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:{{.Upstream}}{{.RLS}}{{.Clusters}}
`

// envoyHTTP is the parts of httpBootstrap a test writes.
type envoyHTTP struct {
	// Routes are the virtual host's routes, YAML list items indented by 14.
	Routes string
	// Filters are HTTP filters before the router, list items indented by 10.
	Filters string
	// Clusters are more clusters, list items indented by 2.
	Clusters string
	// RLS, when set, replaces the service's cluster (rlsCluster).
	RLS string
}

// startEnvoyHTTP starts Envoy with httpBootstrap: cfg's routes and filters,
// the upstream up as cluster "upstream" and the service p as "ratelimit".
// It returns Envoy and the path of its access log.
func startEnvoyHTTP(t *testing.T, cfg envoyHTTP, up *upstream, p *proc) (*envoyProc, string) {
	t.Helper()
	accessLog := t.TempDir() + "/access.log"
	if cfg.RLS == "" {
		cfg.RLS = rlsCluster("ratelimit", p.grpc)
	}
	e := startEnvoy(t, envoyConfig(t, httpBootstrap, map[string]string{
		"AccessLog": accessLog,
		"Routes":    cfg.Routes,
		"Filters":   cfg.Filters,
		"Clusters":  cfg.Clusters,
		"Upstream":  httpCluster("upstream", up.addr),
		"RLS":       cfg.RLS,
	}))
	return e, accessLog
}

// rateLimitFilter is Envoy's rate-limit HTTP filter for domain calling the
// cluster "ratelimit", with more fields (indented by 14) after the usual.
func rateLimitFilter(domain, extra string) string {
	return `
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: ` + domain + `
              timeout: 2s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: ratelimit}}` + extra
}

// actionRules are the rules of TestRealEnvoyActions, one per action.
const actionRules = `domain: actions
descriptors:
  - key: masked_remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: query_match
    value: beta
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: meta_tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: generic_key
    value: override
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// actionRoutes are one route per action the examples do not use.
const actionRoutes = `
              - match: {prefix: /masked}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - masked_remote_address: {v4_prefix_mask_len: 24}
              - match: {prefix: /query}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - query_parameters: {query_parameter_name: tenant, descriptor_key: tenant}
              - match: {prefix: /beta}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - query_parameter_value_match:
                        descriptor_key: query_match
                        descriptor_value: beta
                        query_parameters:
                        - name: channel
                          string_match: {exact: beta}
              - match: {prefix: /meta}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - metadata:
                        descriptor_key: meta_tenant
                        metadata_key: {key: test.tenant, path: [{key: tenant}]}
                        source: DYNAMIC
              - match: {prefix: /override}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_value: override}
                    limit:
                      dynamic_metadata:
                        metadata_key: {key: test.override, path: [{key: limit}]}
              - match: {prefix: /plain}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_value: override}
`

// actionFilters put the x-tenant header into dynamic metadata
// (header_to_metadata) and a limit override of 2 a minute (set_metadata)
// before the rate-limit filter.
const actionFilters = `
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              request_rules:
              - header: x-tenant
                on_header_present: {metadata_namespace: test.tenant, key: tenant, type: STRING}
          - name: envoy.filters.http.set_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: test.override
                value:
                  limit: {requests_per_unit: 2, unit: MINUTE}`

// TestRealEnvoyActions sends requests through real Envoy for the route
// actions the examples do not use: masked_remote_address,
// query_parameters, query_parameter_value_match, metadata from dynamic
// metadata (Envoy 1.40 refuses the deprecated dynamic_metadata action at
// load), and a limit override Envoy reads from dynamic metadata. Each is admitted up to its limit, refused after,
// counted on its rule and in Redis under the key the anchor would use.
func TestRealEnvoyActions(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	counts := newRedisCounts(t, r)
	p := start(t, map[string]string{"actions.yaml": actionRules}, redisEnv(r)...)
	up := startUpstream(t)
	e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: actionRoutes, Filters: actionFilters + rateLimitFilter("actions", "")}, up, p)
	addr := e.listener(t, "http")

	cases := []envoyHTTPCase{
		{name: "masked_remote_address", path: "/masked", admitted: 3,
			rules:   []string{"actions.masked_remote_address"},
			counted: map[string]int64{"actions_masked_remote_address_127.0.0.0/24_": 4}},
		{name: "query_parameters", path: "/query?tenant=acme", admitted: 3,
			rules:   []string{"actions.tenant"},
			counted: map[string]int64{"actions_tenant_acme_": 4}},
		// Another value of the parameter counts apart.
		{name: "query_parameters_other_value", path: "/query?tenant=globex", admitted: 3,
			rules:   []string{"actions.tenant"},
			counted: map[string]int64{"actions_tenant_globex_": 4}},
		{name: "query_parameter_value_match", path: "/beta?channel=beta", admitted: 3,
			rules:   []string{"actions.query_match_beta"},
			counted: map[string]int64{"actions_query_match_beta_": 4}},
		{name: "metadata", path: "/meta", headers: map[string]string{"x-tenant": "initech"}, admitted: 3,
			rules:   []string{"actions.meta_tenant"},
			counted: map[string]int64{"actions_meta_tenant_initech_": 4}},
		// The rule says 10 a minute; Envoy's override from the metadata
		// says 2, and the service applies the override. Its hits are
		// counted per key path (a documented difference: the anchor counts
		// them per value too, which a client could grow without bound).
		{name: "limit_override", path: "/override", admitted: 2,
			rules:   []string{"actions.generic_key"},
			counted: map[string]int64{"actions_generic_key_override_": 3}},
		// The same descriptor without the override: the rule's 10, on the
		// same counter (the anchor's key has no limit in it), 3 taken.
		{name: "without_override", path: "/plain", admitted: 7,
			rules:   []string{"actions.generic_key_override"},
			counted: map[string]int64{"actions_generic_key_override_": 11}},
	}
	// One window for all: the override and the rule share a counter.
	awaitWindowRoom(t, time.Minute, 15*time.Second)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			driveEnvoy(t, p, addr, up, c)
			for prefix, want := range c.counted {
				if got := counts.fixedWindowSum(t, prefix); got != want {
					t.Errorf("Redis %s*: %d hits, want %d", prefix, got, want)
				}
			}
		})
	}

	// Without the parameter or the header, the action produces nothing and
	// Envoy sends no descriptor: never limited, nothing counted.
	t.Run("absent", func(t *testing.T) {
		before := ruleHits(t, p)
		for _, path := range []string{"/query", "/beta?channel=stable", "/meta"} {
			for range 5 {
				if r := httpGet(t, addr, path, nil); r.code != 200 {
					t.Fatalf("%s: HTTP %d, want 200 (no descriptor)", path, r.code)
				}
			}
		}
		for rule, n := range ruleHits(t, p) {
			if n != before[rule] {
				t.Errorf("rule %s counted %d more hits from requests that make no descriptor", rule, n-before[rule])
			}
		}
	})
	everyRuleReached(t, p, parseRules(t, rules.File{Name: "actions.yaml", Data: []byte(actionRules)}), "the actions' routes")
}
