package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/loadgen"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// TestMain lets the test binary stand in for cmd/ratelimit: with
// BENCHRUN_FAKE_SERVICE=1 it serves a no-op RLS server on GRPC_PORT,
// /healthcheck on PORT and /stats on DEBUG_PORT, whose round-trip counter
// grows by 100 per read. It refuses BACKEND_TYPE=memcache, and the rule of
// the algorithm named by FAKE_REFUSE, as a service without them would.
func TestMain(m *testing.M) {
	if serveAsChild() {
		return
	}
	if os.Getenv("BENCHRUN_FAKE_SERVICE") == "1" {
		fakeService()
		return
	}
	os.Exit(m.Run())
}

func fakeService() {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		os.Exit(1)
	}
	if os.Getenv("BACKEND_TYPE") == "memcache" {
		fail("server: memcache store not implemented")
	}
	if b := os.Getenv("FAKE_REFUSE_BACKEND"); b != "" && os.Getenv("BACKEND_TYPE") == b {
		fail(`server: BACKEND_TYPE %q is not available in this build yet`, os.Getenv("BACKEND_TYPE"))
	}
	rules, err := os.ReadFile(filepath.Join(os.Getenv("RUNTIME_ROOT"), os.Getenv("RUNTIME_APPDIRECTORY"), "bench.yaml"))
	if err != nil {
		fail("rules: %v", err)
	}
	if a := os.Getenv("FAKE_REFUSE"); a != "" && strings.Contains(string(rules), "algorithm: "+a) {
		fail("rules: bench.yaml: algorithm %s: the store cannot run it atomically", a)
	}
	noop, err := loadgen.StartNoop("127.0.0.1:" + os.Getenv("GRPC_PORT"))
	if err != nil {
		fail("%v", err)
	}
	defer noop.Stop()
	var trips atomic.Int64
	debug := http.NewServeMux()
	debug.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "ratelimit.total_requests: 1\n%s: %d\n", redisRoundTrips, trips.Add(100))
	})
	go http.ListenAndServe("127.0.0.1:"+os.Getenv("DEBUG_PORT"), debug)
	health := http.NewServeMux()
	health.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "OK") })
	// Bounded: a stray fake ends on its own.
	srv := &http.Server{Addr: "127.0.0.1:" + os.Getenv("PORT"), Handler: health}
	time.AfterFunc(2*time.Minute, func() { srv.Close() })
	srv.ListenAndServe()
}

func testRunner(t *testing.T) *runner {
	t.Helper()
	return &runner{
		// Long enough that a run completes requests on a loaded machine
		// (100 ms saw a no-op run finish none: an infinite ratio).
		timing:    timing{runs: 3, warmup: 50 * time.Millisecond, duration: 300 * time.Millisecond},
		clkTck:    clockTicks(),
		start:     time.Now(),
		log:       io.Discard,
		scenarios: storeScenarios,
	}
}

// TestMeasureService runs the orchestration against the fake service: start,
// a refused algorithm, health, /proc and /stats readings, the paired no-op
// runs, medians, stop.
func TestMeasureService(t *testing.T) {
	bin := os.Args[0]
	root := filepath.Join(t.TempDir(), "rules")
	skipped := map[string]string{}
	svc, err := startWithRules(t.Context(), bin, "fake", root, skipped, "BENCHRUN_FAKE_SERVICE=1", "FAKE_REFUSE=sliding_log")
	if err != nil {
		t.Fatalf("startWithRules: %v", err)
	}
	t.Cleanup(svc.stop)
	if len(skipped) != 1 || !strings.Contains(skipped["sliding_log"], "cannot run it atomically") {
		t.Fatalf("skipped = %v, want sliding_log with the service's message", skipped)
	}
	noop, err := startNoopProcess(t.Context(), tunedNoop)
	if err != nil {
		t.Fatalf("startNoopProcess: %v", err)
	}
	t.Cleanup(noop.stop)
	untuned, err := startNoopProcess(t.Context(), untunedNoop)
	if err != nil {
		t.Fatalf("startNoopProcess: %v", err)
	}
	t.Cleanup(untuned.stop)

	r := testRunner(t)
	r.ceil = &target{addr: noop.grpcAddr, proc: noop.process}
	r.untuned = &target{addr: untuned.grpcAddr, proc: untuned.process}
	// The fake service stands in for the store's process too.
	rw, err := r.measure(t.Context(), "redis", storeScenarios[1], target{
		addr: svc.grpcAddr, proc: svc.process, statsURL: svc.statsURL, rtStat: redisRoundTrips, storeProc: svc.process,
	})
	if err != nil {
		t.Fatalf("measure: %v", err)
	}
	if len(rw.runs) != 3 || rw.rps <= 0 || rw.ok == 0 || rw.errorCount != 0 {
		t.Fatalf("row: %d runs, %v req/s, OK %d, errors %d; want 3 runs of OK answers", len(rw.runs), rw.rps, rw.ok, rw.errorCount)
	}
	if math.IsNaN(rw.cpuUS) || rw.cpuUS < 0 || math.IsNaN(rw.rssMiB) || rw.rssMiB <= 0 {
		t.Errorf("CPU %v µs/decision, RSS %v MiB: want both measured", rw.cpuUS, rw.rssMiB)
	}
	for i, m := range rw.runs {
		if math.IsNaN(m.genCPUUS) || m.genCPUUS < 0 || math.IsNaN(m.storeCPUUS) || m.storeCPUUS < 0 {
			t.Errorf("run %d: generator CPU %v, store process CPU %v µs/decision: want both measured", i, m.genCPUUS, m.storeCPUUS)
		}
	}
	// Each run reads /stats twice, so the counter moves by 100 per run.
	for i, m := range rw.runs {
		if want := 100 / float64(m.res.Requests); math.Abs(m.rt-want) > 1e-9 {
			t.Errorf("run %d: round trips/decision = %v, want %v", i, m.rt, want)
		}
	}
	// One no-op run before each run, under the same load, and the ratio is
	// the median of the per-run ratios.
	if len(rw.ceil) != 3 {
		t.Fatalf("%d paired no-op runs, want 3", len(rw.ceil))
	}
	var ratios []float64
	for i, c := range rw.ceil {
		if c.res.Concurrency != rw.sc.c || !slices.Equal(c.res.Descriptors, rw.sc.descriptors) || c.res.Addr != noop.grpcAddr {
			t.Errorf("no-op run %d: c=%d %v on %s, want the scenario's load on the no-op server", i, c.res.Concurrency, c.res.Descriptors, c.res.Addr)
		}
		ratios = append(ratios, rw.runs[i].res.RPS()/c.res.RPS())
	}
	if want := median(ratios); rw.ratio != want || math.IsNaN(rw.ratio) {
		t.Errorf("ratio = %v, want the median of the per-run ratios %v", rw.ratio, ratios)
	}
	// And one untuned no-op run before each tuned one, on its own server.
	if len(rw.untuned) != 3 {
		t.Fatalf("%d paired untuned no-op runs, want 3", len(rw.untuned))
	}
	ratios = ratios[:0]
	for i, u := range rw.untuned {
		if u.res.Concurrency != rw.sc.c || u.res.Addr != untuned.grpcAddr {
			t.Errorf("untuned no-op run %d: c=%d on %s, want the scenario's load on the untuned no-op server", i, u.res.Concurrency, u.res.Addr)
		}
		ratios = append(ratios, rw.runs[i].res.RPS()/u.res.RPS())
	}
	if want := median(ratios); rw.untunedRatio != want || math.IsNaN(rw.untunedRatio) {
		t.Errorf("untuned ratio = %v, want the median of the per-run ratios %v", rw.untunedRatio, ratios)
	}
	if math.IsNaN(rw.ceilRPS) || math.IsNaN(rw.ceilCPUUS) || rw.ceilP99 <= 0 || math.IsNaN(rw.p99Ratio) {
		t.Errorf("no-op medians %v req/s, %v µs, p99 %v, p99 ratio %v: want all measured", rw.ceilRPS, rw.ceilCPUUS, rw.ceilP99, rw.p99Ratio)
	}
	svc.stop()
	if svc.running() {
		t.Error("service still running after stop")
	}
}

// TestRunStoreMemory runs every scenario of a store on the fake service and
// checks what is measured and what is skipped.
func TestRunStoreMemory(t *testing.T) {
	t.Setenv("BENCHRUN_FAKE_SERVICE", "1")
	t.Setenv("FAKE_REFUSE", "token_bucket")
	r := testRunner(t)
	r.timing = timing{runs: 1, duration: 100 * time.Millisecond}
	rows, notes, err := r.runStore(t.Context(), "memory", os.Args[0], t.TempDir())
	if err != nil {
		t.Fatalf("runStore: %v", err)
	}
	if len(rows) != len(storeScenarios) {
		t.Fatalf("runStore gave %d rows, want %d", len(rows), len(storeScenarios))
	}
	for _, rw := range rows {
		wantSkip := rw.sc.nearCache || rw.sc.id == "bucket"
		if (rw.skip != "") != wantSkip {
			t.Errorf("%s: skip %q, want skipped %v", rw.sc.id, rw.skip, wantSkip)
		}
		// Requests, not req/s: on a loaded machine no answer may come back
		// within a 100 ms window without warm-up.
		if rw.skip == "" && (len(rw.runs) != 1 || rw.runs[0].res.Requests == 0) {
			t.Errorf("%s: %d runs: want one measured run", rw.sc.id, len(rw.runs))
		}
		if rw.skip == "" && !math.IsNaN(rw.ratio) {
			t.Errorf("%s: ratio %v without a paired ceiling, want NaN", rw.sc.id, rw.ratio)
		}
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "token_bucket") {
		t.Errorf("notes = %q, want one on token_bucket", notes)
	}
}

// TestRunStoreTakesTurns checks that the scenarios take turns, round by
// round, so that two scenarios' runs of a round are close in time.
func TestRunStoreTakesTurns(t *testing.T) {
	t.Setenv("BENCHRUN_FAKE_SERVICE", "1")
	r := testRunner(t)
	r.scenarios = []scenario{storeScenarios[1], storeScenarios[6], storeScenarios[7]} // c64, fixed, sliding
	r.timing = timing{runs: 2, duration: 100 * time.Millisecond}
	var log bytes.Buffer
	r.log = &log
	rows, _, err := r.runStore(t.Context(), "memory", os.Args[0], t.TempDir())
	if err != nil {
		t.Fatalf("runStore: %v", err)
	}
	for _, rw := range rows {
		if len(rw.runs) != 2 {
			t.Errorf("%s: %d runs, want 2", rw.sc.id, len(rw.runs))
		}
	}
	var order []string
	for line := range strings.Lines(log.String()) {
		for _, sc := range r.scenarios {
			if strings.Contains(line, "memory: "+sc.title+": run ") {
				order = append(order, sc.id)
			}
		}
	}
	if want := []string{"c64", "fixed", "sliding", "c64", "fixed", "sliding"}; !slices.Equal(order, want) {
		t.Errorf("runs in the order %q, want %q (the scenarios take turns)", order, want)
	}
}

func TestStoreScenarios(t *testing.T) {
	r := &runner{scenarios: storeScenarios}
	if got := r.storeScenarios("redis-cluster"); len(got) != 1 || got[0].id != "c64" {
		t.Errorf("storeScenarios(redis-cluster) = %v, want c64 only", got)
	}
	if got := r.storeScenarios("redis"); len(got) != len(storeScenarios) {
		t.Errorf("storeScenarios(redis) has %d scenarios, want %d", len(got), len(storeScenarios))
	}
	r.scenarios, _ = selectScenarios("hot")
	if got := r.storeScenarios("redis-cluster"); len(got) != 0 {
		t.Errorf("storeScenarios(redis-cluster) with -scenarios hot = %v, want none", got)
	}
}

func TestSelectScenarios(t *testing.T) {
	tests := []struct {
		give    string
		want    []string
		wantErr string
	}{
		{give: "", want: []string{"c16", "c64", "c256", "hot", "hot+nc", "chain", "fixed", "sliding", "log", "bucket"}},
		{give: "bucket, c64", want: []string{"c64", "bucket"}},
		{give: "c64,c64", want: []string{"c64"}},
		{give: "c64,nope,zz", wantErr: "unknown nope, zz"},
	}
	for _, tt := range tests {
		got, err := selectScenarios(tt.give)
		var ids []string
		for _, sc := range got {
			ids = append(ids, sc.id)
		}
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("selectScenarios(%q) error = %v, want %q", tt.give, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(ids, tt.want) {
			t.Errorf("selectScenarios(%q) = %v, %v; want %v", tt.give, ids, err, tt.want)
		}
	}
}

func TestMemcacheSupported(t *testing.T) {
	t.Setenv("BENCHRUN_FAKE_SERVICE", "1")
	ok, msg, err := memcacheSupported(t.Context(), os.Args[0], t.TempDir())
	if err != nil || ok || !strings.Contains(msg, "memcache store not implemented") {
		t.Fatalf("memcacheSupported = %v, %q, %v; want false with the service's message", ok, msg, err)
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		give []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		if got := median(tt.give); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.give, got, tt.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median(nil) is not NaN")
	}
}

func TestRulesYAML(t *testing.T) {
	all := rulesYAML(nil)
	for _, a := range algorithms {
		if !strings.Contains(all, "algorithm: "+a+"\n") {
			t.Errorf("rules lack %s:\n%s", a, all)
		}
	}
	if !strings.Contains(all, "requests_per_unit: 10000\n          algorithm: sliding_log") {
		t.Errorf("sliding_log limit is not 10000:\n%s", all)
	}
	some := rulesYAML(map[string]string{"sliding_log": "refused"})
	if strings.Contains(some, "sliding_log") || !strings.Contains(some, "token_bucket") {
		t.Errorf("rules without sliding_log:\n%s", some)
	}
	for _, sc := range storeScenarios {
		for _, d := range sc.descriptors {
			if _, err := loadgen.ParseTemplate(d); err != nil {
				t.Errorf("scenario %s: %v", sc.id, err)
			}
		}
	}
	if got := scenarioAlgorithm(storeScenarios[len(storeScenarios)-1]); got != "token_bucket" {
		t.Errorf("scenarioAlgorithm(last) = %q, want token_bucket", got)
	}
}

func TestCommandLine(t *testing.T) {
	if got, want := commandLine([]string{"-quick", "-stores", "", "-out", "a b.md"}),
		`go run ./tools/benchrun -quick -stores "" -out "a b.md"`; got != want {
		t.Errorf("commandLine = %s, want %s", got, want)
	}
}

// TestRunEndToEnd runs benchrun as make bench does, with the fake service
// in place of cmd/ratelimit and a real redis-server and Redis Cluster: every
// store path, the markdown file, the plot and the scaling inputs.
func TestRunEndToEnd(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found in PATH; install it (Debian/Ubuntu: apt-get install redis-server)")
	}
	t.Setenv("BENCHRUN_FAKE_SERVICE", "1")
	dir := t.TempDir()
	out := filepath.Join(dir, "docs", "BENCHMARKS.md")
	scaling := filepath.Join(dir, "docs", "SCALING.md")
	if err := os.MkdirAll(filepath.Dir(scaling), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(scaling, []byte("# Scaling\n\nProse.\n\n"+scalingStart+"\nold\n"+scalingEnd+"\n\nMore prose.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	err := run([]string{"-quick", "-d", "20ms", "-warmup", "10ms", "-bin", os.Args[0], "-out", out,
		"-scenarios", "c64,hot+nc,bucket", "-redis-benchmark=false"}, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| (a) 10,000 users, 1 descriptor, c=64 | memory | 64 |",
		"| (b) hot key over limit, near cache | redis | 64 |",
		"| (d) token_bucket, 10,000 users | redis | 64 |",
		"| (a) 10,000 users, 1 descriptor, c=64 | redis-cluster | 64 |",
		"immediately before the service's run i",
		"memcache: not measured: the service does not run BACKEND_TYPE=memcache yet (server: memcache store not implemented).",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "(d) sliding_log") || strings.Contains(string(md), "One Redis (one cluster shard)") {
		t.Errorf("BENCHMARKS.md has a scenario or a test not selected:\n%s", md)
	}
	if _, err := os.Stat(filepath.Join(dir, "docs", "bench.png")); err != nil {
		t.Errorf("plot: %v", err)
	}
	sc, err := os.ReadFile(scaling)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(sc); !strings.HasPrefix(s, "# Scaling\n\nProse.\n\n"+scalingStart) || !strings.HasSuffix(s, scalingEnd+"\n\nMore prose.\n") ||
		strings.Contains(s, "old") || !strings.Contains(s, "| fixed_window, 1 descriptor, Redis Cluster of 3 masters | redis-cluster (a)") {
		t.Errorf("SCALING.md:\n%s", s)
	}
	for _, want := range []string{"starting redis-server", "starting a Redis Cluster of 3 masters", "no-op just before"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, log.String())
		}
	}

	// A store the service refuses by name is skipped with a note.
	t.Setenv("FAKE_REFUSE_BACKEND", "redis")
	log.Reset()
	err = run([]string{"-quick", "-d", "20ms", "-warmup", "10ms", "-bin", os.Args[0], "-out", out, "-stores", "redis", "-scenarios", "c64", "-scaling", "-", "-redis-benchmark=false"}, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md, _ = os.ReadFile(out)
	if want := `redis: not measured: the service does not run BACKEND_TYPE=redis (server: BACKEND_TYPE "redis" is not available in this build yet).`; !strings.Contains(string(md), want) {
		t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
	}
	if sc2, _ := os.ReadFile(scaling); !slices.Equal(sc2, sc) {
		t.Error("-scaling - rewrote SCALING.md")
	}
}

func TestRunFlags(t *testing.T) {
	tests := []struct {
		name string
		give []string
		want string
	}{
		{name: "unknown_store", give: []string{"-stores", "redis,etcd"}, want: `unknown store "etcd"`},
		{name: "no_store", give: []string{"-stores", ""}, want: "no store selected"},
		{name: "unknown_scenario", give: []string{"-scenarios", "c65"}, want: "unknown c65"},
		{name: "arguments", give: []string{"extra"}, want: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := run(tt.give, io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error with %q", tt.give, err, tt.want)
			}
		})
	}
}

// TestNoopGCHeadroom holds the tuned no-op server's GC headroom to the
// service's default GC_HEADROOM_BYTES.
func TestNoopGCHeadroom(t *testing.T) {
	t.Setenv("GC_HEADROOM_BYTES", "")
	os.Unsetenv("GC_HEADROOM_BYTES")
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	if set.GCHeadroomBytes != noopGCHeadroom {
		t.Errorf("noopGCHeadroom = %d, want the service's default %d", noopGCHeadroom, set.GCHeadroomBytes)
	}
}
