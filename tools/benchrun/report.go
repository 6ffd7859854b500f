package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/loadgen"
)

// The generated part of the markdown file sits between these markers; the
// rest of the file is left as it is.
const (
	startMarker = "<!-- benchrun:start -->"
	endMarker   = "<!-- benchrun:end -->"
)

// report is everything one benchrun writes.
type report struct {
	command string
	date    time.Time
	machine string
	timing  timing
	rows    []*row
	notes   []string
	// capacity are the redis-benchmark tests of one redis-server; empty
	// when not measured.
	capacity []capacityResult
}

// find returns the measured row of store and scenario id, or nil.
func (rep *report) find(store, id string) *row {
	for _, rw := range rep.rows {
		if rw.store == store && rw.sc.id == id && rw.skip == "" && rw.variant == "" {
			return rw
		}
	}
	return nil
}

// anchorVariant marks the rows of envoyproxy/ratelimit measured beside
// the service (-anchor).
const anchorVariant = "envoyproxy/ratelimit"

// anchorRow returns the anchor's row of store and scenario id, or nil.
func (rep *report) anchorRow(store, id string) *row {
	for _, rw := range rep.rows {
		if rw.store == store && rw.sc.id == id && rw.skip == "" && rw.variant == anchorVariant {
			return rw
		}
	}
	return nil
}

// sideBySideMarkdown compares the service with envoyproxy/ratelimit on the
// scenarios both ran, round by round: each ratio is taken within a round,
// the two runs seconds apart under the same load; the median and the range
// of the rounds' ratios.
func (rep *report) sideBySideMarkdown() string {
	var b strings.Builder
	for _, ours := range rep.rows {
		if ours.variant != "" || ours.skip != "" {
			continue
		}
		theirs := rep.anchorRow(ours.store, ours.sc.id)
		if theirs == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("**Side by side with envoyproxy/ratelimit** (the anchor's binary given with `-anchor` / `ANCHOR_BIN`, on the same store, in the same rounds; " +
				"each ratio is taken within a round, then the median and range of the rounds)\n\n" +
				"| scenario | store | req/s, ours | req/s, anchor | ours ÷ anchor | CPU µs/decision, ours | anchor | anchor ÷ ours | p99, ours | anchor | errors, ours / anchor |\n" +
				"|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
		}
		var tput, cpu []float64
		for i := range min(len(ours.runs), len(theirs.runs)) {
			tput = append(tput, ours.runs[i].res.RPS()/theirs.runs[i].res.RPS())
			if c := theirs.runs[i].cpuUS / ours.runs[i].cpuUS; !math.IsNaN(c) && !math.IsInf(c, 0) {
				cpu = append(cpu, c)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %d / %d |\n",
			ours.sc.title, ours.store, ours.rps, theirs.rps, ratioRange(tput), optional(ours.cpuUS, "%.1f"), optional(theirs.cpuUS, "%.1f"),
			ratioRange(cpu), loadgen.FormatDuration(ours.p99), loadgen.FormatDuration(theirs.p99), ours.errorCount, theirs.errorCount)
	}
	return b.String()
}

// ratioRange formats the median of ratios and their range.
func ratioRange(xs []float64) string {
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", median(xs), slices.Min(xs), slices.Max(xs))
}

// check is one line of the bar of issues 5 and 15.
type check struct {
	what     string
	measured string
	// met is "yes", "no" or "n/a" (not measured).
	met string
}

// bar evaluates the targets of issues 5 and 15 on this run's figures. Every ratio
// is the median of the per-run ratios to the paired no-op runs.
func (rep *report) bar() []check {
	var out []check
	ratioCheck := func(store, id, what string, want float64) {
		rw := rep.find(store, id)
		if rw == nil || math.IsNaN(rw.ratio) {
			out = append(out, check{what, "not measured", "n/a"})
			return
		}
		measured := fmt.Sprintf("%.0f%% (medians %.0f and %.0f req/s)", 100*rw.ratio, rw.rps, rw.ceilRPS)
		if rw.errorCount > 0 {
			// Failed requests are answered fast: the ratio overstates.
			measured += fmt.Sprintf(", with %d errors", rw.errorCount)
		}
		out = append(out, check{what, measured, yesNo(rw.ratio >= want)})
	}
	ratioCheck("memory", "c64", "memory, (a) c=64: ≥ 85% of the ceiling", 0.85)
	ratioCheck("redis", "c64", "redis, (a) c=64: ≥ 75% of the ceiling", 0.75)
	if rw := rep.find("redis", "c64"); rw != nil && !math.IsNaN(rw.cpuUS) {
		measured := fmt.Sprintf("%.1f µs", rw.cpuUS)
		if !math.IsNaN(rw.ceilCPUUS) {
			// What gRPC alone costs on this machine puts the figure in scale.
			measured += fmt.Sprintf(" (no-op server: %.1f µs)", rw.ceilCPUUS)
		}
		out = append(out, check{"redis, (a) c=64: ≤ 20 µs service CPU per decision", measured, yesNo(rw.cpuUS <= 20)})
	} else {
		out = append(out, check{"redis, (a) c=64: ≤ 20 µs service CPU per decision", "not measured", "n/a"})
	}
	ratioCheck("memcache", "c64", "memcache, (a) c=64: ≥ 50% of the ceiling", 0.50)
	if rw := rep.find("redis", "c64"); rw != nil && !math.IsNaN(rw.p99Ratio) {
		out = append(out, check{"redis, (a) c=64: p99 ≤ 1.5 × the no-op p99",
			fmt.Sprintf("%.2f× (medians %s and %s)", rw.p99Ratio, loadgen.FormatDuration(rw.p99), loadgen.FormatDuration(rw.ceilP99)), yesNo(rw.p99Ratio <= 1.5)})
	} else {
		out = append(out, check{"redis, (a) c=64: p99 ≤ 1.5 × the no-op p99", "not measured", "n/a"})
	}
	ratioCheck("redis", "hot+nc", "redis, hot key with near cache: ≥ 90% of the ceiling", 0.90)
	if rw := rep.find("redis", "hot+nc"); rw != nil && !math.IsNaN(rw.rt) {
		out = append(out, check{"redis, hot key with near cache: 0 Redis round trips", fmt.Sprintf("%.4f per decision", rw.rt), yesNo(rw.rt == 0)})
	} else {
		out = append(out, check{"redis, hot key with near cache: 0 Redis round trips", "not measured", "n/a"})
	}
	// Issue 15, against the ceiling with the service's tuning.
	ratioCheck("memcache", "c64", "issue 15: memcache, (a) c=64: ≥ 75% of the ceiling", 0.75)
	ratioCheck("memcache", "chain", "issue 15: memcache, (c) 3 descriptors: ≥ 60% of the ceiling", 0.60)
	ratioCheck("memory", "chain", "issue 15: memory, (c) 3 descriptors: ≥ 95% of the ceiling", 0.95)
	ratioCheck("redis", "chain", "issue 15: redis, (c) 3 descriptors: ≥ 80% of the ceiling", 0.80)
	return append(out, rep.algorithmChecks()...)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// markdown renders the generated section, markers excluded. pngRel is the
// plot's path relative to the markdown file.
func (rep *report) markdown(pngRel string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("\n_Generated by `%s` on %s._\n\n", strings.TrimSpace(rep.command), rep.date.Format("2006-01-02 15:04 MST"))
	w("- Machine: %s.\n", rep.machine)
	w("- Each figure is the median of %d run(s) of %v. The scenarios take turns: every round runs each scenario once, "+
		"after a %v warm-up in the first round (at most %v in later ones, for the new connections). The load generator "+
		"(tools/ratelimit-bench, in process, up to 4 gRPC connections) runs on the same machine as the service.\n",
		rep.timing.runs, rep.timing.duration, rep.timing.warmup, min(rep.timing.warmup, noopWarmup))
	w("- Ceiling, paired: a no-op RLS server on grpc-go with the service's default runtime tuning (%d stream workers, %d MiB of GC headroom) "+
		"runs in a process of its own for the whole run, and the same server with grpc-go's and Go's defaults in another. "+
		"For every scenario and every run i, both are measured under the same load (same concurrency, same descriptors, same duration), "+
		"the untuned one, then the tuned one immediately before the service's run i, after a warm-up of at most %v per scenario, "+
		"so the runs are seconds apart and see the same load from the rest of the machine. "+
		"_of no-op_ is the median of the per-run ratios req/s_i ÷ tuned no-op req/s_i (and the p99 bar the median of p99_i ÷ no-op p99_i), "+
		"what the service gets of what gRPC alone costs; _of untuned_ the same against the untuned no-op server; "+
		"the _no-op_ columns are the medians of the paired tuned no-op runs.\n", loadgen.ServiceTuning.StreamWorkers, noopGCHeadroom>>20, noopWarmup)
	w("- A decision is one ShouldRateLimit call, whatever its number of descriptors. "+
		"CPU: utime+stime of the service process from /proc per decision; RSS: VmRSS after the run; "+
		"round trips: the service's `%s` (Memcached: `%s`) counter per decision; Redis CPU and commands: the change of "+
		"`used_cpu_user`+`used_cpu_sys` and `total_commands_processed` (which counts the commands a script calls) "+
		"in Redis INFO per decision, summed over the cluster's masters.\n\n", redisRoundTrips, memcacheRoundTrips)
	if pngRel != "" {
		w("![throughput and p99 per store and scenario, the paired no-op ceiling as a gray line](%s)\n\n", pngRel)
	}
	w("| scenario | store | c | req/s | no-op req/s | of no-op | of untuned | p50 | p99 | no-op p99 | CPU µs/decision | RSS MiB | store round trips/decision | Redis commands/decision | Redis CPU µs/decision | OK / OVER_LIMIT / errors |\n")
	w("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, rw := range rep.rows {
		if rw.variant == anchorVariant {
			continue // in the side-by-side table
		}
		if rw.skip != "" {
			w("| %s | %s | %d | – | – | – | – | – | – | – | – | – | – | – | – | not measured: %s |\n", rw.sc.title, rw.store, rw.sc.c, rw.skip)
			continue
		}
		ceilP99 := "–"
		if rw.ceilP99 > 0 {
			ceilP99 = loadgen.FormatDuration(rw.ceilP99)
		}
		w("| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			rw.sc.title, rw.store, rw.sc.c, rw.rps, optional(rw.ceilRPS, "%.0f"), percent(rw.ratio), percent(rw.untunedRatio),
			loadgen.FormatDuration(rw.p50), loadgen.FormatDuration(rw.p99), ceilP99,
			optional(rw.cpuUS, "%.1f"), optional(rw.rssMiB, "%.0f"), optional(rw.rt, "%.3f"),
			optional(rw.redisCmds, "%.2f"), optional(rw.redisCPUUS, "%.1f"),
			outcomes(rw))
	}
	if t := rep.sideBySideMarkdown(); t != "" {
		w("\n%s", t)
	}
	w("\n**The bar (issues 5 and 15)**\n\n| target | measured | met |\n|---|---|---|\n")
	for _, c := range rep.bar() {
		w("| %s | %s | %s |\n", c.what, c.measured, c.met)
	}
	if t := rep.algorithmsMarkdown(); t != "" {
		w("\n%s", t)
	}
	if t := rep.cpuMarkdown(); t != "" {
		w("\n%s", t)
	}
	if len(rep.capacity) > 0 {
		w("\n%s", rep.capacityMarkdown())
	}
	if len(rep.notes) > 0 {
		w("\nNotes:\n\n")
		for _, n := range rep.notes {
			w("- %s\n", n)
		}
	}
	b.WriteByte('\n')
	return b.String()
}

// capacityMarkdown renders the redis-benchmark table.
func (rep *report) capacityMarkdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("**One Redis (one cluster shard), redis-benchmark**\n\n")
	w("A redis-server of its own on 127.0.0.1, 10,000 random keys (`-r 10000`), redis-benchmark on the same machine " +
		"(so it takes CPU from Redis: ops/s is a lower bound). _Redis CPU µs/request_ is the server's own CPU " +
		"(INFO) per request; 10⁶ ÷ it is what one shard could answer with a core to itself.\n\n")
	w("| load | command | pipeline (-P) | clients (-c) | requests (-n) | ops/s | p50 | Redis CPU µs/request | ops/s with one full core |\n")
	w("|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, c := range rep.capacity {
		p50 := "n/a"
		if c.p50 > 0 {
			p50 = loadgen.FormatDuration(c.p50)
		}
		full := math.NaN()
		if c.cpuUS > 0 {
			full = 1e6 / c.cpuUS
		}
		w("| %s | `%s` | %d | %d | %d | %.0f | %s | %s | %s |\n", c.load, c.command, c.pipeline, c.clients, c.requests,
			c.rps, p50, optional(c.cpuUS, "%.2f"), optional(full, "%.0f"))
	}
	return b.String()
}

func percent(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*v)
}

func optional(v float64, format string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

func outcomes(rw *row) string {
	s := fmt.Sprintf("%d / %d / %d", rw.ok, rw.over, rw.errorCount)
	if rw.errorCount > 0 {
		var parts []string
		for c, n := range rw.errors {
			parts = append(parts, fmt.Sprintf("%s %d", c, n))
		}
		slices.Sort(parts)
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	if rw.unknown > 0 {
		s += fmt.Sprintf(", UNKNOWN %d", rw.unknown)
	}
	return s
}

// replaceSection puts body between the benchrun markers of doc, keeping
// everything else. Without markers, doc gets them appended.
func replaceSection(doc, body string) string {
	return replaceBetween(doc, startMarker, endMarker, body)
}

// replaceBetween puts body between the markers start and end of doc,
// keeping everything else. Without markers, doc gets them appended.
func replaceBetween(doc, start, end, body string) string {
	i := strings.Index(doc, start)
	j := strings.Index(doc, end)
	if i >= 0 && j > i {
		return doc[:i+len(start)] + body + doc[j:]
	}
	if doc != "" && !strings.HasSuffix(doc, "\n") {
		doc += "\n"
	}
	if doc != "" {
		doc += "\n"
	}
	return doc + start + body + end + "\n"
}

// writeMarkdown writes the report into path between the markers, creating
// the file with a title when it does not exist.
func writeMarkdown(path string, rep *report, pngPath string) error {
	doc := "# Benchmarks\n\nReproduce with `make bench` (`go run ./tools/benchrun`).\n"
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		doc = string(b)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("benchrun: %w", err)
	}
	rel, err := filepath.Rel(filepath.Dir(path), pngPath)
	if err != nil {
		rel = pngPath
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("benchrun: %w", err)
	}
	return os.WriteFile(path, []byte(replaceSection(doc, rep.markdown(filepath.ToSlash(rel)))), 0o644)
}
