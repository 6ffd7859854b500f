package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimit/loadgen"
)

// The overload steps (issue 25, -overload): the service on each store, at
// its default settings, driven by more and more calls in flight (64, 256,
// 1024 and 4096 by default, 4096 being MAX_CONCURRENT_REQUESTS), each call
// with the same caller's deadline. Each step reports the errors by gRPC
// code, the store's circuit-breaker trips and the calls shed for load
// during the step, the throughput and the latency's p50, p99 and p99.9.
//
// With a healthy store and a generous deadline (2 s) every step should show
// no error and no trip: a busy process is not a failing store. With
// Envoy's default deadline (20 ms), the steps past what the process can
// answer in time show the calls it refuses early (RESOURCE_EXHAUSTED,
// counted as load_shed) beside those it answers, whose latency stays
// within the deadline, and still no trip.
//
// With -anchor (ANCHOR_BIN), envoyproxy/ratelimit runs on the same store,
// its rules the same, and each step is measured on it right after this
// service's, so that the two are compared under the same conditions.
//
// The figures depend on the machine and on what else runs on it: the
// steps are printed, never written into the docs.

// overloadStat names the service's counters read around each step.
const (
	overloadShedStat = "ratelimit.service.call.should_rate_limit.load_shed"
	overloadTripStat = "breaker_trips"
)

// overloadConfig is what -overload measures.
type overloadConfig struct {
	stores    []string
	steps     []int
	deadlines []time.Duration
	timing    timing
	bin, dir  string
	// anchor is an envoyproxy/ratelimit binary measured beside, or "".
	anchor string
}

// overloadRow is one step's result.
type overloadRow struct {
	store string
	// impl is the service measured: this one, or anchorVariant.
	impl     string
	c        int
	deadline time.Duration
	res      *loadgen.Result
	// trips and shed are the breaker trips and the calls shed during the
	// step, from the service's /stats; NaN when it has no such counter
	// (another build, the memory store's breaker).
	trips, shed float64
}

// parseSteps reads -steps: a comma list of positive counts of calls in
// flight.
func parseSteps(spec string) ([]int, error) {
	var steps []int
	for f := range strings.SplitSeq(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("benchrun: -steps: %q is not a positive count of calls in flight", f)
		}
		steps = append(steps, n)
	}
	if len(steps) == 0 {
		return nil, errors.New("benchrun: -steps: no step")
	}
	return steps, nil
}

// parseDeadlines reads -deadlines: a comma list of positive durations.
func parseDeadlines(spec string) ([]time.Duration, error) {
	var ds []time.Duration
	for f := range strings.SplitSeq(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("benchrun: -deadlines: %q is not a positive duration", f)
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return nil, errors.New("benchrun: -deadlines: no deadline")
	}
	return ds, nil
}

// overloadFlags are the command line's -overload settings.
type overloadFlags struct {
	stores           []string
	steps, deadlines string
	bin, dir         string
	anchor           string
}

// runOverloadSteps is benchrun -overload: it builds the service unless
// -bin names one, measures the steps and prints the table on stdout.
func runOverloadSteps(ctx context.Context, r *runner, f overloadFlags) error {
	steps, err := parseSteps(f.steps)
	if err != nil {
		return err
	}
	deadlines, err := parseDeadlines(f.deadlines)
	if err != nil {
		return err
	}
	if f.bin == "" {
		f.bin = filepath.Join(f.dir, "ratelimit")
		r.logf("benchrun: go build ./cmd/ratelimit")
		if err := buildService(ctx, f.bin); err != nil {
			return err
		}
	}
	cfg := overloadConfig{stores: f.stores, steps: steps, deadlines: deadlines, timing: r.timing, bin: f.bin, dir: f.dir, anchor: f.anchor}
	r.step, r.steps = 0, len(f.stores)*len(steps)*len(deadlines)
	if f.anchor != "" {
		for _, st := range f.stores {
			if anchorStore(st) {
				r.steps += len(steps) * len(deadlines)
			}
		}
	}
	r.logf("benchrun: overload steps %v with deadlines %v on %s; %v per step after a %v warm-up",
		steps, deadlines, strings.Join(f.stores, ", "), r.timing.duration, r.timing.warmup)
	return r.runOverload(ctx, cfg, os.Stdout)
}

// runOverload measures the steps on every store and writes the table to
// out.
func (r *runner) runOverload(ctx context.Context, cfg overloadConfig, out io.Writer) error {
	var rows []overloadRow
	for _, st := range cfg.stores {
		got, err := r.overloadStore(ctx, st, cfg)
		if err != nil {
			return err
		}
		rows = append(rows, got...)
	}
	_, err := io.WriteString(out, overloadMarkdown(rows, cfg))
	return err
}

// overloadStore starts store's servers and the service on them, and
// measures every deadline's steps.
func (r *runner) overloadStore(ctx context.Context, store string, cfg overloadConfig) ([]overloadRow, error) {
	dir := filepath.Join(cfg.dir, store)
	be, err := startBackend(ctx, store, dir, r.logf)
	if err != nil {
		return nil, err
	}
	if be.stop != nil {
		defer be.stop()
	}
	r.logf("benchrun: starting the service on %s", store)
	svc, err := startWithRules(ctx, cfg.bin, "ratelimit ("+store+")", filepath.Join(dir, "rules"), map[string]string{}, be.env...)
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	trips := storeStatPrefix(store) + overloadTripStat
	type impl struct {
		name string // "" for this service
		svc  *service
	}
	impls := []impl{{"", svc}}
	if cfg.anchor != "" && anchorStore(store) {
		r.logf("benchrun: starting envoyproxy/ratelimit (%s) on %s", cfg.anchor, store)
		asvc, err := startAnchor(ctx, cfg.anchor, store, dir, be)
		if err != nil {
			return nil, err
		}
		defer asvc.stop()
		impls = append(impls, impl{anchorVariant, asvc})
	}

	var rows []overloadRow
	for _, d := range cfg.deadlines {
		for _, c := range cfg.steps {
			for _, im := range impls {
				r.step++
				label := fmt.Sprintf("%s: %d in flight, deadline %v", store, c, d)
				if im.name != "" {
					label = im.name + " on " + label
				}
				row, err := r.overloadStep(ctx, im.svc, trips, c, d, cfg.timing)
				if err != nil {
					return nil, fmt.Errorf("benchrun: %s: %w", label, err)
				}
				row.store, row.impl = store, im.name
				r.logf("%s: %s", label, overloadSummary(row))
				rows = append(rows, row)
				if !im.svc.running() {
					return nil, im.svc.exitError()
				}
			}
		}
	}
	return rows, nil
}

// startAnchor starts envoyproxy/ratelimit's binary bin on store's servers
// be, with the standard scenarios' rules (it knows no algorithm but the
// fixed window) in dir/anchor-rules, and checks that it applies them.
func startAnchor(ctx context.Context, bin, store, dir string, be *backend) (*service, error) {
	aroot := filepath.Join(dir, "anchor-rules")
	if err := writeRules(aroot, rulesHead); err != nil {
		return nil, err
	}
	// Its /healthcheck never says 200 on Memcached.
	svc, err := startServiceUntil(ctx, bin, anchorVariant+" ("+store+")", aroot, store != "memcache", be.env...)
	if err != nil {
		return nil, err
	}
	if err := checkCall(ctx, svc.grpcAddr, 1); err != nil {
		svc.stop()
		return nil, fmt.Errorf("benchrun: %s on %s: %w", anchorVariant, store, err)
	}
	return svc, nil
}

// anchorStore reports whether envoyproxy/ratelimit runs on store here.
func anchorStore(store string) bool { return store == "redis" || store == "memcache" }

// storeStatPrefix is the prefix of store's statistics.
func storeStatPrefix(store string) string {
	switch store {
	case "memcache":
		return "ratelimit.memcache."
	case "memory":
		return "ratelimit.memory."
	}
	return "ratelimit.redis."
}

// overloadStep runs c calls in flight with deadline d against svc: a
// warm-up, then the measured run, with the breaker trips and the load shed
// read before and after it.
func (r *runner) overloadStep(ctx context.Context, svc *service, trips string, c int, d time.Duration, t timing) (overloadRow, error) {
	// GRPC_MAX_CONCURRENT_STREAMS (1024) per connection: enough
	// connections for every call to be in flight at once.
	conns := min(16, max(4, (c+1023)/1024))
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	client, err := loadgen.Dial(dctx, svc.grpcAddr, conns)
	cancel()
	if err != nil {
		return overloadRow{}, err
	}
	defer client.Close()
	load := loadgen.Load{Domain: "bench", Descriptors: []string{usersTemplate}, Concurrency: c, Timeout: d}
	if t.warmup > 0 {
		load.Duration = t.warmup
		if _, err := client.Run(ctx, load); err != nil {
			return overloadRow{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	stat := func(name string) float64 {
		if v, ok := fetchStat(svc.statsURL, name); ok {
			return v
		}
		return math.NaN()
	}
	trips0, shed0 := stat(trips), stat(overloadShedStat)
	load.Duration = t.duration
	res, err := client.Run(ctx, load)
	if err != nil {
		return overloadRow{}, err
	}
	return overloadRow{c: c, deadline: d, res: res, trips: stat(trips) - trips0, shed: stat(overloadShedStat) - shed0}, nil
}

// overloadSummary is a step's line in the progress log.
func overloadSummary(row overloadRow) string {
	res := row.res
	return fmt.Sprintf("%.0f calls/s  p50 %s  p99 %s  p99.9 %s  OK %d  errors %s  trips %s  shed %s",
		res.RPS(), loadgen.FormatDuration(res.Latency.P50), loadgen.FormatDuration(res.Latency.P99),
		loadgen.FormatDuration(res.Latency.P999), res.OK+res.OverLimit, errorsByCode(res.Errors),
		count(row.trips), count(row.shed))
}

// errorsByCode lists errors by gRPC code, most first ("none" for none).
func errorsByCode(errs map[codes.Code]uint64) string {
	type kv struct {
		code codes.Code
		n    uint64
	}
	var all []kv
	for c, n := range errs {
		if n > 0 {
			all = append(all, kv{c, n})
		}
	}
	if len(all) == 0 {
		return "none"
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.n != b.n {
			return int(b.n) - int(a.n)
		}
		return int(a.code) - int(b.code)
	})
	parts := make([]string, len(all))
	for i, e := range all {
		parts[i] = fmt.Sprintf("%s %d", strings.ToUpper(codeName(e.code)), e.n)
	}
	return strings.Join(parts, ", ")
}

// codeName is a gRPC code's name in the protocol's spelling
// (RESOURCE_EXHAUSTED).
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// count formats a counter's delta, "—" when unknown.
func count(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// overloadMarkdown is the table of the steps, with how it was measured.
func overloadMarkdown(rows []overloadRow, cfg overloadConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nOverload steps: %s; %v per step after a %v warm-up; each call with its deadline.\n\n",
		machineInfo(), cfg.timing.duration, cfg.timing.warmup)
	b.WriteString("| store | service | calls in flight | deadline | calls/s | p50 | p99 | p99.9 | answered | errors by code | breaker trips | shed |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, row := range rows {
		res := row.res
		impl := row.impl
		if impl == "" {
			impl = "this service"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %v | %.0f | %s | %s | %s | %d | %s | %s | %s |\n",
			row.store, impl, row.c, row.deadline, res.RPS(), loadgen.FormatDuration(res.Latency.P50),
			loadgen.FormatDuration(res.Latency.P99), loadgen.FormatDuration(res.Latency.P999),
			res.OK+res.OverLimit, errorsByCode(res.Errors), count(row.trips), count(row.shed))
	}
	return b.String()
}
