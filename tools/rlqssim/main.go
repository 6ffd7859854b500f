// Command rlqssim runs a fleet of mimicked Envoy 1.40 rate_limit_quota
// clients against the service's Rate Limit Quota Service, in process and
// on a fake clock, for what real Envoy cannot do fast: a hundred Envoys
// with skewed and shifting loads over minutes, reports every 5 s or 1 s,
// and 10,000 buckets. It checks docs/RLQS.md's bound over every window,
// the fairness of the split and how fast it converges after a shift, and
// measures the service's cost: CPU per bucket report and per tick, and
// memory per subscription. Some scenarios run several replicas sharing
// the pools through a real redis-server (started for the run), one of
// them killed mid-run. It prints Markdown for docs/RLQS.md.
//
//	go run ./tools/rlqssim                 # every scenario
//	go run ./tools/rlqssim -run cost       # the ones whose name contains "cost"
//	go run ./tools/rlqssim -run dynamics   # a cold start, a demand drop, a join, a restart
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"
)

func main() {
	run := flag.String("run", "", "run only the scenarios whose name contains this")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the runs to this `file`")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "rlqssim:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := runAll(os.Stdout, *run); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "rlqssim:", err)
		os.Exit(1)
	}
}

// scenarios are the runs the report is made of.
func scenarios() []scenario {
	base := scenario{
		envoys: 100, tenants: 50, rate: 200, burst: 50,
		interval: 5 * time.Second, ttl: 15 * time.Second,
		duration: 5 * time.Minute, shiftEvery: time.Minute, reconnect: 0.1, dt: 10 * time.Millisecond,
		sample: 10, overload: 3, seed: 28,
	}
	fast := base
	fast.name, fast.interval, fast.ttl = "skewed, 1 s reports", time.Second, 3*time.Second
	base.name = "skewed, 5 s reports"
	cost := base
	cost.name, cost.tenants, cost.duration, cost.dt, cost.sample, cost.checks = "cost, 10,000 buckets", 10_000, 2*time.Minute, 100*time.Millisecond, 0, false
	// The ticks run beside the streams' calls, as in the service, which
	// shows how long a stream waits for a tick.
	cost.concurrent = true
	base.checks, fast.checks = true, true
	two := base
	two.name, two.replicas = "skewed, 5 s reports, 2 replicas", 2
	three := base
	three.name, three.replicas, three.kill = "skewed, 5 s reports, 3 replicas, one killed at 2:30", 3, 150*time.Second
	costShared := cost
	costShared.name, costShared.replicas = "cost, 10,000 buckets, 3 replicas", 3
	return []scenario{base, fast, two, three, cost, costShared}
}

func runAll(w io.Writer, filter string) error {
	if filter == "dynamics" {
		return runDynamics(w)
	}
	fmt.Fprintln(w, "| scenario | Envoys | buckets | subscriptions | worst window / bound | fallbacks | fairness error (mean, worst) | converged within | takeovers, late grants | CPU per bucket report | a stream's longest wait in a tick (median, most) | time per tick | Redis CPU | heap per subscription |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, sc := range scenarios() {
		if filter != "" && !strings.Contains(sc.name, filter) {
			continue
		}
		r, err := sc.run()
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		fmt.Fprintln(w, r.row(sc))
	}
	if filter == "" {
		fmt.Fprintln(w)
		return runDynamics(w)
	}
	return nil
}
