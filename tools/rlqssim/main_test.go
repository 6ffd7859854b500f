package main

import (
	"strings"
	"testing"
	"time"
)

// TestSmallFleet runs a small fleet through the whole simulation: the
// bound holds in every window, no assignment ever expires, the grants
// converge after each shift, and the report's row says so.
func TestSmallFleet(t *testing.T) {
	sc := scenario{
		name: "small", envoys: 10, tenants: 4, rate: 50, burst: 10, overload: 3,
		interval: 5 * time.Second, ttl: 15 * time.Second,
		duration: 90 * time.Second, shiftEvery: 30 * time.Second, reconnect: 0.3, dt: 10 * time.Millisecond,
		sample: 4, checks: true, seed: 1,
	}
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
	if r.subs == 0 || r.heapPerSub <= 0 {
		t.Errorf("subscriptions %d, heap per subscription %.0f: want both measured", r.subs, r.heapPerSub)
	}
	if row := r.row(sc); !strings.HasPrefix(row, "| small | 10 | 4 |") {
		t.Errorf("row = %q", row)
	}
}
