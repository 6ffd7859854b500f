package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The algorithms against the fixed window (issue 15): each algorithm's run
// of a round is compared with the fixed window's run of the same round,
// which the scenarios' taking turns puts a few seconds away, and the
// medians of those per-round ratios are reported. A ratio of two medians
// taken minutes apart would mostly measure what else the machine did.

// algorithmRatios are one algorithm's per-round ratios to the fixed window
// on one store; every slice holds one value per round that measured it.
type algorithmRatios struct {
	store, algorithm string
	// throughput is (req/s ÷ paired no-op req/s) of the algorithm's run
	// over the same of the fixed window's run: the paired no-op runs take
	// out what the rest of the machine did to either.
	throughput []float64
	// cpu is the service's CPU per decision over the fixed window's;
	// redisCPU the same for Redis's CPU (empty off Redis).
	cpu, redisCPU []float64
}

// algorithmScenarios are the ids of scenario (d) other than the fixed window.
var algorithmScenarios = []string{"sliding", "log", "bucket"}

// algorithmComparison returns the ratios of every store that measured the
// fixed window and at least one other algorithm, in the order of the rows.
func (rep *report) algorithmComparison() []algorithmRatios {
	var out []algorithmRatios
	for _, rw := range rep.rows {
		if rw.skip != "" || rw.variant != "" || !slices.Contains(algorithmScenarios, rw.sc.id) {
			continue
		}
		fixed := rep.find(rw.store, "fixed")
		if fixed == nil {
			continue
		}
		a := algorithmRatios{store: rw.store, algorithm: scenarioAlgorithm(rw.sc)}
		for i := range min(len(rw.runs), len(fixed.runs)) {
			m, f := rw.runs[i], fixed.runs[i]
			if i < len(rw.ceil) && i < len(fixed.ceil) {
				if q := relative(m.res.RPS()/rw.ceil[i].res.RPS(), f.res.RPS()/fixed.ceil[i].res.RPS()); !math.IsNaN(q) {
					a.throughput = append(a.throughput, q)
				}
			} else if q := relative(m.res.RPS(), f.res.RPS()); !math.IsNaN(q) {
				a.throughput = append(a.throughput, q)
			}
			if q := relative(m.cpuUS, f.cpuUS); !math.IsNaN(q) {
				a.cpu = append(a.cpu, q)
			}
			if q := relative(m.redisCPUUS, f.redisCPUUS); !math.IsNaN(q) {
				a.redisCPU = append(a.redisCPU, q)
			}
		}
		out = append(out, a)
	}
	return out
}

// relative is x ÷ y, NaN unless both are measured and y is positive.
func relative(x, y float64) float64 {
	if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || y <= 0 || math.IsInf(y, 0) {
		return math.NaN()
	}
	return x / y
}

// spread renders the median of xs and, with more than one value, their
// range: "1.92× (1.80–2.10)".
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "–"
	}
	s := fmt.Sprintf("%.2f×", median(xs))
	if len(xs) > 1 {
		s += fmt.Sprintf(" (%.2f–%.2f)", slices.Min(xs), slices.Max(xs))
	}
	return s
}

// algorithmsMarkdown renders the comparison, or "" when no store measured
// the fixed window and another algorithm.
func (rep *report) algorithmsMarkdown() string {
	as := rep.algorithmComparison()
	if len(as) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "**The algorithms against the fixed window (issue 15)**\n\n"+
		"Each ratio is taken within one round (the algorithm's run and the fixed window's, seconds apart); "+
		"the median of the %d rounds, and their range in brackets. _Throughput_ compares the runs' fractions of their paired no-op runs.\n\n",
		rep.timing.runs)
	b.WriteString("| store | algorithm | throughput × fixed window | service CPU per decision × fixed window | Redis CPU per decision × fixed window |\n|---|---|--:|--:|--:|\n")
	for _, a := range as {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", a.store, a.algorithm, spread(a.throughput), spread(a.cpu), spread(a.redisCPU))
	}
	return b.String()
}

// algorithmChecks are issue 15's targets for the Lua algorithms on one
// Redis: Redis CPU per decision ≤ 2× the fixed window's and throughput ≥
// 0.9 of it, medians of the per-round ratios.
func (rep *report) algorithmChecks() []check {
	var out []check
	for _, a := range rep.algorithmComparison() {
		if a.store != "redis" {
			continue
		}
		what := fmt.Sprintf("issue 15: redis, %s: Redis CPU per decision ≤ 2× the fixed window's", a.algorithm)
		if len(a.redisCPU) == 0 {
			out = append(out, check{what, "not measured", "n/a"})
		} else {
			out = append(out, check{what, spread(a.redisCPU), yesNo(median(a.redisCPU) <= 2)})
		}
		what = fmt.Sprintf("issue 15: redis, %s: throughput ≥ 0.9 of the fixed window's", a.algorithm)
		if len(a.throughput) == 0 {
			out = append(out, check{what, "not measured", "n/a"})
		} else {
			out = append(out, check{what, spread(a.throughput), yesNo(median(a.throughput) >= 0.9)})
		}
	}
	return out
}
