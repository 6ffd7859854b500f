// Command benchrun is the program behind `make bench`. It builds the service,
// starts redis-server (single and a three-master cluster) and memcached on
// free loopback ports, runs the service on each
// store, measures the standard scenarios of issue 5 with the in-process load
// generator of tools/ratelimit-bench, measures one Redis's capacity with
// redis-benchmark, and writes a markdown table, a PNG plot and the measured
// inputs of docs/SCALING.md.
//
//	go run ./tools/benchrun [-quick] [-stores memory,redis] [-scenarios c64,hot+nc] [-out docs/BENCHMARKS.md]
//	go run ./tools/benchrun -overload [-steps 64,256,1024,4096] [-deadlines 2s,20ms] [-stores redis,memcache]
//
// With -overload it measures the overload steps of issue 25 instead (see
// overload.go) and prints their table, writing no file.
//
// Each figure is the median of several runs after a warm-up. Every run of
// the service is paired with a run of grpc-go's no-op server (in a child
// process, as the service is) under the same load just before it, and the
// fraction of that ceiling is the median of the per-run ratios, so that a
// noisy machine's drift between minutes does not enter the ratios. Linux
// only: it reads /proc.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/loadgen"
	"github.com/ratelimitd/ratelimit/src/gctune"
)

// redisRoundTrips is the service's counter of Redis round trips, read from
// GET /stats on the debug port.
const redisRoundTrips = "ratelimit.redis.round_trips"

// memcacheRoundTrips is the same for the Memcached store.
const memcacheRoundTrips = "ratelimit.memcache.round_trips"

// noopEnv, when set, makes benchrun serve the no-op RLS server on the
// address it holds instead of benchmarking: benchrun starts itself this way.
// noopTunedEnv set to "1" gives that server the service's tuning (see
// noopTuning).
const (
	noopEnv      = "BENCHRUN_NOOP_ADDR"
	noopTunedEnv = "BENCHRUN_NOOP_TUNED"
)

// noopGCHeadroom is the service's default GC_HEADROOM_BYTES, which the
// tuned no-op server's process sets as the service does (gctune).
const noopGCHeadroom = 32 << 20

// noopTuning says which no-op server a process serves: the service's tuning
// (the ceiling) or grpc-go's and Go's defaults (the second column).
type noopTuning int

const (
	untunedNoop noopTuning = iota
	tunedNoop
)

func main() {
	if serveAsChild() {
		return
	}
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// serveAsChild serves what benchrun starts itself again to serve, the
// no-op RLS server or the HTTP upstream, as its environment says, and
// reports whether it did.
func serveAsChild() bool {
	var err error
	if addr := os.Getenv(upstreamEnv); addr != "" {
		err = serveUpstream(addr)
	} else if addr := os.Getenv(noopEnv); addr != "" {
		tuning := untunedNoop
		if os.Getenv(noopTunedEnv) == "1" {
			tuning = tunedNoop
		}
		err = serveNoop(addr, tuning)
	} else {
		return false
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return true
}

// timing is how long and how often each scenario is measured.
type timing struct {
	runs     int
	warmup   time.Duration
	duration time.Duration
}

// knownStores are the values of -stores, in the order they are measured.
var knownStores = []string{"memory", "redis", "redis-cluster", "memcache"}

func run(args []string, logw io.Writer) error {
	fs := flag.NewFlagSet("benchrun", flag.ContinueOnError)
	var (
		quick     = fs.Bool("quick", false, "1 short run per scenario (a smoke test for CI)")
		out       = fs.String("out", "docs/BENCHMARKS.md", "markdown `file` that receives the table between the benchrun markers")
		pngPath   = fs.String("png", "", "plot `file` (default bench.png beside -out)")
		scaling   = fs.String("scaling", "", "markdown `file` that receives the measured inputs of the sizing between the scaling markers (default SCALING.md beside -out; \"-\" for none)")
		stores    = fs.String("stores", strings.Join(knownStores, ","), "comma-separated stores to measure")
		scenarios = fs.String("scenarios", "", "comma-separated scenario ids to measure (default all: c16,c64,c256,hot,hot+nc,chain,fixed,sliding,log,bucket)")
		rbench    = fs.Bool("redis-benchmark", true, "measure one Redis's capacity with redis-benchmark (when a Redis store is measured)")
		runs      = fs.Int("runs", 0, "runs per scenario, median reported (default 3, 1 with -quick)")
		d         = fs.Duration("d", 0, "duration of each run (default 3s, 1s with -quick)")
		warmup    = fs.Duration("warmup", 0, "warm-up before the runs of each scenario (default 2s, 500ms with -quick)")
		variants  = fs.String("variants", "", "compare service configurations instead of the standard run: `'name: ENV=value ...; name2: ...'`; writes its own section of -out (default scenarios: c64)")
		bin       = fs.String("bin", "", "service `binary` to measure instead of building ./cmd/ratelimit (any envoyproxy/ratelimit-compatible build)")
		scrapes   = fs.Bool("scrapes", false, "measure what Prometheus scrapes cost the decisions instead (10,000 rules with their series; 0, 1 and 4 scrapers); prints the table, writes no file")
		envoy     = fs.Bool("envoy", false, "measure the end-to-end cost through real Envoy instead (h2load, no filter against each store, 1 and 3 descriptors); writes its own section of -out")
		anchor    = fs.String("anchor", os.Getenv("ANCHOR_BIN"), "an envoyproxy/ratelimit `binary` (built by you from its source) to measure beside this service on Redis and Memcached, in the same rounds: the standard scenarios it can run, or through Envoy with -envoy (default $ANCHOR_BIN)")
		rate      = fs.Int("envoy-rate", 1000, "with -envoy: the fixed request rate of the latency runs")
		h2grpc    = fs.Bool("h2load", false, "measure the service side by side with h2load as the gRPC load generator instead (one key; a no-op server, each store, and the anchor with -anchor); writes its own section of -out")
		h2desc    = fs.Int("h2load-descriptors", 1, "with -h2load: the descriptors of the call (user_id=user-1 ... user-N, a counter each)")
		wb        = fs.String("write-behind", "", "with -h2load: comma-separated WRITE_BEHIND_INTERVAL `values` to measure this service with on Redis and Memcached, beside its default")
		overload  = fs.Bool("overload", false, "measure the overload steps instead (issue 25): calls in flight per -steps, each with each of -deadlines, on redis and memcache unless -stores says otherwise; prints the table, writes no file")
		steps     = fs.String("steps", "64,256,1024,4096", "with -overload: comma-separated counts of calls in flight")
		deadlines = fs.String("deadlines", "2s,20ms", "with -overload: comma-separated caller's deadlines of the calls")
	)
	fs.SetOutput(logw)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("benchrun: unexpected arguments %q", fs.Args())
	}
	t := timing{runs: 3, warmup: 2 * time.Second, duration: 3 * time.Second}
	// About a second per redis-benchmark test here (capacityTimeout bounds it).
	capacityRequests := 500000
	if *quick {
		t = timing{runs: 1, warmup: 500 * time.Millisecond, duration: time.Second}
		capacityRequests = 50000
	}
	if *runs > 0 {
		t.runs = *runs
	}
	if *d > 0 {
		t.duration = *d
	}
	if *warmup > 0 {
		t.warmup = *warmup
	}
	if *pngPath == "" {
		*pngPath = filepath.Join(filepath.Dir(*out), "bench.png")
	}
	switch *scaling {
	case "":
		*scaling = filepath.Join(filepath.Dir(*out), "SCALING.md")
	case "-":
		*scaling = ""
	}
	if *overload {
		explicit := false
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "stores" })
		if !explicit {
			*stores = "redis,memcache"
		}
	}
	var storeList []string
	for s := range strings.SplitSeq(*stores, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case slices.Contains(knownStores, s):
			storeList = append(storeList, s)
		default:
			return fmt.Errorf("benchrun: -stores: unknown store %q (want some of %s)", s, strings.Join(knownStores, ","))
		}
	}
	if len(storeList) == 0 {
		return errors.New("benchrun: -stores: no store selected (`go run ./tools/ratelimit-bench -calibrate` measures the no-op server alone)")
	}
	var vs []variant
	if *variants != "" {
		var err error
		if vs, err = parseVariants(*variants); err != nil {
			return err
		}
		if *scenarios == "" {
			*scenarios = "c64"
		}
	}
	scs, err := selectScenarios(*scenarios)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tmp, err := os.MkdirTemp("", "benchrun-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	if *scrapes {
		start := time.Now()
		logf := func(format string, args ...any) {
			fmt.Fprintf(logw, "[%5s] %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
		}
		if *bin == "" {
			*bin = filepath.Join(tmp, "ratelimit")
			if err := buildService(ctx, *bin); err != nil {
				return err
			}
		}
		return runScrapeBench(ctx, *bin, tmp, t.runs, t.duration, logf)
	}
	if *h2grpc {
		start := time.Now()
		logf := func(format string, args ...any) {
			fmt.Fprintf(logw, "[%5s] %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
		}
		if *bin == "" {
			*bin = filepath.Join(tmp, "ratelimit")
			if err := buildService(ctx, *bin); err != nil {
				return err
			}
		}
		h2stores := slices.DeleteFunc(slices.Clone(storeList), func(s string) bool { return s == "redis-cluster" })
		err := runH2grpcBench(ctx, h2grpcOptions{anchor: *anchor, bin: *bin, stores: h2stores, runs: t.runs, duration: t.duration,
			conns: 16, stream: 4, out: *out, command: commandLine(args), writeBehind: splitList(*wb), descriptors: *h2desc}, tmp, logf)
		if err == nil {
			logf("benchrun: wrote the h2load tables into %s", *out)
		}
		return err
	}
	if *envoy {
		start := time.Now()
		logf := func(format string, args ...any) {
			fmt.Fprintf(logw, "[%5s] %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, args...))
		}
		if *bin == "" {
			*bin = filepath.Join(tmp, "ratelimit")
			logf("benchrun: go build ./cmd/ratelimit")
			if err := buildService(ctx, *bin); err != nil {
				return err
			}
		}
		var envoyStores []string
		for _, st := range storeList {
			if st != "redis-cluster" {
				envoyStores = append(envoyStores, st)
			}
		}
		err := runEnvoyBench(ctx, envoyOptions{anchor: *anchor, bin: *bin, stores: envoyStores, runs: t.runs, duration: t.duration,
			conns: 16, streams: 4, rate: *rate, out: *out, command: commandLine(args)}, tmp, logf)
		if err == nil {
			logf("benchrun: wrote the Envoy tables into %s", *out)
		}
		return err
	}

	r := &runner{
		timing:    t,
		clkTck:    clockTicks(),
		start:     time.Now(),
		log:       logw,
		scenarios: scs,
		anchor:    *anchor,
	}
	for _, st := range storeList {
		r.steps += len(r.storeScenarios(st)) * max(1, len(vs)) * t.runs
	}
	rep := &report{
		command: commandLine(args),
		date:    time.Now().UTC(),
		machine: machineInfo(),
		timing:  t,
	}
	if *overload {
		return runOverloadSteps(ctx, r, overloadFlags{stores: storeList, steps: *steps, deadlines: *deadlines, bin: *bin, dir: tmp, anchor: *anchor})
	}
	r.logf("benchrun: %s; %d run(s) of %v after %v warm-up per scenario, each paired with a no-op run", rep.machine, t.runs, t.duration, t.warmup)

	// The ceiling: a no-op server with the service's gRPC and GC tuning,
	// in a process of its own like the service, so both share the two
	// cores with the generator alike; and the same with grpc-go's and Go's
	// defaults, for the second column. They stay up for the whole run and
	// are measured next to every run.
	noop, err := startNoopProcess(ctx, tunedNoop)
	if err != nil {
		return err
	}
	defer noop.stop()
	r.ceil = &target{addr: noop.grpcAddr, proc: noop.process}
	untuned, err := startNoopProcess(ctx, untunedNoop)
	if err != nil {
		return err
	}
	defer untuned.stop()
	r.untuned = &target{addr: untuned.grpcAddr, proc: untuned.process}

	if *bin == "" {
		*bin = filepath.Join(tmp, "ratelimit")
		r.logf("benchrun: go build ./cmd/ratelimit")
		if err := buildService(ctx, *bin); err != nil {
			return err
		}
	}
	if len(vs) > 0 {
		for _, st := range storeList {
			rows, err := r.runVariants(ctx, st, *bin, filepath.Join(tmp, st), vs)
			if err != nil {
				return err
			}
			rep.rows = append(rep.rows, rows...)
		}
		if err := writeVariants(*out, rep, vs); err != nil {
			return err
		}
		r.logf("benchrun: wrote the comparison into %s in %v", *out, time.Since(r.start).Round(time.Second))
		return nil
	}
	for _, st := range storeList {
		rows, notes, err := r.runStore(ctx, st, *bin, filepath.Join(tmp, st))
		if err != nil {
			return err
		}
		rep.rows = append(rep.rows, rows...)
		rep.notes = append(rep.notes, notes...)
	}
	if *rbench && (slices.Contains(storeList, "redis") || slices.Contains(storeList, "redis-cluster")) {
		if rep.capacity, err = measureCapacity(ctx, filepath.Join(tmp, "redis-benchmark"), capacityRequests, r.logf); err != nil {
			return err
		}
	}

	if err := writeMarkdown(*out, rep, *pngPath); err != nil {
		return err
	}
	if err := writePlot(*pngPath, rep); err != nil {
		return err
	}
	wrote := *out + " and " + *pngPath
	if *scaling != "" {
		if err := writeScaling(*scaling, rep); err != nil {
			return err
		}
		wrote = *out + ", " + *pngPath + " and " + *scaling
	}
	r.logf("benchrun: wrote %s in %v", wrote, time.Since(r.start).Round(time.Second))
	return nil
}

// commandLine returns how benchrun was invoked, arguments quoted where needed.
func commandLine(args []string) string {
	s := "go run ./tools/benchrun"
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'`$") {
			a = strconv.Quote(a)
		}
		s += " " + a
	}
	return s
}

// serveNoop serves bench's no-op server with tuning on addr until SIGTERM,
// or for an hour at most.
func serveNoop(addr string, tuning noopTuning) error {
	var t loadgen.Tuning
	if tuning == tunedNoop {
		t = loadgen.ServiceTuning
		defer gctune.Start(noopGCHeadroom)()
	}
	srv, err := loadgen.StartNoopTuned(addr, t)
	if err != nil {
		return err
	}
	defer srv.Stop()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
	case <-time.After(time.Hour):
	}
	return nil
}

// startNoopProcess starts this program again as a no-op server with tuning
// and waits until its port accepts connections.
func startNoopProcess(ctx context.Context, tuning noopTuning) (*service, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("benchrun: %w", err)
	}
	name := "no-op server (untuned)"
	if tuning == tunedNoop {
		name = "no-op server (tuned)"
	}
	addr := func(ports []int) string { return fmt.Sprintf("127.0.0.1:%d", ports[0]) }
	p, ports, err := startOnFreePorts(ctx, 1, 10*time.Second, "listening", func(ports []int) (*process, error) {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), noopEnv+"="+addr(ports))
		if tuning == tunedNoop {
			cmd.Env = append(cmd.Env, noopTunedEnv+"=1")
		}
		return startProcess(name, cmd)
	}, func(ports []int) func() error { return func() error { return dial(addr(ports)) } })
	if err != nil {
		return nil, err
	}
	return &service{process: p, grpcAddr: addr(ports)}, nil
}

// dial reports whether addr accepts a TCP connection.
func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// buildService builds the service by its import path, which resolves from
// any module of the workspace (go.work), or from the tools module alone
// through its replace directive.
func buildService(ctx context.Context, bin string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ratelimitd/ratelimit/cmd/ratelimit")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("benchrun: go build ./cmd/ratelimit: %w\n%s", err, out)
	}
	return nil
}

// machineInfo describes the CPU count and model, and the Go toolchain.
func machineInfo() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d × %s, %s %s/%s", runtime.NumCPU(), model, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// runner measures scenarios and prints progress.
type runner struct {
	timing timing
	clkTck int
	start  time.Time
	log    io.Writer
	step   int
	steps  int
	// scenarios are the selected scenarios (-scenarios).
	scenarios []scenario
	// ceil is the no-op server with the service's tuning paired with every
	// run; nil measures the service alone. untuned, when not nil, is the
	// no-op server with grpc-go's defaults, measured just before ceil.
	ceil, untuned *target
	// anchor, when set, is an envoyproxy/ratelimit binary measured beside
	// the service on Redis and Memcached, in the same rounds.
	anchor string
}

func (r *runner) logf(format string, args ...any) {
	el := time.Since(r.start).Round(time.Second)
	fmt.Fprintf(r.log, "[%2d/%d %5s] %s\n", r.step, r.steps, el, fmt.Sprintf(format, args...))
}

// storeScenarios returns the selected scenarios that run on store.
func (r *runner) storeScenarios(store string) []scenario {
	if store != "redis-cluster" {
		return r.scenarios
	}
	var out []scenario
	for _, sc := range r.scenarios {
		if slices.Contains(clusterScenarios, sc.id) {
			out = append(out, sc)
		}
	}
	return out
}

// target is what one scenario runs against.
type target struct {
	addr string
	// proc is the server's process.
	proc *process
	// statsURL is the debug endpoint with plain-text counters, or "".
	statsURL string
	// rtStat is the name of the store's round-trip counter, or "".
	rtStat string
	// redis are the Redis servers behind the service, if any; their CPU
	// and commands are read around each run.
	redis []*harness.RedisServer
	// storeProc is the store's process whose CPU is read around each run
	// (memcached), or nil.
	storeProc *process
}

// runResult is one measured run.
type runResult struct {
	res *loadgen.Result
	// cpuUS, rssMiB, rt (store round trips per decision), redisCPUUS and
	// redisCmds (Redis CPU and commands per decision, all servers) are NaN
	// when not measured.
	cpuUS, rssMiB, rt, redisCPUUS, redisCmds float64
	// genCPUUS is the load generator's CPU per decision (this process's,
	// which runs nothing else meanwhile); storeCPUUS the store process's
	// (target.storeProc). NaN when not measured.
	genCPUUS, storeCPUUS float64
}

func nan() float64 { return math.NaN() }

// row is one line of the table: the medians of a scenario's runs.
type row struct {
	store string
	sc    scenario
	runs  []runResult
	// ceil are the paired no-op runs: ceil[i] ran just before runs[i],
	// under the same load. Empty when the row was measured alone.
	// untuned[i], when measured, ran just before ceil[i].
	ceil, untuned []runResult
	// skip, when set, says why the scenario was not measured.
	skip string
	// variant names the service configuration under -variants.
	variant string

	rps, cpuUS, rssMiB, rt, redisCPUUS, redisCmds float64
	p50, p99                                      time.Duration
	// ceilRPS, ceilCPUUS and ceilP99 are the medians of the paired no-op
	// runs (NaN or 0 without them).
	ceilRPS, ceilCPUUS float64
	ceilP99            time.Duration
	// ratio is the median over runs of rps_i / ceiling rps_i; p99Ratio the
	// median of p99_i / ceiling p99_i (NaN without pairing).
	ratio, p99Ratio float64
	// cpuRatio is the median of the per-run ratios of CPU per decision
	// to the paired no-op run's (NaN without pairing).
	cpuRatio float64
	// untunedRPS is the median of the untuned no-op runs, untunedRatio the
	// median of rps_i / untuned rps_i (NaN without them).
	untunedRPS, untunedRatio      float64
	ok, over, unknown, errorCount uint64
	errors                        map[codes.Code]uint64
}

// noopWarmup bounds the no-op server's warm-up per scenario: the process
// is already warm from earlier scenarios; only the new connections are not.
const noopWarmup = 500 * time.Millisecond

func (r *runner) measure(ctx context.Context, store string, sc scenario, t target) (*row, error) {
	r.step++
	label := fmt.Sprintf("%s: %s", store, sc.title)
	client, err := dialTarget(ctx, t.addr, sc.c)
	if err != nil {
		return nil, fmt.Errorf("benchrun: %s: %w", label, err)
	}
	defer client.Close()
	var ceilClient *loadgen.Client
	if r.ceil != nil {
		if ceilClient, err = dialTarget(ctx, r.ceil.addr, sc.c); err != nil {
			return nil, fmt.Errorf("benchrun: %s: no-op server: %w", label, err)
		}
		defer ceilClient.Close()
	}
	var untunedClient *loadgen.Client
	if r.untuned != nil {
		if untunedClient, err = dialTarget(ctx, r.untuned.addr, sc.c); err != nil {
			return nil, fmt.Errorf("benchrun: %s: untuned no-op server: %w", label, err)
		}
		defer untunedClient.Close()
	}
	load := loadgen.Load{Domain: "bench", Descriptors: sc.descriptors, Concurrency: sc.c, Timeout: 2 * time.Second}
	if r.timing.warmup > 0 {
		r.logf("%s: warm-up %v", label, r.timing.warmup)
		load.Duration = r.timing.warmup
		if _, err := client.Run(ctx, load); err != nil {
			return nil, fmt.Errorf("benchrun: %s: warm-up: %w", label, err)
		}
		if ceilClient != nil {
			load.Duration = min(r.timing.warmup, noopWarmup)
			if _, err := ceilClient.Run(ctx, load); err != nil {
				return nil, fmt.Errorf("benchrun: %s: no-op warm-up: %w", label, err)
			}
		}
		if untunedClient != nil {
			if _, err := untunedClient.Run(ctx, load); err != nil {
				return nil, fmt.Errorf("benchrun: %s: untuned no-op warm-up: %w", label, err)
			}
		}
	}
	load.Duration = r.timing.duration
	rw := &row{store: store, sc: sc}
	for i := range r.timing.runs {
		if untunedClient != nil {
			u, err := r.runOnce(ctx, untunedClient, load, *r.untuned)
			if err != nil {
				return nil, fmt.Errorf("benchrun: %s: untuned no-op server: %w", label, err)
			}
			rw.untuned = append(rw.untuned, u)
		}
		if ceilClient != nil {
			c, err := r.runOnce(ctx, ceilClient, load, *r.ceil)
			if err != nil {
				return nil, fmt.Errorf("benchrun: %s: no-op server: %w", label, err)
			}
			rw.ceil = append(rw.ceil, c)
		}
		m, err := r.runOnce(ctx, client, load, t)
		if err != nil {
			return nil, fmt.Errorf("benchrun: %s: %w", label, err)
		}
		rw.runs = append(rw.runs, m)
		line := summary(m)
		if ceilClient != nil {
			c := rw.ceil[i]
			line += fmt.Sprintf("  | no-op just before: %.0f req/s  p99 %s  (%.0f%%)",
				c.res.RPS(), loadgen.FormatDuration(c.res.Latency.P99), 100*m.res.RPS()/c.res.RPS())
		}
		r.logf("%s: run %d/%d: %s", label, i+1, r.timing.runs, line)
	}
	rw.aggregate()
	return rw, nil
}

func dialTarget(ctx context.Context, addr string, c int) (*loadgen.Client, error) {
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return loadgen.Dial(dialCtx, addr, min(4, c))
}

// runOnce measures one run of load on client, which is connected to t, with
// t's CPU, RSS, round trips and Redis usage around it.
func (r *runner) runOnce(ctx context.Context, client *loadgen.Client, load loadgen.Load, t target) (runResult, error) {
	m := runResult{cpuUS: nan(), rssMiB: nan(), rt: nan(), redisCPUUS: nan(), redisCmds: nan(), genCPUUS: nan(), storeCPUUS: nan()}
	gen0, genErr := cpuTicks(os.Getpid())
	var store0 uint64
	storeErr := errors.New("no store process")
	if t.storeProc != nil {
		store0, storeErr = cpuTicks(t.storeProc.pid())
	}
	var ticks0 uint64
	var rt0 float64
	var u0 redisUsage
	var haveTicks, haveRT, haveRedis bool
	var err error
	if t.proc != nil {
		ticks0, err = cpuTicks(t.proc.pid())
		haveTicks = err == nil
	}
	if t.statsURL != "" && t.rtStat != "" {
		rt0, haveRT = fetchStat(t.statsURL, t.rtStat)
	}
	if len(t.redis) > 0 {
		u0, err = readRedisUsage(ctx, t.redis)
		haveRedis = err == nil
	}
	res, err := client.Run(ctx, load)
	if err != nil {
		return m, err
	}
	m.res = res
	n := float64(res.Requests)
	perDecision := func(ticks0 uint64, pid int) float64 {
		ticks1, err := cpuTicks(pid)
		if err != nil || n == 0 {
			return nan()
		}
		return float64(ticks1-ticks0) * 1e6 / float64(r.clkTck) / n
	}
	if genErr == nil {
		m.genCPUUS = perDecision(gen0, os.Getpid())
	}
	if storeErr == nil {
		m.storeCPUUS = perDecision(store0, t.storeProc.pid())
	}
	if haveTicks && n > 0 {
		if ticks1, err := cpuTicks(t.proc.pid()); err == nil {
			m.cpuUS = float64(ticks1-ticks0) * 1e6 / float64(r.clkTck) / n
		}
	}
	if t.proc != nil {
		if rss, err := rssBytes(t.proc.pid()); err == nil {
			m.rssMiB = float64(rss) / (1 << 20)
		}
	}
	if haveRT && n > 0 {
		if rt1, ok := fetchStat(t.statsURL, t.rtStat); ok {
			m.rt = (rt1 - rt0) / n
		}
	}
	if haveRedis && n > 0 {
		if u1, err := readRedisUsage(ctx, t.redis); err == nil {
			m.redisCPUUS = (u1.cpu - u0.cpu) * 1e6 / n
			m.redisCmds = (u1.commands - u0.commands) / n
		}
	}
	if t.proc != nil && !t.proc.running() {
		return m, t.proc.exitError()
	}
	return m, nil
}

func summary(m runResult) string {
	res := m.res
	s := fmt.Sprintf("%.0f req/s  p50 %s  p99 %s  OK %d  OVER_LIMIT %d  errors %d",
		res.RPS(), loadgen.FormatDuration(res.Latency.P50), loadgen.FormatDuration(res.Latency.P99),
		res.OK, res.OverLimit, res.ErrorCount())
	if !math.IsNaN(m.cpuUS) {
		s += fmt.Sprintf("  CPU %.1f µs/decision", m.cpuUS)
	}
	if !math.IsNaN(m.rt) {
		s += fmt.Sprintf("  %.3f round trips/decision", m.rt)
	}
	if !math.IsNaN(m.redisCPUUS) {
		s += fmt.Sprintf("  Redis %.1f µs, %.2f commands/decision", m.redisCPUUS, m.redisCmds)
	}
	return s
}

// aggregate sets the medians of the runs, of the paired no-op runs and of
// the per-run ratios, and the summed outcome counts.
func (rw *row) aggregate() {
	med := func(runs []runResult, f func(runResult) float64) float64 {
		var xs []float64
		for _, m := range runs {
			if v := f(m); !math.IsNaN(v) {
				xs = append(xs, v)
			}
		}
		return median(xs)
	}
	rps := func(m runResult) float64 { return m.res.RPS() }
	p50 := func(m runResult) float64 { return float64(m.res.Latency.P50) }
	p99 := func(m runResult) float64 { return float64(m.res.Latency.P99) }
	cpu := func(m runResult) float64 { return m.cpuUS }
	rw.rps = med(rw.runs, rps)
	rw.p50 = time.Duration(med(rw.runs, p50))
	rw.p99 = time.Duration(med(rw.runs, p99))
	rw.cpuUS = med(rw.runs, cpu)
	rw.rssMiB = med(rw.runs, func(m runResult) float64 { return m.rssMiB })
	rw.rt = med(rw.runs, func(m runResult) float64 { return m.rt })
	rw.redisCPUUS = med(rw.runs, func(m runResult) float64 { return m.redisCPUUS })
	rw.redisCmds = med(rw.runs, func(m runResult) float64 { return m.redisCmds })

	rw.ceilRPS, rw.ceilCPUUS, rw.ceilP99 = nan(), nan(), 0
	rw.ratio, rw.p99Ratio, rw.cpuRatio = nan(), nan(), nan()
	if len(rw.ceil) == len(rw.runs) && len(rw.ceil) > 0 {
		rw.ceilRPS = med(rw.ceil, rps)
		rw.ceilCPUUS = med(rw.ceil, cpu)
		rw.ceilP99 = time.Duration(med(rw.ceil, p99))
		var ratios, p99s []float64
		for i, m := range rw.runs {
			c := rw.ceil[i]
			if c.res.RPS() > 0 {
				ratios = append(ratios, m.res.RPS()/c.res.RPS())
			}
			if c.res.Latency.P99 > 0 {
				p99s = append(p99s, float64(m.res.Latency.P99)/float64(c.res.Latency.P99))
			}
		}
		rw.ratio, rw.p99Ratio = median(ratios), median(p99s)
		rw.cpuRatio = medianCPURatio(rw)
	}
	rw.untunedRPS, rw.untunedRatio = nan(), nan()
	if len(rw.untuned) == len(rw.runs) && len(rw.untuned) > 0 {
		rw.untunedRPS = med(rw.untuned, rps)
		var ratios []float64
		for i, m := range rw.runs {
			if u := rw.untuned[i].res.RPS(); u > 0 {
				ratios = append(ratios, m.res.RPS()/u)
			}
		}
		rw.untunedRatio = median(ratios)
	}

	rw.errors = map[codes.Code]uint64{}
	for _, m := range rw.runs {
		rw.ok += m.res.OK
		rw.over += m.res.OverLimit
		rw.unknown += m.res.Unknown
		for c, n := range m.res.Errors {
			rw.errors[c] += n
			rw.errorCount += n
		}
	}
}

// median returns the median of xs, NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// service is a running cmd/ratelimit.
type service struct {
	*process
	grpcAddr string
	statsURL string
}

// serviceEnv is the environment of a service on store st: loopback-only
// listeners, the given rules root, quiet logs.
func serviceEnv(rulesRoot string, ports []int, extra ...string) []string {
	env := append(os.Environ(),
		"HOST=127.0.0.1",
		"PORT="+strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1",
		"GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1",
		"DEBUG_PORT="+strconv.Itoa(ports[2]),
		"RUNTIME_ROOT="+rulesRoot,
		"RUNTIME_SUBDIRECTORY=",
		"RUNTIME_APPDIRECTORY=config",
		// envoyproxy/ratelimit loads no rules at all from a plain
		// directory with its default RUNTIME_WATCH_ROOT=true and an empty
		// RUNTIME_SUBDIRECTORY (it then answers OK to every call, without
		// a store operation); this service loads them either way.
		"RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=warn",
		"USE_STATSD=false",
		"LOCAL_CACHE_SIZE_IN_BYTES=0",
	)
	// Later entries win in os/exec, so extra overrides the defaults above.
	return append(env, extra...)
}

// startService starts bin and waits until GET /healthcheck answers 200.
func startService(ctx context.Context, bin, name, rulesRoot string, extra ...string) (*service, error) {
	return startServiceUntil(ctx, bin, name, rulesRoot, true, extra...)
}

// startServiceUntil is startService; with healthy false it waits only for
// the gRPC port to accept connections, for a service whose /healthcheck
// never says 200 on a store (envoyproxy/ratelimit on Memcached).
func startServiceUntil(ctx context.Context, bin, name, rulesRoot string, healthy bool, extra ...string) (*service, error) {
	p, ports, err := startOnFreePorts(ctx, 3, 30*time.Second, "ready", func(ports []int) (*process, error) {
		cmd := exec.Command(bin)
		cmd.Env = serviceEnv(rulesRoot, ports, extra...)
		return startProcess(name, cmd)
	}, func(ports []int) func() error {
		if !healthy {
			return func() error { return dial(fmt.Sprintf("127.0.0.1:%d", ports[1])) }
		}
		return func() error { return httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthcheck", ports[0])) }
	})
	if err != nil {
		return nil, err
	}
	return &service{
		process:  p,
		grpcAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		statsURL: fmt.Sprintf("http://127.0.0.1:%d/stats", ports[2]),
	}, nil
}

// backend is a store server started for the benchmark and the service
// settings that point at it.
type backend struct {
	// stop ends the servers; nil for the memory store.
	stop func()
	// redis are the Redis servers, whose usage is read around each run.
	redis []*harness.RedisServer
	// proc is the store's process when its CPU is read from /proc
	// (memcached); nil for Redis (INFO) and the memory store.
	proc   *process
	env    []string
	rtStat string
}

// target returns what a scenario runs against: s, on this store.
func (be *backend) target(s *service) target {
	return target{addr: s.grpcAddr, proc: s.process, statsURL: s.statsURL, rtStat: be.rtStat, redis: be.redis, storeProc: be.proc}
}

func startMemcached(ctx context.Context, path string) (*backend, error) {
	addr := func(ports []int) string { return "127.0.0.1:" + strconv.Itoa(ports[0]) }
	p, ports, err := startOnFreePorts(ctx, 1, 10*time.Second, "answering version", func(ports []int) (*process, error) {
		args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(ports[0]), "-U", "0", "-m", "256"}
		if os.Geteuid() == 0 {
			args = append(args, "-u", "root") // memcached refuses to run as root without -u
		}
		return startProcess("memcached", exec.Command(path, args...))
	}, func(ports []int) func() error {
		return func() error { return tcpProbe(addr(ports), "version\r\n", "VERSION") }
	})
	if err != nil {
		return nil, err
	}
	return &backend{stop: p.stop, proc: p, env: []string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + addr(ports)}, rtStat: memcacheRoundTrips}, nil
}

// memcacheSupported starts the service with BACKEND_TYPE=memcache against a
// port where nothing listens and a minimal rule. A service with the store
// keeps running (unhealthy until Memcached answers); one without it exits,
// and its last words say why.
func memcacheSupported(ctx context.Context, bin, dir string) (bool, string, error) {
	root := filepath.Join(dir, "probe")
	if err := writeRules(root, "domain: bench\ndescriptors:\n  - key: user_id\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n"); err != nil {
		return false, "", err
	}
	ports, err := freePorts(4)
	if err != nil {
		return false, "", err
	}
	cmd := exec.Command(bin)
	cmd.Env = serviceEnv(root, ports[:3], "BACKEND_TYPE=memcache", fmt.Sprintf("MEMCACHE_HOST_PORT=127.0.0.1:%d", ports[3]))
	p, err := startProcess("ratelimit (memcache probe)", cmd)
	if err != nil {
		return false, "", err
	}
	defer p.stop()
	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", ports[0])
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !p.running() {
			return false, lastLine(p.out.tail(2000)), nil
		}
		// Any HTTP answer, healthy or not, means the service is up.
		if resp, err := httpClient.Get(health); err == nil {
			resp.Body.Close()
			return true, "", nil
		}
		select {
		case <-ctx.Done():
			return false, "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return p.running(), lastLine(p.out.tail(2000)), nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "no output"
	}
	return s
}

func writeRules(root, yaml string) error {
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(yaml), 0o644)
}

// startWithRules starts the service with the scenario rules. When the
// service refuses to start and names an algorithm, that algorithm's rule is
// dropped (the store cannot run it atomically) and the start is retried;
// skipped maps each dropped algorithm to the service's message.
func startWithRules(ctx context.Context, bin, name, root string, skipped map[string]string, extra ...string) (*service, error) {
	for {
		if err := writeRules(root, rulesYAML(skipped)); err != nil {
			return nil, err
		}
		svc, err := startService(ctx, bin, name, root, extra...)
		if err == nil {
			return svc, nil
		}
		dropped := false
		for _, a := range algorithms {
			if _, ok := skipped[a]; !ok && strings.Contains(err.Error(), a) {
				skipped[a] = lastLine(err.Error())
				dropped = true
			}
		}
		if !dropped {
			return nil, err
		}
	}
}

// startBackend starts the servers of store (none for memory) under dir.
func startBackend(ctx context.Context, store, dir string, logf func(string, ...any)) (*backend, error) {
	switch store {
	case "memory":
		return &backend{env: []string{"BACKEND_TYPE=memory"}}, nil
	case "redis":
		logf("benchrun: starting redis-server")
		return startRedis(filepath.Join(dir, "redis"))
	case "redis-cluster":
		logf("benchrun: starting a Redis Cluster of 3 masters")
		return startRedisCluster(filepath.Join(dir, "cluster"))
	case "memcache":
		path, err := exec.LookPath("memcached")
		if err != nil {
			return nil, errors.New("benchrun: memcached not found in PATH; install it (Debian/Ubuntu: apt-get install memcached; macOS: brew install memcached)")
		}
		logf("benchrun: starting memcached")
		return startMemcached(ctx, path)
	}
	return nil, fmt.Errorf("benchrun: unknown store %q", store)
}

// runStore measures the selected scenarios on one store. Notes say what was
// skipped and why.
func (r *runner) runStore(ctx context.Context, store, bin, dir string) ([]*row, []string, error) {
	scs := r.storeScenarios(store)
	if len(scs) == 0 {
		note := fmt.Sprintf("%s: not measured: -scenarios selects none of its scenarios (%s).", store, strings.Join(clusterScenarios, ","))
		r.logf("benchrun: %s", note)
		return nil, []string{note}, nil
	}
	var notes []string
	if store == "memcache" {
		ok, msg, err := memcacheSupported(ctx, bin, dir)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			note := fmt.Sprintf("memcache: not measured: the service does not run BACKEND_TYPE=memcache yet (%s).", msg)
			r.logf("benchrun: %s", note)
			r.step += len(scs) * r.timing.runs
			return nil, []string{note}, nil
		}
	}
	be, err := startBackend(ctx, store, dir, r.logf)
	if err != nil {
		return nil, nil, err
	}
	if be.stop != nil {
		defer be.stop()
	}

	skipped := map[string]string{}
	root := filepath.Join(dir, "rules")
	r.logf("benchrun: starting the service on %s", store)
	svc, err := startWithRules(ctx, bin, "ratelimit ("+store+")", root, skipped, be.env...)
	if ee := (*exitError)(nil); errors.As(err, &ee) && strings.Contains(ee.out, "BACKEND_TYPE") {
		// The service refuses the store by name: it is not in this build.
		backendType, _ := strings.CutPrefix(be.env[0], "BACKEND_TYPE=")
		note := fmt.Sprintf("%s: not measured: the service does not run BACKEND_TYPE=%s (%s).", store, backendType, lastLine(ee.out))
		r.logf("benchrun: %s", note)
		r.step += len(scs) * r.timing.runs
		return nil, []string{note}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer func() { svc.stop() }()
	for a, msg := range skipped {
		notes = append(notes, fmt.Sprintf("%s: %s not measured: the service refused its rule (%s).", store, a, msg))
	}

	// The scenarios take turns: every round measures each scenario once,
	// so that ratios between scenarios (an algorithm's cost against the
	// fixed window's) compare runs minutes, not a quarter of an hour,
	// apart. A second instance with the near cache serves the near-cache
	// scenarios, on the same store, for the whole run.
	var nc *service
	defer func() {
		if nc != nil {
			nc.stop()
		}
	}()
	type job struct {
		sc  scenario
		svc *service
		rw  *row
	}
	var rows []*row
	var jobs []job
	for _, sc := range scs {
		if a := scenarioAlgorithm(sc); a != "" {
			if _, ok := skipped[a]; ok {
				r.step += r.timing.runs
				rows = append(rows, skippedRow(store, sc, "refused by the store"))
				continue
			}
		}
		if sc.nearCache && store == "memory" {
			r.step += r.timing.runs
			rows = append(rows, skippedRow(store, sc, "no near cache in front of the memory store"))
			continue
		}
		s := svc
		if sc.nearCache {
			if nc == nil {
				r.logf("benchrun: starting the service on %s with a near cache", store)
				env := append(slices.Clone(be.env), "LOCAL_CACHE_SIZE_IN_BYTES="+strconv.Itoa(nearCacheBytes))
				if nc, err = startWithRules(ctx, bin, "ratelimit ("+store+", near cache)", root, skipped, env...); err != nil {
					return nil, nil, err
				}
			}
			s = nc
		}
		rw := &row{store: store, sc: sc}
		rows = append(rows, rw)
		jobs = append(jobs, job{sc: sc, svc: s, rw: rw})
	}
	if r.anchor != "" && (store == "redis" || store == "memcache") {
		// The anchor on the same store, its rules those of the scenarios
		// it can run (fixed windows; it knows no other algorithm), and the
		// same scenarios but the algorithms' and the near cache's, in the
		// same rounds as the service's.
		r.logf("benchrun: starting envoyproxy/ratelimit (%s) on %s", r.anchor, store)
		asvc, err := startAnchor(ctx, r.anchor, store, dir, be)
		if err != nil {
			return nil, nil, err
		}
		defer asvc.stop()
		for _, j := range slices.Clone(jobs) {
			if scenarioAlgorithm(j.sc) != "" || j.sc.nearCache {
				continue
			}
			rw := &row{store: store, sc: j.sc, variant: anchorVariant}
			rows = append(rows, rw)
			jobs = append(jobs, job{sc: j.sc, svc: asvc, rw: rw})
			r.steps += r.timing.runs
		}
	}
	saved := r.timing
	defer func() { r.timing = saved }()
	for round := range saved.runs {
		for _, j := range jobs {
			// The first round warms every scenario up; later ones only
			// their new connections.
			r.timing = timing{runs: 1, duration: saved.duration, warmup: saved.warmup}
			if round > 0 {
				r.timing.warmup = min(saved.warmup, noopWarmup)
			}
			rw, err := r.measure(ctx, store, j.sc, be.target(j.svc))
			if err != nil {
				return nil, nil, err
			}
			j.rw.runs = append(j.rw.runs, rw.runs...)
			j.rw.ceil = append(j.rw.ceil, rw.ceil...)
			j.rw.untuned = append(j.rw.untuned, rw.untuned...)
		}
	}
	for _, j := range jobs {
		j.rw.aggregate()
	}
	return rows, notes, nil
}

// skippedRow is the row of a scenario not measured, with the reason.
func skippedRow(store string, sc scenario, why string) *row {
	return &row{store: store, sc: sc, skip: why, ratio: nan(), p99Ratio: nan(), ceilRPS: nan(), ceilCPUUS: nan()}
}
