package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseVariants(t *testing.T) {
	got, err := parseVariants(" default ; workers: GRPC_NUM_STREAM_WORKERS=-1  GOGC=200;")
	if err != nil {
		t.Fatalf("parseVariants: %v", err)
	}
	want := []variant{{name: "default"}, {name: "workers", env: []string{"GRPC_NUM_STREAM_WORKERS=-1", "GOGC=200"}}}
	if len(got) != len(want) {
		t.Fatalf("parseVariants = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].name != want[i].name || !slices.Equal(got[i].env, want[i].env) {
			t.Errorf("variant %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []struct{ give, wantErr string }{
		{"only", "at least two"},
		{"a; a: X=1", "named twice"},
		{"a; : X=1", "has no name"},
		{"a; b: X", `"X" is not ENV=value`},
		{"a; b: =1", `"=1" is not ENV=value`},
	} {
		if _, err := parseVariants(bad.give); err == nil || !strings.Contains(err.Error(), bad.wantErr) {
			t.Errorf("parseVariants(%q) error = %v, want one containing %q", bad.give, err, bad.wantErr)
		}
	}
}

func TestVariantBinary(t *testing.T) {
	v := variant{name: "old", env: []string{"GOGC=200", binEnv + "=/tmp/old", "X=1"}}
	if bin, env := v.binary("/tmp/new"); bin != "/tmp/old" || !slices.Equal(env, []string{"GOGC=200", "X=1"}) {
		t.Errorf("binary = %q, %q; want /tmp/old and the other settings", bin, env)
	}
	if bin, env := (variant{name: "new", env: []string{"X=1"}}).binary("/tmp/new"); bin != "/tmp/new" || !slices.Equal(env, []string{"X=1"}) {
		t.Errorf("binary = %q, %q; want -bin's and the settings", bin, env)
	}
}

// TestRunVariants runs two variants of the fake service in rotation: every
// variant gets one paired run per round, and its own process.
func TestRunVariants(t *testing.T) {
	t.Setenv("BENCHRUN_FAKE_SERVICE", "1")
	noop, err := startNoopProcess(t.Context(), tunedNoop)
	if err != nil {
		t.Fatalf("no-op server: %v", err)
	}
	defer noop.stop()
	r := testRunner(t)
	r.timing = timing{runs: 2, warmup: 20 * time.Millisecond, duration: 100 * time.Millisecond}
	r.scenarios = storeScenarios[1:2] // c64
	r.ceil = &target{addr: noop.grpcAddr, proc: noop.process}
	vs := []variant{{name: "a"}, {name: "b", env: []string{"GOGC=200"}}}
	rows, err := r.runVariants(t.Context(), "memory", os.Args[0], t.TempDir(), vs)
	if err != nil {
		t.Fatalf("runVariants: %v", err)
	}
	if len(rows) != 2 {
		t.Fatalf("runVariants gave %d rows, want 2", len(rows))
	}
	for i, rw := range rows {
		if rw.variant != vs[i].name || rw.sc.id != "c64" || rw.store != "memory" {
			t.Errorf("row %d: variant %q scenario %q store %q", i, rw.variant, rw.sc.id, rw.store)
		}
		if len(rw.runs) != 2 || len(rw.ceil) != 2 {
			t.Errorf("row %s: %d runs and %d no-op runs, want 2 and 2", rw.variant, len(rw.runs), len(rw.ceil))
		}
		if math.IsNaN(rw.ratio) || math.IsNaN(rw.cpuRatio) && !math.IsNaN(rw.cpuUS) {
			t.Errorf("row %s: ratio %v, CPU ratio %v: want paired figures", rw.variant, rw.ratio, rw.cpuRatio)
		}
	}
	if r.timing.runs != 2 {
		t.Errorf("runVariants left timing.runs = %d, want it restored to 2", r.timing.runs)
	}

	rep := fakeReport()
	rep.rows = rows
	path := filepath.Join(t.TempDir(), "B.md")
	if err := os.WriteFile(path, []byte("# B\n<!-- benchrun:start -->\nkept\n<!-- benchrun:end -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeVariants(path, rep, vs); err != nil {
		t.Fatalf("writeVariants: %v", err)
	}
	b, _ := os.ReadFile(path)
	md := string(b)
	for _, want := range []string{"\nkept\n", variantsStart, variantsEnd, "| a | defaults | memory | (a) 10,000 users, 1 descriptor, c=64 |", "| b | `GOGC=200` | memory |"} {
		if !strings.Contains(md, want) {
			t.Errorf("file lacks %q:\n%s", want, md)
		}
	}
}

func TestMedianCPURatio(t *testing.T) {
	rw := &row{
		runs: []runResult{{cpuUS: 30}, {cpuUS: 60}, {cpuUS: math.NaN()}},
		ceil: []runResult{{cpuUS: 20}, {cpuUS: 60}, {cpuUS: 50}},
	}
	if got := medianCPURatio(rw); got != 1.25 {
		t.Errorf("medianCPURatio = %v, want 1.25 (median of 1.5 and 1)", got)
	}
	rw.ceil = rw.ceil[:1]
	if got := medianCPURatio(rw); !math.IsNaN(got) {
		t.Errorf("medianCPURatio with unpaired runs = %v, want NaN", got)
	}
}
