package integration

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimit/harness"
)

// egNode is the node id Envoy Gateway gives the rate-limit Deployment.
const egNode = "envoy-ratelimit"

// xdsWeb is domain web: userLimit per hour for each user, pathLimit per
// hour for each path.
func xdsWeb(userLimit, pathLimit uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "web", Domain: "web", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: userLimit}},
		{Key: "path", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: pathLimit}},
	}}
}

func (p *proc) code(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := c.ShouldRateLimit(callCtx(t), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	return resp.GetOverallCode()
}

// waitRules polls /rlconfig until it holds line and returns how long that
// took from since.
func (p *proc) waitRules(t *testing.T, line string, since time.Time) time.Duration {
	t.Helper()
	eventually(t, "/rlconfig with "+line, 10*time.Second, func() bool {
		_, body := p.get(t, "http://"+p.debug+"/rlconfig")
		return strings.Contains(body, line)
	})
	return time.Since(since)
}

// TestXDSOverTheWire runs the built binary on rules from a real xDS
// server: the first snapshot before the ports open (no
// FORCE_START_WITHOUT_INITIAL_CONFIG), changes applied within 2 s with the
// counts of every rule kept, an invalid snapshot NACKed while the rules in
// use answer on, and the xDS server stopped and started again.
func TestXDSOverTheWire(t *testing.T) {
	xds := harness.StartXDS(t, harness.XDSOptions{})
	xds.SetConfigs(t, egNode, xdsWeb(3, 100))
	p := launch(t, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s")
	p.waitHealth(t, http.StatusOK)
	c := p.client(t)
	alice := request("web", "user", "alice")
	for i := range 2 {
		if code := p.code(t, c, alice); code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("alice's hit %d of 3 = %v, want OK", i+1, code)
		}
	}

	// Change another rule: alice's count goes on.
	start := time.Now()
	xds.SetConfigs(t, egNode, xdsWeb(3, 1))
	took := p.waitRules(t, "web.path: unit=HOUR requests_per_unit=1,", start)
	t.Logf("a new snapshot applied in %v", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("a new snapshot took %v to apply, want at most 2s", took)
	}
	if _, body := p.get(t, "http://"+p.debug+"/rlconfig"); !strings.Contains(body, "# source: xds "+xds.Addr) || !strings.Contains(body, "# version: ") {
		t.Errorf("/rlconfig does not say the rules came from the xDS server:\n%s", body)
	}
	if code := p.code(t, c, alice); code != rlsv3.RateLimitResponse_OK {
		t.Errorf("alice's hit 3 of 3 after an update = %v, want OK", code)
	}
	if code := p.code(t, c, alice); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("alice's hit 4 of 3 after an update = %v, want OVER_LIMIT: the update reset her count", code)
	}

	// Raise alice's limit: the same count, a new limit.
	start = time.Now()
	xds.SetConfigs(t, egNode, xdsWeb(5, 1))
	took = p.waitRules(t, "web.user: unit=HOUR requests_per_unit=5,", start)
	t.Logf("a raised limit applied in %v", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("a raised limit took %v to apply, want at most 2s", took)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if code := p.code(t, c, alice); code != want {
			t.Errorf("alice's hit %d of 5 = %v, want %v", 5+i, code, want)
		}
	}

	// An invalid snapshot: NACKed with the reason, logged, counted; the
	// rules in use answer on.
	bad := xdsWeb(50, 50)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit(9)
	from := len(xds.Requests())
	xds.SetConfigs(t, egNode, bad)
	nack := xds.WaitRequest(t, from, 10*time.Second, "NACK", harness.XDSRequest.NACK)
	want := `xds: config "web" (domain web): descriptor "web.user": rate_limit: invalid unit "9"`
	if !strings.Contains(nack.GetErrorDetail().GetMessage(), want) {
		t.Errorf("NACK error_detail %q, want %q", nack.GetErrorDetail().GetMessage(), want)
	}
	// The log quotes the error as a string.
	logged := strings.ReplaceAll(want, `"`, `\"`)
	eventually(t, "the refusal logged", 10*time.Second, func() bool { return strings.Contains(p.logs(), logged) })
	if got := p.stat(t, "ratelimit.service.config_load_error"); got != "ratelimit.service.config_load_error: 1" {
		t.Errorf("/stats: %q, want config_load_error 1", got)
	}
	if code := p.code(t, c, alice); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("alice after a refused snapshot = %v, want OVER_LIMIT (limit 5 in use)", code)
	}

	// The xDS server goes away: the rules stay, health too; it comes back
	// and the next snapshot applies.
	xds.Stop()
	eventually(t, "the lost connection logged", 10*time.Second, func() bool { return strings.Contains(p.logs(), "no connection to the xDS server") })
	if code := p.healthCode(); code != http.StatusOK {
		t.Errorf("/healthcheck without the xDS server = %d, want 200", code)
	}
	if code := p.code(t, c, request("web", "path", "/b")); code != rlsv3.RateLimitResponse_OK {
		t.Errorf("a new path without the xDS server = %v, want OK", code)
	}
	opened := xds.StreamsOpened()
	xds.Restart(t)
	start = time.Now()
	xds.SetConfigs(t, egNode, xdsWeb(5, 7))
	took = p.waitRules(t, "web.path: unit=HOUR requests_per_unit=7,", start)
	t.Logf("reconnected and applied in %v", took.Round(time.Millisecond))
	if xds.StreamsOpened() <= opened {
		t.Errorf("no new stream after the restart")
	}
}

// TestXDSTLS runs the binary against an xDS server that requires mutual
// TLS, as Envoy Gateway's does, and against one whose certificate it must
// refuse.
func TestXDSTLS(t *testing.T) {
	xds := harness.StartXDS(t, harness.XDSOptions{TLS: true})
	xds.SetConfigs(t, egNode, xdsWeb(3, 3))
	env := func(ca string) []string {
		return []string{
			"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xds.Addr, "CONFIG_GRPC_XDS_NODE_ID=" + egNode,
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + xds.TLS.ClientCertFile,
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + xds.TLS.ClientKeyFile, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + ca,
			"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
			"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s",
		}
	}
	t.Run("mutual", func(t *testing.T) {
		p := start(t, nil, env(xds.TLS.CAFile)...)
		if code := p.code(t, p.client(t), request("web", "user", "tls")); code != rlsv3.RateLimitResponse_OK {
			t.Errorf("first hit = %v, want OK", code)
		}
	})
	t.Run("wrong_ca", func(t *testing.T) {
		other, err := harness.WriteTLS(t.TempDir(), "localhost")
		if err != nil {
			t.Fatal(err)
		}
		opened := xds.StreamsOpened()
		p := launch(t, nil, env(other.CAFile)...)
		eventually(t, "the certificate refused", 15*time.Second, func() bool {
			return strings.Contains(p.logs(), "certificate signed by unknown authority")
		})
		if code := p.healthCode(); code != http.StatusInternalServerError {
			t.Errorf("/healthcheck with the server refused = %d, want 500", code)
		}
		if n := xds.StreamsOpened() - opened; n != 0 {
			t.Errorf("%d streams opened to a server whose certificate was refused", n)
		}
	})
}

// rlsListenerTLS switches on TLS on the rate-limit listener for the Envoy
// Gateway scenario, as Envoy Gateway deploys it: egEnv adds
// GRPC_SERVER_USE_TLS=true and egClient dials with TLS, trusting the CA
// and presenting the client certificate, as Envoy does with Envoy
// Gateway's ratelimit_cluster.
var rlsListenerTLS = true

// egEnv is the environment Envoy Gateway's Deployment gives the service
// (internal/infrastructure/kubernetes/ratelimit/resource.go), with
// loopback addresses: one Secret mounted at /certs serves as the
// listener's certificate, the xDS client's certificate and the CA of both.
func egEnv(xds *harness.XDSServer, redis *harness.RedisServer, extra ...string) []string {
	certs := xds.TLS
	env := []string{
		"RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=info",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xds.Addr, "CONFIG_GRPC_XDS_NODE_ID=" + egNode,
		"GRPC_SERVER_TLS_CERT=" + certs.ClientCertFile, "GRPC_SERVER_TLS_KEY=" + certs.ClientKeyFile,
		// A name the anchor does not read: accepted, and changes nothing.
		"GRPC_SERVER_TLS_CA_CERT=" + certs.CAFile,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + certs.ClientCertFile,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + certs.ClientKeyFile, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + certs.CAFile,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		// No BACKEND_TYPE: Envoy Gateway relies on the anchor's default,
		// redis, which a REDIS_ setting selects here too.
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr,
	}
	if rlsListenerTLS {
		env = append(env, "GRPC_SERVER_USE_TLS=true")
	}
	return append(env, extra...)
}

// egClient is Envoy's side of the rate-limit call.
func egClient(t *testing.T, p *proc, certs *harness.TLSFiles) (rlsv3.RateLimitServiceClient, healthpb.HealthClient) {
	t.Helper()
	creds := insecure.NewCredentials()
	if rlsListenerTLS {
		cert, err := tls.LoadX509KeyPair(certs.ClientCertFile, certs.ClientKeyFile)
		if err != nil {
			t.Fatal(err)
		}
		pem, err := os.ReadFile(certs.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc), healthpb.NewHealthClient(cc)
}

// The names Envoy Gateway's translator gives one route and its rules
// (internal/xds/translator/ratelimit.go): the route's generic key holds
// the route's name as key and value, each rule's match is named
// rule-<rule>-match-<match> (-1 when the rule matches all traffic), a
// client IP rule nests remote_address under masked_remote_address.
const (
	egDomain = "default/eg/http"
	egRoute  = "httproute/default/backend/rule/0/match/0/www_example_com"
)

// egConfig is a RateLimitConfig shaped as Envoy Gateway generates it for
// a BackendTrafficPolicy with four rules: per value of x-user-id
// (distinct), for x-tier: free (a header value match), per client IP in
// 192.168.0.0/16, and for all traffic.
func egConfig(perUser uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: egDomain, Domain: egDomain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: egRoute, Value: egRoute,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: perUser}},
			{Key: "rule-1-match-0", Value: "rule-1-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 2}},
			{Key: "masked_remote_address", Value: "192.168.0.0/16", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "remote_address", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 100}},
			}},
			{Key: "rule-3-match--1", Value: "rule-3-match--1", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 1000}},
		},
	}}}
}

// egRequest is what Envoy sends for the route: the route's generic key
// first, then the rule's entries.
func egRequest(kv ...string) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: egRoute, Value: egRoute}}}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: egDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
}

// egMapping is a statsd_exporter mapping shaped like the one Envoy
// Gateway mounts (the anchor's default, in its dialect): per-rule counters
// of two levels with their labels, the errors and requests by label, the
// response time as a histogram.
const egMapping = `
mappings:
  - match: "ratelimit.service.rate_limit.*.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels:
      err_type: "$1"
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels:
      grpc_method: "$1"
`

// TestEnvoyGatewayDeployment runs the binary as Envoy Gateway deploys it,
// with the environment of its Deployment (both the statsd variant and the
// newer Prometheus and tracing one), a real Redis and an xDS server with
// mutual TLS, and plays Envoy: unhealthy before the first snapshot,
// healthy after, the generated limits enforced, a pushed change applied.
func TestEnvoyGatewayDeployment(t *testing.T) {
	redis := harness.StartRedis(t, harness.RedisOptions{})
	// The older releases' statsd_exporter sidecar listens on 9125 for TCP
	// (and UDP); the test's listens on a free port.
	var statsdLines <-chan string
	// otlp receives the spans of the variant with tracing.
	var otlp *harness.OTLPReceiver
	variants := []struct {
		name  string
		env   func(t *testing.T) []string
		check func(t *testing.T, p *proc)
	}{
		{
			name: "statsd",
			env: func(t *testing.T) []string {
				var port int
				port, statsdLines = statsdTCP(t)
				// Envoy Gateway keeps the anchor's 10 s; the test flushes
				// sooner.
				return []string{"USE_STATSD=true", fmt.Sprintf("STATSD_PORT=%d", port), "STATS_FLUSH_INTERVAL=100ms"}
			},
			check: func(t *testing.T, p *proc) {
				got := newStatsdTotals()
				hits := "ratelimit.service.rate_limit." + egDomain + "." + egRoute + "_" + egRoute + ".rule-0-match-0.total_hits"
				got.until(t, statsdLines, "the rule's hits over TCP", func() bool { return got.counters[hits] >= 7 })
				// The first load and the hits can share one flush, whose
				// lines come in any order: read on until the load is seen
				// (until fails the test if it never is).
				got.until(t, statsdLines, "config_load_success over TCP", func() bool {
					return got.counters["ratelimit.service.config_load_success"] >= 1
				})
			},
		},
		{
			name: "prometheus_tracing",
			env: func(t *testing.T) []string {
				// The collector's URL is the test's receiver's, in the
				// place of http://otel-collector.monitoring.svc.cluster.local:4318.
				otlp = harness.StartOTLP(t)
				// Envoy Gateway mounts a statsd_exporter mapping in the
				// anchor's dialect (timer_type) at /etc/statsd-exporter.
				mapping := filepath.Join(t.TempDir(), "conf.yaml")
				if err := os.WriteFile(mapping, []byte(egMapping), 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{
					"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
					"PROMETHEUS_MAPPER_YAML=" + mapping,
					"TRACING_ENABLED=true", "TRACING_SERVICE_NAME=envoy-ratelimit", "TRACING_SERVICE_NAMESPACE=envoy-gateway-system",
					"TRACING_SERVICE_INSTANCE_ID=envoy-ratelimit-6d7b9c-x2x4z", "TRACING_SAMPLING_RATE=1.0",
					"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.HTTPURL,
					// Exported every 100 ms rather than 5 s, for the test.
					"OTEL_BSP_SCHEDULE_DELAY=100",
				}
			},
			check: func(t *testing.T, p *proc) {
				for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "TRACING_ENABLED", "PROMETHEUS_MAPPER_YAML"} {
					if strings.Contains(p.logs(), "setting="+name) {
						t.Errorf("a warning about %s, which is implemented:\n%s", name, p.logs())
					}
				}
				// Every decision above is a span of Envoy Gateway's
				// service, over OTLP/HTTP, with a span per Redis round
				// trip under it.
				spans := otlp.WaitSpans(t, 1, 15*time.Second, func(s harness.Span) bool {
					return s.Name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
				})
				s := spans[0]
				for k, want := range map[string]string{"service.name": "envoy-ratelimit", "service.namespace": "envoy-gateway-system",
					"service.instance.id": "envoy-ratelimit-6d7b9c-x2x4z"} {
					if s.Resource[k] != want {
						t.Errorf("resource %s = %v, want %s", k, s.Resource[k], want)
					}
				}
				if s.Protocol != "http" || s.Attributes["domain"] != egDomain {
					t.Errorf("span over %s with domain %v, want over http with %s", s.Protocol, s.Attributes["domain"], egDomain)
				}
				otlp.WaitSpans(t, 1, 15*time.Second, func(c harness.Span) bool { return c.ParentSpanID == s.SpanID && c.Name == "redis pipeline" })
				code, body := p.get(t, "http://"+p.prom+"/metrics")
				if code != http.StatusOK || !strings.Contains(body, "ratelimit_service_config_load_success") {
					t.Errorf("Prometheus /metrics = %d, want 200 with config_load_success", code)
				}
				// The mapping's two-level rule names the per-user hits.
				want := `ratelimit_service_rate_limit_total_hits{domain="` + egDomain + `",key1="` + egRoute + "_" + egRoute + `",key2="rule-0-match-0"}`
				if !strings.Contains(body, want) {
					t.Errorf("Prometheus /metrics lacks %s, as the mapping names it:\n%s", want, body)
				}
			},
		},
	}
	for i, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			xds := harness.StartXDS(t, harness.XDSOptions{TLS: true})
			p := launch(t, nil, egEnv(xds, redis, v.env(t)...)...)
			rls, health := egClient(t, p, xds.TLS)

			// Started, unhealthy: Envoy Gateway publishes rules later.
			p.waitHealth(t, http.StatusInternalServerError)
			eventually(t, "the subscription", 15*time.Second, func() bool { return len(xds.Requests()) > 0 })
			if r, err := health.Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("gRPC health before the first snapshot = %v, %v; want NOT_SERVING", r.GetStatus(), err)
			}

			xds.SetConfigs(t, egNode, egConfig(3))
			p.waitHealth(t, http.StatusOK)
			if r, err := health.Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health after the first snapshot = %v, %v; want SERVING", r.GetStatus(), err)
			}

			user := fmt.Sprintf("user-%d", i)
			perUser := egRequest("rule-0-match-0", user)
			for n, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
				if code := p.code(t, rls, perUser); code != want {
					t.Errorf("%s's hit %d of 3 = %v, want %v", user, n+1, code, want)
				}
			}
			if code := p.code(t, rls, egRequest("rule-1-match-0", "rule-1-match-0")); code != rlsv3.RateLimitResponse_OK {
				t.Errorf("header match rule = %v, want OK", code)
			}
			ip := egRequest("masked_remote_address", "192.168.0.0/16", "remote_address", fmt.Sprintf("192.168.1.%d", i))
			if code := p.code(t, rls, ip); code != rlsv3.RateLimitResponse_OK {
				t.Errorf("client IP rule = %v, want OK", code)
			}
			resp, err := rls.ShouldRateLimit(callCtx(t), egRequest("rule-3-match--1", "rule-3-match--1"))
			if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1000 {
				t.Errorf("all-traffic rule = %v, %v; want limit 1000", resp, err)
			}

			// A policy edited in Kubernetes: Envoy Gateway pushes a new
			// snapshot, and the same count meets the new limit.
			start := time.Now()
			xds.SetConfigs(t, egNode, egConfig(6))
			took := p.waitRules(t, egDomain+"."+egRoute+"_"+egRoute+".rule-0-match-0: unit=HOUR requests_per_unit=6,", start)
			t.Logf("pushed change applied in %v", took.Round(time.Millisecond))
			for n, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
				if code := p.code(t, rls, perUser); code != want {
					t.Errorf("%s's hit %d of 6 = %v, want %v", user, n+5, code, want)
				}
			}

			// The counts are in Redis, shared by every replica, not in
			// each instance's memory.
			if got := p.stat(t, "ratelimit.redis.round_trips"); got == "" || strings.HasSuffix(got, ": 0") {
				t.Errorf("/stats %q: the decisions did not go to Redis", got)
			}
			if strings.Contains(p.logs(), "GRPC_SERVER_TLS_CA_CERT") {
				t.Errorf("GRPC_SERVER_TLS_CA_CERT, which the anchor does not read, was mentioned:\n%s", p.logs())
			}
			if v.check != nil {
				v.check(t, p)
			}
		})
	}
}
