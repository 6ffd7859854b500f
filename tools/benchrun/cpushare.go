package main

import (
	"fmt"
	"math"
	"strings"
)

// Where the CPU of a decision goes: the load generator, the server and the
// store share the machine's cores, so when the machine is busy, a service
// run's throughput relative to its paired no-op run is about the CPU a
// no-op decision costs all processes over what a service decision costs
// them. The table puts each scenario's gap to the ceiling in those terms:
// what the service spends beyond the no-op server, and what the store
// spends, per decision.

// cpuShare is one run's CPU per decision by process (µs), NaN where not
// measured.
type cpuShare struct {
	gen, server, store float64
}

// all is the sum of what was measured; the store counts only when measured
// (the memory store is the service's own CPU).
func (c cpuShare) all() float64 {
	s := c.gen + c.server
	if !math.IsNaN(c.store) {
		s += c.store
	}
	return s
}

// share returns m's CPU per decision by process: the store's is the
// store process's, or Redis's from INFO.
func share(m runResult) cpuShare {
	st := m.storeCPUUS
	if math.IsNaN(st) {
		st = m.redisCPUUS
	}
	return cpuShare{gen: m.genCPUUS, server: m.cpuUS, store: st}
}

// cpuRow is one scenario's medians over its paired runs.
type cpuRow struct {
	svc, noop cpuShare
	// expected is the median of the per-run ratios noop.all() ÷
	// svc.all(): the fraction of the ceiling the CPU alone allows;
	// busy the median of the cores the service run kept busy.
	expected, busy float64
}

// cpuBreakdown returns rw's medians, ok false without paired runs that
// measured the generator and both servers.
func cpuBreakdown(rw *row) (cpuRow, bool) {
	if rw.skip != "" || len(rw.ceil) != len(rw.runs) || len(rw.runs) == 0 {
		return cpuRow{}, false
	}
	var gen, server, store, ngen, nserver, expected, busy []float64
	for i, m := range rw.runs {
		s, n := share(m), share(rw.ceil[i])
		if math.IsNaN(s.gen) || math.IsNaN(s.server) || math.IsNaN(n.gen) || math.IsNaN(n.server) {
			continue
		}
		gen, server, ngen, nserver = append(gen, s.gen), append(server, s.server), append(ngen, n.gen), append(nserver, n.server)
		if !math.IsNaN(s.store) {
			store = append(store, s.store)
		}
		expected = append(expected, n.all()/s.all())
		busy = append(busy, s.all()*m.res.RPS()/1e6)
	}
	if len(expected) == 0 {
		return cpuRow{}, false
	}
	return cpuRow{
		svc:      cpuShare{gen: median(gen), server: median(server), store: median(store)},
		noop:     cpuShare{gen: median(ngen), server: median(nserver), store: math.NaN()},
		expected: median(expected),
		busy:     median(busy),
	}, true
}

// cpuMarkdown renders the breakdown of every row that has one, or "".
func (rep *report) cpuMarkdown() string {
	var b strings.Builder
	for _, rw := range rep.rows {
		if rw.variant == anchorVariant {
			continue // measured without the no-op pairing's breakdown
		}
		c, ok := cpuBreakdown(rw)
		if !ok {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("**Where a decision's CPU goes**\n\n" +
				"CPU per decision (µs) of each process in the service's runs and in their paired no-op runs, medians: " +
				"the load generator (benchrun's own process, which runs nothing else meanwhile), the server, and the store " +
				"(memcached's process from /proc, Redis's from INFO; the memory store is inside the service). " +
				"When the cores are busy, the service's fraction of the ceiling is about _no-op all_ ÷ _all_ " +
				"(the median of the per-run ratios, _CPU allows_); _cores busy_ is the service run's _all_ × req/s. " +
				"Where _of no-op_ is well below what the CPU allows, the service waited rather than worked.\n\n" +
				"| scenario | store | generator | service | store process | all | no-op run: generator | no-op server | no-op all | CPU allows | of no-op | cores busy |\n" +
				"|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %.1f | %.1f | %s | %s | %.2f |\n",
			rw.sc.title, rw.store, c.svc.gen, c.svc.server, optional(c.svc.store, "%.1f"), c.svc.all(),
			c.noop.gen, c.noop.server, c.noop.all(), percent(c.expected), percent(rw.ratio), c.busy)
	}
	return b.String()
}
