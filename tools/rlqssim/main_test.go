package main

import (
	"strings"
	"testing"
	"time"
)

// runChecked runs sc and fails t unless the bound held in every window,
// no assignment ever expired, the grants converged within a period, and
// the report's row names sc.
func runChecked(t *testing.T, sc scenario) result {
	t.Helper()
	r, err := sc.run()
	if err != nil {
		t.Fatal(err)
	}
	if r.violation != "" || r.worst == 0 || r.worst > 1 {
		t.Errorf("bound: worst %.2f, %s", r.worst, r.violation)
	}
	if r.fallbacks != 0 {
		t.Errorf("%d requests admitted after an assignment expired", r.fallbacks)
	}
	if r.converge == 0 || r.converge >= sc.shiftEvery {
		t.Errorf("converged within %v, want within a period of %v", r.converge, sc.shiftEvery)
	}
	if row := r.row(sc); !strings.HasPrefix(row, "| "+sc.name+" | ") {
		t.Errorf("row = %q", row)
	}
	return r
}

// TestSmallFleet runs a small fleet through the whole simulation, with
// the ticks beside the streams' calls, and measures the heap a
// subscription takes.
func TestSmallFleet(t *testing.T) {
	sc := scenario{
		name: "small", envoys: 10, tenants: 4, rate: 50, burst: 10, overload: 3,
		interval: 5 * time.Second, ttl: 15 * time.Second,
		duration: 90 * time.Second, shiftEvery: 30 * time.Second, reconnect: 0.3, dt: 10 * time.Millisecond,
		sample: 4, checks: true, seed: 1, concurrent: true,
	}
	r := runChecked(t, sc)
	if r.subs == 0 || r.heapPerSub <= 0 {
		t.Errorf("subscriptions %d, heap per subscription %.0f: want both measured", r.subs, r.heapPerSub)
	}
	if r.waitMedian > r.waitMax || !strings.Contains(r.row(sc), " ms, ") {
		t.Errorf("wait beside a tick: median %v, most %v, row %q", r.waitMedian, r.waitMax, r.row(sc))
	}
}

// TestSmallFleetReplicas runs a small fleet on three replicas sharing a
// real redis-server, and kills the one that owns the most pools mid-run:
// the pools it owned are taken over, the grants converge again before the
// next shift, and every Envoy has 90 % of its fair share within two report
// intervals.
func TestSmallFleetReplicas(t *testing.T) {
	sc := scenario{
		name: "small, 3 replicas", envoys: 12, tenants: 6, rate: 50, burst: 10, overload: 3,
		interval: 5 * time.Second, ttl: 15 * time.Second,
		duration: 120 * time.Second, shiftEvery: 40 * time.Second, reconnect: 0.2, dt: 10 * time.Millisecond,
		sample: 6, checks: true, seed: 2, replicas: 3, kill: 60 * time.Second,
	}
	r := runChecked(t, sc)
	if r.takeovers == 0 {
		t.Error("no pool was taken over from the killed replica")
	}
	if r.recovered == 0 || r.recovered >= 2*sc.shiftEvery-sc.kill {
		t.Errorf("converged %v after the kill, want before the next shift", r.recovered)
	}
	if r.served > 2*sc.interval {
		t.Errorf("90 %% of the fair shares %v after the kill, want within two report intervals", r.served)
	}
}

// TestDynamics runs the fleet changes (a cold start, a demand drop, a
// join, a restart) with Envoy 1.40's clients: at each, every client has
// 90 % of its fair share within two report intervals, and the bound
// holds in every window.
func TestDynamics(t *testing.T) {
	r, err := dynamics{name: "Envoy 1.40", seed: 2}.run()
	if err != nil {
		t.Fatal(err)
	}
	if r.violation != "" || r.worst == 0 || r.worst > 1 {
		t.Errorf("bound: worst %.2f, %s", r.worst, r.violation)
	}
	for i, ev := range r.events {
		if at := r.reached[i]; at < 0 || at > 10*time.Second {
			t.Errorf("%s: 90 %% of the fair shares after %v, want within 10 s", ev.name, at)
		}
	}
}
