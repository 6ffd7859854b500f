package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/cmd/ratelimit-bench/bench"
)

// TestMain lets the test binary stand in for cmd/ratelimit: with
// BENCHRUN_FAKE_SERVICE=1 it serves a no-op RLS server on GRPC_PORT,
// /healthcheck on PORT and /stats on DEBUG_PORT, whose round-trip counter
// grows by 100 per read. It refuses BACKEND_TYPE=memcache, and the rule of
// the algorithm named by FAKE_REFUSE, as a service without them would.
func TestMain(m *testing.M) {
	if addr := os.Getenv(noopEnv); addr != "" {
		if err := serveNoop(addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
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
	noop, err := bench.StartNoop("127.0.0.1:" + os.Getenv("GRPC_PORT"))
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
	go func() {
		time.Sleep(2 * time.Minute)
		srv.Close()
	}()
	srv.ListenAndServe()
}

func testRunner(t *testing.T) *runner {
	t.Helper()
	return &runner{
		timing: timing{runs: 3, warmup: 20 * time.Millisecond, duration: 100 * time.Millisecond},
		clkTck: clockTicks(),
		start:  time.Now(),
		log:    io.Discard,
	}
}

// TestMeasureService runs the orchestration against the fake service: start,
// a refused algorithm, health, /proc and /stats readings, medians, stop.
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

	r := testRunner(t)
	rw, err := r.measure(t.Context(), "redis", storeScenarios[1], target{
		addr: svc.grpcAddr, proc: svc.process, statsURL: svc.statsURL, rtStat: redisRoundTrips,
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
	// Each run reads /stats twice, so the counter moves by 100 per run.
	for i, m := range rw.runs {
		if want := 100 / float64(m.res.Requests); math.Abs(m.rt-want) > 1e-9 {
			t.Errorf("run %d: round trips/decision = %v, want %v", i, m.rt, want)
		}
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
		if rw.skip == "" && (rw.rps <= 0 || rw.ok == 0) {
			t.Errorf("%s: %v req/s, OK %d: want measured", rw.sc.id, rw.rps, rw.ok)
		}
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "token_bucket") {
		t.Errorf("notes = %q, want one on token_bucket", notes)
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
			if _, err := bench.ParseTemplate(d); err != nil {
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
// in place of cmd/ratelimit and a real redis-server: every store path,
// the markdown file and the plot.
func TestRunEndToEnd(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found in PATH; install it (Debian/Ubuntu: apt-get install redis-server)")
	}
	t.Setenv("BENCHRUN_FAKE_SERVICE", "1")
	dir := t.TempDir()
	out := filepath.Join(dir, "docs", "BENCHMARKS.md")
	var log strings.Builder
	err := run([]string{"-quick", "-d", "20ms", "-warmup", "10ms", "-bin", os.Args[0], "-out", out}, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| no-op ceiling, c=256 | no-op | 256 |",
		"| (a) 10,000 users, 1 descriptor, c=64 | memory | 64 |",
		"| (b) hot key over limit, near cache | redis | 64 |",
		"| (d) token_bucket, 10,000 users | redis | 64 |",
		"memcache: not measured: the service does not run BACKEND_TYPE=memcache yet (server: memcache store not implemented).",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "docs", "bench.png")); err != nil {
		t.Errorf("plot: %v", err)
	}

	// A store the service refuses by name is skipped with a note.
	t.Setenv("FAKE_REFUSE_BACKEND", "redis")
	log.Reset()
	err = run([]string{"-quick", "-d", "20ms", "-warmup", "10ms", "-bin", os.Args[0], "-out", out, "-stores", "redis"}, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	md, _ = os.ReadFile(out)
	if want := `redis: not measured: the service does not run BACKEND_TYPE=redis (server: BACKEND_TYPE "redis" is not available in this build yet).`; !strings.Contains(string(md), want) {
		t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, md)
	}
	if !strings.Contains(log.String(), "starting redis-server") {
		t.Errorf("progress lacks the redis start:\n%s", log.String())
	}
}
