package main

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestSoak is a 20-second soak, a fault every 5 s (each of the four kinds
// once), against the service built without -race: no error outside the
// faults, every checked window exact, every sender deciding again within
// 2 s of each fix, every answer within the budget, and no leak of
// goroutines, files or Redis connections. `make soak` runs the long one.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a 20-second soak; run without -short")
	}
	cfg := defaultConfig()
	cfg.duration, cfg.faultEvery, cfg.faultLength = 20*time.Second, 5*time.Second, time.Second
	// The load generator runs under -race in this test, beside the other
	// packages' tests: one background sender keeps it from taking the
	// machine, the load lock keeps it apart from the fault tests, and a
	// budget of 300 ms keeps the scheduling delays of a
	// loaded machine (answers of up to 290 ms seen outside the faults)
	// from passing for the faults' errors.
	cfg.background = 1
	cfg.budget = 300 * time.Millisecond
	harness.LockLoad(t)
	rep, err := run(t.Context(), cfg, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", rep.format())
	if len(rep.faults) != int(faultKinds) {
		t.Errorf("%d faults injected, want one of each of the %d kinds", len(rep.faults), faultKinds)
	}
	for _, p := range rep.problems() {
		t.Error(p)
	}
}
