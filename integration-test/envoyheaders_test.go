package integration

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

// What a client of Envoy sees: the headers, bodies and codes Envoy makes of
// the service's answers, with real Envoy in between.

// headerRules limit (user) to 3 an hour, with metadata for Envoy's dynamic
// metadata, and (shadow) to 2 an hour in shadow mode.
const headerRules = `domain: hdr
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
    metadata:
      plan: gold
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: generic_key
    value: cost
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: generic_key
    value: tokens
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: generic_key
    value: grpc
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// userRoute sends everything to the upstream, limited by (user=x-user).
const userRoute = `
              - match: {prefix: /}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-user, descriptor_key: user}
                  - actions:
                    - request_headers: {header_name: x-shadow, descriptor_key: shadow}`

// sendUntil429 sends GET / as user until the first 429 (at most limit+1
// requests) and returns every response.
func sendUntil429(t *testing.T, addr string, headers map[string]string, limit int) []envoyResponse {
	t.Helper()
	var out []envoyResponse
	for range limit + 1 {
		r := httpGet(t, addr, "/", headers)
		out = append(out, r)
		if r.code != http.StatusOK {
			break
		}
	}
	if last := out[len(out)-1]; len(out) != limit+1 || last.code != http.StatusTooManyRequests {
		t.Fatalf("%d requests, the last HTTP %d %q; want %d 200s then a 429", len(out), last.code, last.body, limit)
	}
	return out
}

// wantHeader checks one header of a response against a pattern.
func wantHeader(t *testing.T, what string, h http.Header, name, pattern string) {
	t.Helper()
	if got := h.Values(name); len(got) != 1 || !regexp.MustCompile(`^(?:`+pattern+`)$`).MatchString(got[0]) {
		t.Errorf("%s: %s = %q, want one value matching %s", what, name, got, pattern)
	}
}

func noHeader(t *testing.T, what string, h http.Header, name string) {
	t.Helper()
	if got := h.Values(name); len(got) != 0 {
		t.Errorf("%s: %s = %q, want none", what, name, got)
	}
}

// TestRealEnvoyHeaders checks the headers and bodies Envoy's clients get:
// Envoy's own draft-03 headers, the service's, the IETF ones, Retry-After,
// the 429 body, the filter's response_headers_to_add and the headers the
// service adds to the request for the upstream.
func TestRealEnvoyHeaders(t *testing.T) {
	up := startUpstream(t)
	rules := map[string]string{"hdr.yaml": headerRules}

	t.Run("envoy_draft03", func(t *testing.T) {
		p := start(t, rules)
		e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: userRoute, Filters: rateLimitFilter("hdr", `
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              enable_retry_after_header: true
              response_headers_to_add:
              - header: {key: x-limited-by, value: ratelimit}`)}, up, p)
		rs := sendUntil429(t, e.listener(t, "http"), map[string]string{"x-user": "envoy-headers"}, 3)
		for i, r := range rs[:3] {
			wantHeader(t, "200", r.header, "x-ratelimit-limit", `3, 3;w=3600`)
			wantHeader(t, "200", r.header, "x-ratelimit-remaining", strconv.Itoa(2-i))
			wantHeader(t, "200", r.header, "x-ratelimit-reset", `[0-9]+`)
			noHeader(t, "200", r.header, "x-limited-by")
			noHeader(t, "200", r.header, "x-envoy-ratelimited")
		}
		r := rs[3]
		wantHeader(t, "429", r.header, "x-envoy-ratelimited", "true")
		wantHeader(t, "429", r.header, "x-ratelimit-remaining", "0")
		wantHeader(t, "429", r.header, "x-limited-by", "ratelimit")
		// Envoy's own Retry-After: the descriptor's duration_until_reset,
		// at least 1 and at most the hour window.
		reset := headerInt(t, r.header, "x-ratelimit-reset")
		if ra := headerInt(t, r.header, "retry-after"); ra < 1 || ra > 3600 || ra != max(reset, 1) {
			t.Errorf("429: retry-after %d with x-ratelimit-reset %d; want the reset, 1 to 3600", ra, reset)
		}
	})

	t.Run("service_draft03", func(t *testing.T) {
		p := start(t, rules, "LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REQUEST_HEADERS_ENABLED=true",
			"LIMIT_RESPONSE_RETRY_AFTER_ENABLED=true", "LIMIT_RESPONSE_BODY_ENABLED=true", "RESPONSE_DYNAMIC_METADATA=true")
		e, accessLog := startEnvoyHTTP(t, envoyHTTP{Routes: userRoute, Filters: rateLimitFilter("hdr", "")}, up, p)
		rs := sendUntil429(t, e.listener(t, "http"), map[string]string{"x-user": "service-headers"}, 3)
		for i, r := range rs[:3] {
			wantHeader(t, "200", r.header, "RateLimit-Limit", "3")
			wantHeader(t, "200", r.header, "RateLimit-Remaining", strconv.Itoa(2-i))
			wantHeader(t, "200", r.header, "RateLimit-Reset", `[0-9]+`)
			noHeader(t, "200", r.header, "Retry-After")
		}
		// The upstream got the same headers with each request it saw.
		_, h := up.seen()
		wantHeader(t, "upstream", h, "RateLimit-Remaining", "0")
		wantHeader(t, "upstream", h, "RateLimit-Limit", "3")

		r := rs[3]
		wantHeader(t, "429", r.header, "x-envoy-ratelimited", "true")
		wantHeader(t, "429", r.header, "RateLimit-Remaining", "0")
		wantHeader(t, "429", r.header, "Content-Type", "application/json")
		retry := headerInt(t, r.header, "Retry-After")
		if reset := headerInt(t, r.header, "RateLimit-Reset"); retry < 1 || retry > 3600 || retry != reset {
			t.Errorf("429: Retry-After %d, RateLimit-Reset %d; want equal, 1 to 3600", retry, reset)
		}
		var body struct {
			Domain     string `json:"domain"`
			Limit      int    `json:"limit"`
			Unit       string `json:"unit"`
			RetryAfter int    `json:"retry_after_seconds"`
		}
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.Domain != "hdr" || body.Limit != 3 || body.Unit != "HOUR" || body.RetryAfter != retry {
			t.Errorf("429 body %q (%v): want the domain hdr, limit 3 an HOUR and retry_after_seconds %d", r.body, err, retry)
		}
		// The rule's metadata reached Envoy's dynamic metadata (its access
		// log) with the allowed requests.
		eventually(t, "the access log", 10*time.Second, func() bool {
			b, _ := os.ReadFile(accessLog)
			return strings.Count(string(b), "\n") >= 4
		})
		b, _ := os.ReadFile(accessLog)
		if !strings.Contains(string(b), `"plan":"gold"`) {
			t.Errorf("Envoy's access log shows no rule metadata in the filter's dynamic metadata:\n%s", b)
		}
	})

	t.Run("service_ietf", func(t *testing.T) {
		p := start(t, rules, "LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_RESPONSE_HEADERS_STYLE=ietf")
		e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: userRoute, Filters: rateLimitFilter("hdr", "")}, up, p)
		rs := sendUntil429(t, e.listener(t, "http"), map[string]string{"x-user": "ietf"}, 3)
		for i, r := range rs {
			wantHeader(t, "answer", r.header, "RateLimit-Policy", `"user";q=3;w=3600`)
			wantHeader(t, "answer", r.header, "RateLimit", `"user";r=`+strconv.Itoa(max(2-i, 0))+`;t=[0-9]+`)
		}
	})

	t.Run("shadow_mode", func(t *testing.T) {
		p := start(t, rules)
		e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: userRoute, Filters: rateLimitFilter("hdr", "")}, up, p)
		addr := e.listener(t, "http")
		for i := range 5 {
			r := httpGet(t, addr, "/", map[string]string{"x-shadow": "tried"})
			if r.code != http.StatusOK {
				t.Fatalf("request %d: HTTP %d, want 200: a shadow rule never refuses", i+1, r.code)
			}
			noHeader(t, "shadow", r.header, "x-envoy-ratelimited")
		}
		if got := p.stats(t)["ratelimit.service.rate_limit.hdr.shadow.shadow_mode"]; got != 3 {
			t.Errorf("ratelimit.service.rate_limit.hdr.shadow.shadow_mode = %d, want 3 (hits 3 to 5 of a limit of 2)", got)
		}
		if n := e.counter(t, "cluster.upstream.ratelimit.over_limit"); n != 0 {
			t.Errorf("envoy cluster.upstream.ratelimit.over_limit = %d, want 0", n)
		}
	})
}

func headerInt(t *testing.T, h http.Header, name string) int {
	t.Helper()
	n, err := strconv.Atoi(h.Get(name))
	if err != nil {
		t.Errorf("%s = %q: %v", name, h.Get(name), err)
	}
	return n
}

// TestRealEnvoyGRPCUpstream limits calls to a gRPC upstream through Envoy:
// over the limit, Envoy answers with gRPC status UNAVAILABLE by default and
// RESOURCE_EXHAUSTED with rate_limited_as_resource_exhausted.
func TestRealEnvoyGRPCUpstream(t *testing.T) {
	backend := startGRPCHealth(t)
	up := startUpstream(t)
	routes := `
              - match: {prefix: /grpc.health.v1.Health/}
                route:
                  cluster: grpc_backend
                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_value: grpc}`
	for _, tt := range []struct {
		name  string
		extra string
		want  codes.Code
	}{
		{name: "default", want: codes.Unavailable},
		{name: "resource_exhausted", extra: `
              rate_limited_as_resource_exhausted: true`, want: codes.ResourceExhausted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := start(t, map[string]string{"hdr.yaml": headerRules})
			e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: routes, Filters: rateLimitFilter("hdr", tt.extra),
				Clusters: rlsCluster("grpc_backend", backend)}, up, p)
			cc, err := grpc.NewClient(e.listener(t, "http"), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			hc := healthpb.NewHealthClient(cc)
			for i := range 3 {
				_, err := hc.Check(callCtx(t), &healthpb.HealthCheckRequest{})
				want := codes.OK
				if i == 2 {
					want = tt.want
				}
				if status.Code(err) != want {
					t.Fatalf("call %d: %v, want %s", i+1, err, want)
				}
			}
		})
	}
}

// startGRPCHealth is a gRPC server with the standard health service, on
// 127.0.0.1 port 0.
func startGRPCHealth(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// TestRealEnvoyHitsAddend: Envoy's hits_addend from a request header (on a
// route's typed_per_filter_config, where Envoy reads it), and
// apply_on_stream_done charging what the upstream's response says, as AI
// gateways charge tokens after the answer.
func TestRealEnvoyHitsAddend(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	counts := newRedisCounts(t, r)
	p := start(t, map[string]string{"hdr.yaml": headerRules}, redisEnv(r)...)
	up := startUpstream(t)
	up.respond = func(_ *http.Request, h http.Header) { h.Set("x-tokens", "4") }
	routes := `
              - match: {prefix: /cost}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{generic_key: {descriptor_value: cost}}]
                      hits_addend: {format: "%REQ(x-cost)%"}
              - match: {prefix: /chat}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    # On the request: check the budget, charge nothing.
                    - actions: [{generic_key: {descriptor_value: tokens}}]
                      hits_addend: {number: 0}
                    # When the response is done: charge its x-tokens.
                    - actions: [{generic_key: {descriptor_value: tokens}}]
                      hits_addend: {format: "%RESP(x-tokens)%"}
                      apply_on_stream_done: true`
	e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: routes, Filters: rateLimitFilter("hdr", "")}, up, p)
	addr := e.listener(t, "http")
	awaitWindowRoom(t, time.Hour, 30*time.Second)

	t.Run("from_a_header", func(t *testing.T) {
		// 10 an hour: 4 + 4 pass, 4 more would make 12.
		for i, want := range []int{200, 200, 429} {
			if r := httpGet(t, addr, "/cost", map[string]string{"x-cost": "4"}); r.code != want {
				t.Fatalf("request %d costing 4: HTTP %d, want %d", i+1, r.code, want)
			}
		}
		// A fixed window counts the refused hits too, as the anchor does.
		if got := counts.fixedWindowSum(t, "hdr_generic_key_cost_"); got != 12 {
			t.Errorf("Redis hdr_generic_key_cost_*: %d, want 12", got)
		}
	})

	t.Run("apply_on_stream_done", func(t *testing.T) {
		// Each answer costs 4 after the fact: 0, 4 and 8 of 10 are under
		// the limit when checked, 12 is over.
		for i, want := range []int{200, 200, 200, 429} {
			if r := httpGet(t, addr, "/chat", nil); r.code != want {
				t.Fatalf("request %d: HTTP %d, want %d", i+1, r.code, want)
			}
			// Envoy charges after the response reached the client: wait
			// for the charge before the next request checks the budget.
			charged := int64(4 * min(i+1, 3))
			eventually(t, "the charge after the response", 10*time.Second, func() bool {
				return counts.fixedWindowSum(t, "hdr_generic_key_tokens_") == charged
			})
		}
	})
}

// TestRealEnvoyStages: two rate-limit filters of different stages each send
// only the route's rate limits of their stage, each to its domain.
func TestRealEnvoyStages(t *testing.T) {
	stage1 := `domain: late
descriptors:
  - key: generic_key
    value: late
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	p := start(t, map[string]string{"hdr.yaml": headerRules, "late.yaml": stage1})
	up := startUpstream(t)
	routes := `
              - match: {prefix: /}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-user, descriptor_key: user}
                  - stage: 1
                    actions:
                    - generic_key: {descriptor_value: late}`
	filters := rateLimitFilter("hdr", "") + rateLimitFilter("late", `
              stage: 1`)
	e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: routes, Filters: filters}, up, p)
	driveEnvoy(t, p, e.listener(t, "http"), up, envoyHTTPCase{name: "stage_1_decides", path: "/", headers: map[string]string{"x-user": "staged"},
		admitted: 2, rules: []string{"hdr.user", "late.generic_key_late"}})
	hits := ruleHits(t, p)
	if hits["hdr.user"] != 3 || hits["late.generic_key_late"] != 3 {
		t.Errorf("hits: hdr.user %d, late.generic_key_late %d; want 3 each: each filter sends its stage's descriptor once per request", hits["hdr.user"], hits["late.generic_key_late"])
	}
}
