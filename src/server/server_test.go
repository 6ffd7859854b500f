package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/provider"
	"github.com/ratelimitd/ratelimit/src/server/listen"
	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
)

const serverRules = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// start runs a server on free loopback ports with rules in a temp dir.
func start(t *testing.T, ruleText string, env map[string]string) (*Server, string) {
	t.Helper()
	srv, root, _ := startStoppable(t, ruleText, env)
	return srv, root
}

// startStoppable is start that also returns a function that stops the
// server, as SIGTERM does, and waits until Run has returned.
func startStoppable(t *testing.T, ruleText string, env map[string]string) (*Server, string, func()) {
	t.Helper()
	srv, root := build(t, ruleText, env, io.Discard)
	return srv, root, run(t, srv)
}

// build makes a server on free loopback ports with rules in a temp dir,
// logging to w, without running it.
func build(t *testing.T, ruleText string, env map[string]string, w io.Writer) (*Server, string) {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ruleText != "" {
		if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(ruleText), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return buildIn(t, root, env, w), root
}

// buildIn is build with the rules root given.
func buildIn(t *testing.T, root string, env map[string]string, w io.Writer) *Server {
	t.Helper()
	setTestEnv(t, root, env)
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(context.Background(), set, slog.New(slog.NewTextHandler(w, nil)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return srv
}

// setTestEnv sets the settings of a server on free loopback ports with
// its rules under root, then env.
func setTestEnv(t *testing.T, root string, env map[string]string) {
	t.Helper()
	t.Setenv("RUNTIME_ROOT", root)
	for _, k := range []string{"PORT", "GRPC_PORT", "DEBUG_PORT"} {
		t.Setenv(k, "0")
	}
	t.Setenv("HOST", "127.0.0.1")
	t.Setenv("GRPC_HOST", "127.0.0.1")
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// run runs srv until the test ends or the function it returns is called,
// which stops the server as SIGTERM does and waits until Run has returned.
func run(t *testing.T, srv *Server) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func dial(t *testing.T, srv *Server) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(srv.Addrs().GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, what, cond)
}

func TestGRPCSurface(t *testing.T) {
	srv, _ := start(t, serverRules, nil)
	cc := dial(t, srv)
	ctx := t.Context()

	hc := healthpb.NewHealthClient(cc)
	for _, name := range []string{"", rlsServiceName} {
		eventually(t, "SERVING", func() bool {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
			return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
	}

	rls := rlsv3.NewRateLimitServiceClient(cc)
	r := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}},
	}}}
	var codesSeen []rlsv3.RateLimitResponse_Code
	for range 3 {
		resp, err := rls.ShouldRateLimit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		codesSeen = append(codesSeen, resp.GetOverallCode())
	}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	for i := range want {
		if codesSeen[i] != want[i] {
			t.Errorf("call %d: %v, want %v", i, codesSeen[i], want[i])
		}
	}
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty request: %v, want InvalidArgument", err)
	}

	// Server reflection lists the rate limit service (grpcurl relies on it).
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, ","), rlsServiceName) {
		t.Errorf("reflection lists %v, want %s", names, rlsServiceName)
	}
}

// TestGRPCHealthNames checks that every service name a probe may ask
// about follows the server's health: unhealthy with invalid rules,
// healthy once they are fixed, unhealthy again on shutdown.
func TestGRPCHealthNames(t *testing.T) {
	srv, root, stop := startStoppable(t, "domain: [broken", map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"})
	hc := healthpb.NewHealthClient(dial(t, srv))
	names := []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"}
	check := func(name string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		r, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		return r.GetStatus(), err
	}

	for _, name := range names {
		if st, err := check(name); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("Check(%q) with invalid rules = %v, %v; want NOT_SERVING", name, st, err)
		}
	}

	if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(serverRules), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		eventually(t, fmt.Sprintf("Check(%q) SERVING", name), func() bool {
			st, err := check(name)
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		})
	}

	// A probe watching the status sees it turn on shutdown, before the
	// listeners close.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var streams []healthpb.Health_WatchClient
	for _, name := range names {
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Watch(%q) first status = %v, %v; want SERVING", name, r.GetStatus(), err)
		}
		streams = append(streams, w)
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	for i, w := range streams {
		if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("Watch(%q) on shutdown = %v, %v; want NOT_SERVING", names[i], r.GetStatus(), err)
		}
	}
	cancel() // the server drains open streams before it stops
	<-stopped
}

// TestRecheckAppliesUnseenChange serves a rule file that is a link to a
// file outside the rules tree, rewritten in place: no watch sees it, and
// RUNTIME_RECHECK_INTERVAL must put it in force. Re-checks of unchanged
// rules load nothing: config_load_success does not move.
func TestRecheckAppliesUnseenChange(t *testing.T) {
	base := t.TempDir()
	shared := filepath.Join(base, "shared", "web.yaml")
	root := filepath.Join(base, "root")
	for _, d := range []string{filepath.Dir(shared), filepath.Join(root, "config")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(shared, []byte(serverRules), 0o644); err != nil {
		t.Fatal(err)
	}
	// Linked before the start, so that the first load is the only one
	// before the re-checks begin.
	if err := os.Symlink(shared, filepath.Join(root, "config", "web.yaml")); err != nil {
		t.Fatal(err)
	}
	srv, _ := start(t, "", map[string]string{"RUNTIME_ROOT": root, "RUNTIME_RECHECK_INTERVAL": "100ms"})
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	limit := func() uint32 {
		resp, err := rls.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "recheck"}},
		}}})
		if err != nil {
			return 0
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 2 {
		t.Fatalf("limit %d at the start, want 2", got)
	}

	success := srv.stats.Counter("ratelimit.service.config_load_success")
	failure := srv.stats.Counter("ratelimit.service.config_load_error")
	rechecks := func(n uint64) {
		t.Helper()
		w := srv.watcher.(*provider.Watcher)
		from := w.Stats().Rechecks
		eventually(t, fmt.Sprintf("%d more re-checks", n), func() bool { return w.Stats().Rechecks >= from+n })
	}
	loaded := success.Value()
	rechecks(3)
	if got := success.Value(); got != loaded {
		t.Errorf("config_load_success moved from %d to %d over re-checks of unchanged rules", loaded, got)
	}

	if err := os.WriteFile(shared, []byte(strings.Replace(serverRules, "requests_per_unit: 2", "requests_per_unit: 5", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the re-check applies limit 5", func() bool { return limit() == 5 })
	if got := success.Value(); got != loaded+1 {
		t.Errorf("config_load_success = %d after one change, want %d", got, loaded+1)
	}

	// Invalid rules found by a re-check are counted once and never
	// replace the rules in use.
	failed := failure.Value()
	if err := os.WriteFile(shared, []byte("domain: web\ndescriptors:\n  - key: \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "config_load_error counts the invalid rules", func() bool { return failure.Value() == failed+1 })
	rechecks(3)
	if got := failure.Value(); got != failed+1 {
		t.Errorf("config_load_error = %d over re-checks of the same invalid rules, want %d", got, failed+1)
	}
	if got := limit(); got != 5 {
		t.Errorf("limit %d after invalid rules, want the rules in use (5)", got)
	}
}

func TestHTTPAndDebugEndpoints(t *testing.T) {
	srv, _ := start(t, serverRules, nil)
	a := srv.Addrs()
	base, debug := "http://"+a.HTTP.String(), "http://"+a.Debug.String()
	eventually(t, "healthy", func() bool { c, _ := get(t, base+"/healthcheck"); return c == 200 })

	resp, err := http.Post(base+"/json", "application/json", strings.NewReader(`{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("POST /json: %d, want 200", resp.StatusCode)
	}
	if c, body := get(t, debug+"/rlconfig"); c != 200 || !strings.Contains(body, "web.user") {
		t.Errorf("/rlconfig: %d %q, want the rule web.user", c, body)
	}
	if c, body := get(t, debug+"/stats"); c != 200 || !strings.Contains(body, "ratelimit.service.rate_limit.web.user.total_hits: 1") {
		t.Errorf("/stats: %d %q, want the rule's total_hits", c, body)
	}
	if c, _ := get(t, debug+"/debug/pprof/"); c != 200 {
		t.Errorf("/debug/pprof/: %d, want 200", c)
	}
}

func TestForceStartWithoutInitialConfig(t *testing.T) {
	srv, root := start(t, "domain: [broken", map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"})
	base := "http://" + srv.Addrs().HTTP.String()
	if c, _ := get(t, base+"/healthcheck"); c != 500 {
		t.Errorf("healthcheck with invalid rules: %d, want 500", c)
	}
	cc := dial(t, srv)
	rls := rlsv3.NewRateLimitServiceClient(cc)
	r := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}},
	}}}
	if _, err := rls.ShouldRateLimit(t.Context(), r); status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit without rules: %v, want Unavailable", err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(serverRules), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "healthy after valid rules", func() bool { c, _ := get(t, base+"/healthcheck"); return c == 200 })
	if _, err := rls.ShouldRateLimit(t.Context(), r); err != nil {
		t.Errorf("after reload: %v", err)
	}
}

func TestInvalidRulesAtStartupFail(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "config"), 0o755)
	os.WriteFile(filepath.Join(root, "config", "bad.yaml"), []byte("domain: web\ndescriptors:\n  - key: \"\"\n"), 0o644)
	t.Setenv("RUNTIME_ROOT", root)
	for _, k := range []string{"PORT", "GRPC_PORT", "DEBUG_PORT"} {
		t.Setenv(k, "0")
	}
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(t.Context(), set, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:3") {
		t.Errorf("New with invalid rules = %v, want an error naming bad.yaml:3", err)
	}
}

func TestRecoverTurnsPanicIntoInternal(t *testing.T) {
	srv, _ := start(t, serverRules, nil)
	_, err := srv.recoverUnary(t.Context(), nil, &grpc.UnaryServerInfo{FullMethod: "/x"}, func(context.Context, any) (any, error) {
		panic("bug")
	})
	if status.Code(err) != codes.Internal {
		t.Errorf("panicking handler: %v, want Internal", err)
	}
	if srv.stats.Counter("ratelimit.server.panics").Value() != 1 {
		t.Error("panic not counted")
	}
	// ShouldRateLimit's own handler recovers as the interceptor does: a
	// server without its service panics in it.
	reg := stats.NewRegistry()
	bare := &Server{stats: reg, log: slog.New(slog.DiscardHandler), stall: listen.NewStallWatch(reg, 0)}
	resp, err := bare.shouldRateLimit(nil, t.Context(), func(any) error { return nil }, nil)
	if resp != nil || status.Code(err) != codes.Internal || reg.Counter("ratelimit.server.panics").Value() != 1 {
		t.Errorf("panicking ShouldRateLimit: %v, %v, want nil, Internal, counted", resp, err)
	}
}

// TestShouldRateLimitHasItsOwnHandler: the service is registered with
// the server's handler for ShouldRateLimit, every other method of the
// generated description kept.
func TestShouldRateLimitHasItsOwnHandler(t *testing.T) {
	srv := &Server{}
	gen := rlsv3.RateLimitService_ServiceDesc
	desc := withHandler(gen, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, srv.shouldRateLimit)
	if len(desc.Methods) != len(gen.Methods) || len(desc.Streams) != len(gen.Streams) {
		t.Fatalf("methods %d, streams %d; want the generated %d and %d", len(desc.Methods), len(desc.Streams), len(gen.Methods), len(gen.Streams))
	}
	ours := reflect.ValueOf(srv.shouldRateLimit).Pointer()
	for i, m := range desc.Methods {
		if got := reflect.ValueOf(m.Handler).Pointer(); (m.MethodName == "ShouldRateLimit") != (got == ours) {
			t.Errorf("method %s: handler %#x, generated %#x, ours %#x", m.MethodName, got, reflect.ValueOf(gen.Methods[i].Handler).Pointer(), ours)
		}
	}
}

func TestHealthShutdown(t *testing.T) {
	h := NewHealth()
	if h.Healthy() {
		t.Fatal("healthy before rules and store")
	}
	h.SetRules(true)
	h.SetStore(true)
	if !h.Healthy() {
		t.Fatal("not healthy with rules and store")
	}
	h.Shutdown()
	h.SetStore(true)
	if h.Healthy() {
		t.Error("healthy after Shutdown")
	}
}

// TestGRPCTuning serves concurrent calls with reused stream workers (fewer
// than the calls in flight), small buffers and a shared write buffer: every
// call gets its own correct answer.
func TestGRPCTuning(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{
		"GRPC_NUM_STREAM_WORKERS":  "2",
		"GRPC_READ_BUFFER_SIZE":    "4096",
		"GRPC_WRITE_BUFFER_SIZE":   "4096",
		"GRPC_SHARED_WRITE_BUFFER": "true",
	})
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	const users = 32
	got := make([][]rlsv3.RateLimitResponse_Code, users)
	errs := make(chan error, users)
	var wg sync.WaitGroup
	for u := range users {
		wg.Go(func() {
			r := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("tuning-%d", u)}},
			}}}
			for range 3 {
				resp, err := rls.ShouldRateLimit(t.Context(), r)
				if err != nil {
					errs <- err
					return
				}
				got[u] = append(got[u], resp.GetOverallCode())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	for u, codes := range got {
		if !slices.Equal(codes, want) {
			t.Errorf("user %d: %v, want %v", u, codes, want)
		}
	}
}

// TestHealthConcurrentChangesAgree changes the store's health from four
// goroutines at once, many times: the gRPC status must end as Healthy()
// says, whatever the interleaving.
func TestHealthConcurrentChangesAgree(t *testing.T) {
	for i := range 5000 {
		h := NewHealth()
		h.SetRules(true)
		var wg sync.WaitGroup
		for j := range 4 {
			wg.Go(func() { h.SetStore(j%2 == 0) })
		}
		wg.Wait()
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if h.Healthy() {
			want = healthpb.HealthCheckResponse_SERVING
		}
		r, err := h.grpc.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if err != nil || r.GetStatus() != want {
			t.Fatalf("round %d: gRPC status %v, %v; Healthy() = %v", i, r.GetStatus(), err, h.Healthy())
		}
	}
}

// TestMemoryCeilingOverTheWire: at MEMORY_MAX_KEYS every request is still
// answered, a spent key keeps its count, and /stats counts the evictions.
func TestMemoryCeilingOverTheWire(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"MEMORY_MAX_KEYS": "16"})
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	check := func(user string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := rls.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
		}}})
		if err != nil {
			t.Fatalf("user %s: %v, want an answer at the ceiling", user, err)
		}
		return resp.GetOverallCode()
	}
	for range 3 {
		check("spent")
	}
	for i := range 40 {
		if code := check(fmt.Sprint("u", i)); code != rlsv3.RateLimitResponse_OK {
			t.Errorf("new user u%d: %v, want OK", i, code)
		}
	}
	if code := check("spent"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the spent user after 40 new ones: %v, want OVER_LIMIT still", code)
	}
	_, body := get(t, "http://"+srv.Addrs().Debug.String()+"/stats")
	for _, want := range []string{
		"ratelimit.memory.evicted_under_limit: 25\n", // 41 keys in a store of 16
		"ratelimit.memory.compacted_over_limit: 0\n",
		"ratelimit.memory.folded_over_limit: 0\n",
		"ratelimit.memory.reclaimed_idle: 0\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/stats lacks %q:\n%s", want, body)
		}
	}
}

// TestMemoryMaxBytes: MEMORY_MAX_BYTES reaches the store: 3 MiB of keys in a
// store of 1 MiB make it evict.
func TestMemoryMaxBytes(t *testing.T) {
	// Each request below is 1 MiB: above GRPC_MAX_RECV_MSG_SIZE's default.
	srv, _ := start(t, serverRules, map[string]string{"MEMORY_MAX_BYTES": "1048576", "GRPC_MAX_RECV_MSG_SIZE": "4194304"})
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	big := strings.Repeat("v", 4000)
	for r := range 3 {
		req := &rlsv3.RateLimitRequest{Domain: "web"}
		for i := range 256 {
			req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprint(big, r, "_", i)}},
			})
		}
		if _, err := rls.ShouldRateLimit(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	_, body := get(t, "http://"+srv.Addrs().Debug.String()+"/stats")
	if !strings.Contains(body, "ratelimit.memory.evicted_under_limit: ") || strings.Contains(body, "ratelimit.memory.evicted_under_limit: 0\n") {
		t.Errorf("/stats after 3 MiB of keys in 1 MiB: want evicted_under_limit above 0:\n%s", body)
	}
}

// TestReflectionSwitch: GRPC_REFLECTION_ENABLED=false leaves server
// reflection out; by default it is served, as the anchor serves it.
func TestReflectionSwitch(t *testing.T) {
	for _, tt := range []struct {
		give string
		want bool
	}{{"", true}, {"true", true}, {"false", false}} {
		t.Run("enabled="+tt.give, func(t *testing.T) {
			env := map[string]string{}
			if tt.give != "" {
				env["GRPC_REFLECTION_ENABLED"] = tt.give
			}
			srv, _ := start(t, serverRules, env)
			_, got := srv.grpc.GetServiceInfo()[reflectionpb.ServerReflection_ServiceDesc.ServiceName]
			if got != tt.want {
				t.Errorf("GRPC_REFLECTION_ENABLED=%q: reflection registered %v, want %v", tt.give, got, tt.want)
			}
		})
	}
}
