package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/settings"
)

const xdsNode = "envoy-ratelimit"

// xdsWeb is domain web with userLimit per hour for each user and, to
// change independently, pathLimit per hour for each path.
func xdsWeb(userLimit, pathLimit uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "web", Domain: "web", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: userLimit}},
		{Key: "path", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: pathLimit}},
	}}
}

func xdsEnv(xds *harness.XDSServer, extra map[string]string) map[string]string {
	env := map[string]string{
		"CONFIG_TYPE":                         "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":          xds.Addr,
		"CONFIG_GRPC_XDS_NODE_ID":             xdsNode,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL":     "500ms",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// TestXDSRulesOverTheWire wires the xDS provider into the server, as
// Envoy Gateway deploys it (FORCE_START_WITHOUT_INITIAL_CONFIG=true):
// unhealthy and Unavailable before the first snapshot, then the limits of
// each snapshot, refused snapshots counted and the rules in use kept, and
// the counts of an unchanged rule kept across updates.
func TestXDSRulesOverTheWire(t *testing.T) {
	xds := harness.StartXDS(t, harness.XDSOptions{})
	srv, _ := start(t, "", xdsEnv(xds, map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}))
	cc := dial(t, srv)
	rls := rlsv3.NewRateLimitServiceClient(cc)
	hc := healthpb.NewHealthClient(cc)
	ctx := t.Context()
	health := "http://" + srv.Addrs().HTTP.String() + "/healthcheck"
	call := func(key, value string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit(%s=%s): %v", key, value, err)
		}
		return resp.GetOverallCode()
	}
	success := srv.stats.Counter("ratelimit.service.config_load_success")
	failure := srv.stats.Counter("ratelimit.service.config_load_error")

	// Connected, no snapshot for the node yet.
	eventually(t, "the subscription", func() bool { return len(xds.Requests()) > 0 })
	if code, _ := get(t, health); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck before the first snapshot = %d, want 500", code)
	}
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health before the first snapshot = %v, %v; want NOT_SERVING", r.GetStatus(), err)
	}
	_, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}}}}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit before the first snapshot = %v, want Unavailable", err)
	}

	xds.SetConfigs(t, xdsNode, xdsWeb(3, 100))
	eventually(t, "healthy after the first snapshot", func() bool { c, _ := get(t, health); return c == http.StatusOK })
	if success.Value() != 1 {
		t.Errorf("config_load_success = %d, want 1", success.Value())
	}
	for i := range 2 {
		if code := call("user", "alice"); code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("alice's hit %d = %v, want OK", i+1, code)
		}
	}

	// Change the path rule only: alice's count goes on (same cache key).
	xds.SetConfigs(t, xdsNode, xdsWeb(3, 1))
	eventually(t, "the second snapshot", func() bool { return success.Value() == 2 })
	if code := call("path", "/a"); code != rlsv3.RateLimitResponse_OK {
		t.Errorf("first hit of /a under a limit of 1 = %v, want OK", code)
	}
	if code := call("path", "/a"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("second hit of /a under a limit of 1 = %v, want OVER_LIMIT", code)
	}
	if code := call("user", "alice"); code != rlsv3.RateLimitResponse_OK {
		t.Errorf("alice's hit 3 of 3 after the update = %v, want OK", code)
	}
	if code := call("user", "alice"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("alice's hit 4 of 3 after the update = %v, want OVER_LIMIT: the update reset her count", code)
	}

	// A refused snapshot: counted, NACKed, the rules in use answer on.
	bad := xdsWeb(50, 50)
	bad.Descriptors[1].Key = ""
	from := len(xds.Requests())
	xds.SetConfigs(t, xdsNode, bad)
	xds.WaitRequest(t, from, 5*time.Second, "NACK", harness.XDSRequest.NACK)
	eventually(t, "config_load_error", func() bool { return failure.Value() == 1 })
	if code := call("user", "alice"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("alice after a refused snapshot = %v, want OVER_LIMIT (limit 3 still in use)", code)
	}
	if code, _ := get(t, health); code != http.StatusOK {
		t.Errorf("/healthcheck after a refused snapshot = %d, want 200", code)
	}

	// A raised limit applies to the same count: 5 hits so far (those over
	// the limit count too), limit 6.
	xds.SetConfigs(t, xdsNode, xdsWeb(6, 1))
	eventually(t, "the raised limit", func() bool { return success.Value() == 3 })
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if code := call("user", "alice"); code != want {
			t.Errorf("alice's hit %d under the raised limit of 6 = %v, want %v", 6+i, code, want)
		}
	}
	if code, body := get(t, "http://"+srv.Addrs().Debug.String()+"/rlconfig"); code != http.StatusOK || body == "" {
		t.Errorf("/rlconfig = %d %q, want the rules", code, body)
	}
}

// TestXDSHealthyWithAtLeastOneConfigLoaded: an empty snapshot is applied
// (no limits) and, with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, reported
// unhealthy, exactly as an empty rules folder is.
func TestXDSHealthyWithAtLeastOneConfigLoaded(t *testing.T) {
	xds := harness.StartXDS(t, harness.XDSOptions{})
	xds.SetConfigs(t, xdsNode, xdsWeb(3, 3))
	srv, _ := start(t, "", xdsEnv(xds, map[string]string{
		"FORCE_START_WITHOUT_INITIAL_CONFIG":      "true",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true",
	}))
	eventually(t, "healthy", srv.Health().Healthy)
	xds.SetConfigs(t, xdsNode)
	eventually(t, "unhealthy without any domain", func() bool { return !srv.Health().Healthy() })
	if !srv.svc.Rules().Empty() {
		t.Errorf("rules after an empty snapshot = %v, want none", srv.svc.Rules().Domains())
	}
}

// TestXDSWaitsForFirstRules: without FORCE_START_WITHOUT_INITIAL_CONFIG,
// New returns only once the first valid rules are in use (the ports stay
// closed meanwhile), and gives up when its context ends.
func TestXDSWaitsForFirstRules(t *testing.T) {
	xds := harness.StartXDS(t, harness.XDSOptions{})
	for k, v := range xdsEnv(xds, map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1"}) {
		t.Setenv(k, v)
	}
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	t.Run("gives_up", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		if srv, err := New(ctx, set, log); err == nil || srv != nil {
			t.Errorf("New without rules = %v, %v; want an error once its context ends", srv, err)
		}
	})

	t.Run("first_rules", func(t *testing.T) {
		type result struct {
			srv *Server
			err error
		}
		done := make(chan result, 1)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			srv, err := New(ctx, set, log)
			done <- result{srv, err}
		}()
		// Refused rules are not enough.
		bad := xdsWeb(3, 3)
		bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
		xds.SetConfigs(t, xdsNode, bad)
		xds.WaitRequest(t, 0, 5*time.Second, "NACK", harness.XDSRequest.NACK)
		select {
		case r := <-done:
			t.Fatalf("New returned before valid rules: %v, %v", r.srv, r.err)
		case <-time.After(200 * time.Millisecond):
		}
		xds.SetConfigs(t, xdsNode, xdsWeb(3, 3))
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("New did not return after the first valid rules")
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		runDone := make(chan error, 1)
		go func() { runDone <- r.srv.Run(ctx) }()
		if !r.srv.svc.Rules().HasDomain("web") {
			t.Errorf("rules when New returned = %v, want web", r.srv.svc.Rules().Domains())
		}
		eventually(t, "healthy", r.srv.Health().Healthy)
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
