// Command benchrun is the program behind `make bench`. It builds the service,
// starts redis-server (and memcached, once the service has that store) on
// free loopback ports, runs the service on each store, measures the standard
// scenarios of issue 5 with the in-process load generator of
// cmd/ratelimit-bench, and writes a markdown table and a PNG plot.
//
//	go run ./tools/benchrun [-quick] [-out docs/BENCHMARKS.md]
//
// Each figure is the median of several runs after a warm-up, next to the
// same-run ceiling of grpc-go's no-op server at the same concurrency (run in
// a child process, as the service is). Linux only: it reads /proc.
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

	"github.com/ratelimitd/ratelimit/cmd/ratelimit-bench/bench"
)

// redisRoundTrips is the service's counter of Redis round trips, read from
// GET /stats on the debug port.
const redisRoundTrips = "ratelimit.redis.round_trips"

// noopEnv, when set, makes benchrun serve the no-op RLS server on the
// address it holds instead of benchmarking: benchrun starts itself this way.
const noopEnv = "BENCHRUN_NOOP_ADDR"

func main() {
	if addr := os.Getenv(noopEnv); addr != "" {
		if err := serveNoop(addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
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

// timing is how long and how often each scenario is measured.
type timing struct {
	runs     int
	warmup   time.Duration
	duration time.Duration
}

func run(args []string, logw io.Writer) error {
	fs := flag.NewFlagSet("benchrun", flag.ContinueOnError)
	var (
		quick   = fs.Bool("quick", false, "1 short run per scenario (a smoke test for CI)")
		out     = fs.String("out", "docs/BENCHMARKS.md", "markdown `file` that receives the table between the benchrun markers")
		pngPath = fs.String("png", "", "plot `file` (default bench.png beside -out)")
		stores  = fs.String("stores", "memory,redis,memcache", "comma-separated stores to measure; empty for the no-op ceiling only")
		runs    = fs.Int("runs", 0, "runs per scenario, median reported (default 3, 1 with -quick)")
		d       = fs.Duration("d", 0, "duration of each run (default 3s, 1s with -quick)")
		warmup  = fs.Duration("warmup", 0, "warm-up before the runs of each scenario (default 2s, 500ms with -quick)")
		bin     = fs.String("bin", "", "service `binary` to measure instead of building ./cmd/ratelimit (any envoyproxy/ratelimit-compatible build)")
	)
	fs.SetOutput(logw)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("benchrun: unexpected arguments %q", fs.Args())
	}
	t := timing{runs: 3, warmup: 2 * time.Second, duration: 3 * time.Second}
	if *quick {
		t = timing{runs: 1, warmup: 500 * time.Millisecond, duration: time.Second}
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
	var storeList []string
	for s := range strings.SplitSeq(*stores, ",") {
		switch s = strings.TrimSpace(s); s {
		case "":
		case "memory", "redis", "memcache":
			storeList = append(storeList, s)
		default:
			return fmt.Errorf("benchrun: -stores: unknown store %q (want memory, redis, memcache)", s)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tmp, err := os.MkdirTemp("", "benchrun-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	r := &runner{
		timing: t,
		clkTck: clockTicks(),
		start:  time.Now(),
		log:    logw,
		steps:  len(ceilingScenarios) + len(storeList)*len(storeScenarios),
	}
	rep := &report{
		command: commandLine(args),
		date:    time.Now().UTC(),
		machine: machineInfo(),
		timing:  t,
	}
	r.logf("benchrun: %s; %d run(s) of %v after %v warm-up per scenario", rep.machine, t.runs, t.duration, t.warmup)

	// The ceiling: grpc-go's own no-op server, in a process of its own like
	// the service, so both share the two cores with the generator alike.
	noop, err := startNoopProcess(ctx)
	if err != nil {
		return err
	}
	for _, sc := range ceilingScenarios {
		row, err := r.measure(ctx, "no-op", sc, target{addr: noop.grpcAddr, proc: noop.process})
		if err != nil {
			noop.stop()
			return err
		}
		rep.rows = append(rep.rows, row)
	}
	noop.stop()

	if len(storeList) > 0 {
		if *bin == "" {
			*bin = filepath.Join(tmp, "ratelimit")
			r.logf("benchrun: go build ./cmd/ratelimit")
			if err := buildService(ctx, *bin); err != nil {
				return err
			}
		}
		for _, st := range storeList {
			rows, notes, err := r.runStore(ctx, st, *bin, filepath.Join(tmp, st))
			if err != nil {
				return err
			}
			rep.rows = append(rep.rows, rows...)
			rep.notes = append(rep.notes, notes...)
		}
	}
	rep.fillRatios()

	if err := writeMarkdown(*out, rep, *pngPath); err != nil {
		return err
	}
	if err := writePlot(*pngPath, rep); err != nil {
		return err
	}
	r.logf("benchrun: wrote %s and %s in %v", *out, *pngPath, time.Since(r.start).Round(time.Second))
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

// serveNoop serves bench's no-op server on addr until SIGTERM, or for an
// hour at most.
func serveNoop(addr string) error {
	srv, err := bench.StartNoop(addr)
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

// startNoopProcess starts this program again as a no-op server and waits
// until its port accepts connections.
func startNoopProcess(ctx context.Context) (*service, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("benchrun: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), noopEnv+"="+addr)
	p, err := startProcess("no-op server", cmd)
	if err != nil {
		return nil, err
	}
	if err := p.waitUntil(ctx, 10*time.Second, "listening", func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		p.stop()
		return nil, err
	}
	return &service{process: p, grpcAddr: addr}, nil
}

// moduleRoot returns the directory of the main module's go.mod.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("benchrun: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("benchrun: run inside the ratelimit module")
	}
	return filepath.Dir(gomod), nil
}

func buildService(ctx context.Context, bin string) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ratelimit")
	cmd.Dir = root
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
}

func (r *runner) logf(format string, args ...any) {
	el := time.Since(r.start).Round(time.Second)
	fmt.Fprintf(r.log, "[%2d/%d %5s] %s\n", r.step, r.steps, el, fmt.Sprintf(format, args...))
}

// target is what one scenario runs against.
type target struct {
	addr string
	// proc is the service process, nil for the in-process no-op server.
	proc *process
	// statsURL is the debug endpoint with plain-text counters, or "".
	statsURL string
	// rtStat is the name of the store's round-trip counter, or "".
	rtStat string
}

// run is one measured run.
type runResult struct {
	res *bench.Result
	// cpuUS, rssMiB and rt (store round trips per decision) are NaN when
	// not measured.
	cpuUS, rssMiB, rt float64
}

// row is one line of the table: the medians of a scenario's runs.
type row struct {
	store string
	sc    scenario
	runs  []runResult
	// skip, when set, says why the scenario was not measured.
	skip string

	rps, cpuUS, rssMiB, rt float64
	p50, p99               time.Duration
	// ratio is rps over the no-op ceiling's at the same c (NaN if none).
	ratio                         float64
	ok, over, unknown, errorCount uint64
	errors                        map[codes.Code]uint64
}

func (r *runner) measure(ctx context.Context, store string, sc scenario, t target) (*row, error) {
	r.step++
	label := fmt.Sprintf("%s: %s", store, sc.title)
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	client, err := bench.Dial(dialCtx, t.addr, min(4, sc.c))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("benchrun: %s: %w", label, err)
	}
	defer client.Close()
	load := bench.Load{Domain: "bench", Descriptors: sc.descriptors, Concurrency: sc.c, Timeout: 2 * time.Second}
	if r.timing.warmup > 0 {
		r.logf("%s: warm-up %v", label, r.timing.warmup)
		load.Duration = r.timing.warmup
		if _, err := client.Run(ctx, load); err != nil {
			return nil, fmt.Errorf("benchrun: %s: warm-up: %w", label, err)
		}
	}
	load.Duration = r.timing.duration
	rw := &row{store: store, sc: sc}
	for i := range r.timing.runs {
		nan := math.NaN()
		m := runResult{cpuUS: nan, rssMiB: nan, rt: nan}
		var ticks0 uint64
		var rt0 float64
		var haveTicks, haveRT bool
		if t.proc != nil {
			ticks0, err = cpuTicks(t.proc.pid())
			haveTicks = err == nil
		}
		if t.statsURL != "" && t.rtStat != "" {
			rt0, haveRT = fetchStat(t.statsURL, t.rtStat)
		}
		res, err := client.Run(ctx, load)
		if err != nil {
			return nil, fmt.Errorf("benchrun: %s: %w", label, err)
		}
		m.res = res
		if haveTicks {
			if ticks1, err := cpuTicks(t.proc.pid()); err == nil && res.Requests > 0 {
				m.cpuUS = float64(ticks1-ticks0) * 1e6 / float64(r.clkTck) / float64(res.Requests)
			}
			if rss, err := rssBytes(t.proc.pid()); err == nil {
				m.rssMiB = float64(rss) / (1 << 20)
			}
		}
		if haveRT {
			if rt1, ok := fetchStat(t.statsURL, t.rtStat); ok && res.Requests > 0 {
				m.rt = (rt1 - rt0) / float64(res.Requests)
			}
		}
		if t.proc != nil && !t.proc.running() {
			return nil, t.proc.exitError()
		}
		rw.runs = append(rw.runs, m)
		r.logf("%s: run %d/%d: %s", label, i+1, r.timing.runs, summary(m))
	}
	rw.aggregate()
	return rw, nil
}

func summary(m runResult) string {
	res := m.res
	s := fmt.Sprintf("%.0f req/s  p50 %s  p99 %s  OK %d  OVER_LIMIT %d  errors %d",
		res.RPS(), bench.FormatDuration(res.Latency.P50), bench.FormatDuration(res.Latency.P99),
		res.OK, res.OverLimit, res.ErrorCount())
	if !math.IsNaN(m.cpuUS) {
		s += fmt.Sprintf("  CPU %.1f µs/decision", m.cpuUS)
	}
	if !math.IsNaN(m.rt) {
		s += fmt.Sprintf("  %.3f round trips/decision", m.rt)
	}
	return s
}

// aggregate sets the medians of the runs and the summed outcome counts.
func (rw *row) aggregate() {
	med := func(f func(runResult) float64) float64 {
		var xs []float64
		for _, m := range rw.runs {
			if v := f(m); !math.IsNaN(v) {
				xs = append(xs, v)
			}
		}
		return median(xs)
	}
	rw.rps = med(func(m runResult) float64 { return m.res.RPS() })
	rw.p50 = time.Duration(med(func(m runResult) float64 { return float64(m.res.Latency.P50) }))
	rw.p99 = time.Duration(med(func(m runResult) float64 { return float64(m.res.Latency.P99) }))
	rw.cpuUS = med(func(m runResult) float64 { return m.cpuUS })
	rw.rssMiB = med(func(m runResult) float64 { return m.rssMiB })
	rw.rt = med(func(m runResult) float64 { return m.rt })
	rw.ratio = math.NaN()
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
		"LOG_LEVEL=warn",
		"USE_STATSD=false",
		"LOCAL_CACHE_SIZE_IN_BYTES=0",
	)
	// Later entries win in os/exec, so extra overrides the defaults above.
	return append(env, extra...)
}

// startService starts bin and waits until GET /healthcheck answers 200.
func startService(ctx context.Context, bin, name, rulesRoot string, extra ...string) (*service, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = serviceEnv(rulesRoot, ports, extra...)
	p, err := startProcess(name, cmd)
	if err != nil {
		return nil, err
	}
	health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", ports[0])
	if err := p.waitUntil(ctx, 30*time.Second, "healthy", func() error { return httpOK(health) }); err != nil {
		p.stop()
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
	proc   *process // nil for the memory store
	env    []string
	rtStat string
}

func startRedis(ctx context.Context) (*backend, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("benchrun: redis-server not found in PATH; install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)")
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[0])
	p, err := startProcess("redis-server", exec.Command(path,
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"))
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + port
	if err := p.waitUntil(ctx, 10*time.Second, "answering PING", func() error { return tcpProbe(addr, "PING\r\n", "+PONG") }); err != nil {
		p.stop()
		return nil, err
	}
	return &backend{
		proc:   p,
		env:    []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + addr},
		rtStat: redisRoundTrips,
	}, nil
}

func startMemcached(ctx context.Context, path string) (*backend, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[0])
	args := []string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "256"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root") // memcached refuses to run as root without -u
	}
	p, err := startProcess("memcached", exec.Command(path, args...))
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + port
	if err := p.waitUntil(ctx, 10*time.Second, "answering version", func() error { return tcpProbe(addr, "version\r\n", "VERSION") }); err != nil {
		p.stop()
		return nil, err
	}
	return &backend{proc: p, env: []string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + addr}}, nil
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

// runStore measures every store scenario on one store. Notes say what was
// skipped and why.
func (r *runner) runStore(ctx context.Context, store, bin, dir string) ([]*row, []string, error) {
	var notes []string
	be := &backend{env: []string{"BACKEND_TYPE=memory"}}
	switch store {
	case "redis":
		r.logf("benchrun: starting redis-server")
		var err error
		if be, err = startRedis(ctx); err != nil {
			return nil, nil, err
		}
	case "memcache":
		ok, msg, err := memcacheSupported(ctx, bin, dir)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			note := fmt.Sprintf("memcache: not measured: the service does not run BACKEND_TYPE=memcache yet (%s).", msg)
			r.logf("benchrun: %s", note)
			r.step += len(storeScenarios)
			return nil, []string{note}, nil
		}
		path, err := exec.LookPath("memcached")
		if err != nil {
			return nil, nil, errors.New("benchrun: memcached not found in PATH; install it (Debian/Ubuntu: apt-get install memcached; macOS: brew install memcached)")
		}
		r.logf("benchrun: starting memcached")
		if be, err = startMemcached(ctx, path); err != nil {
			return nil, nil, err
		}
	}
	if be.proc != nil {
		defer be.proc.stop()
	}

	skipped := map[string]string{}
	root := filepath.Join(dir, "rules")
	r.logf("benchrun: starting the service on %s", store)
	svc, err := startWithRules(ctx, bin, "ratelimit ("+store+")", root, skipped, be.env...)
	if ee := (*exitError)(nil); errors.As(err, &ee) && strings.Contains(ee.out, "BACKEND_TYPE") {
		// The service refuses the store by name: it is not in this build.
		note := fmt.Sprintf("%s: not measured: the service does not run BACKEND_TYPE=%s (%s).", store, store, lastLine(ee.out))
		r.logf("benchrun: %s", note)
		r.step += len(storeScenarios)
		return nil, []string{note}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer func() { svc.stop() }()
	for a, msg := range skipped {
		notes = append(notes, fmt.Sprintf("%s: %s not measured: the service refused its rule (%s).", store, a, msg))
	}

	var rows []*row
	for _, sc := range storeScenarios {
		if a := scenarioAlgorithm(sc); a != "" {
			if _, ok := skipped[a]; ok {
				r.step++
				rows = append(rows, &row{store: store, sc: sc, skip: "refused by the store", ratio: math.NaN()})
				continue
			}
		}
		if sc.nearCache && store == "memory" {
			r.step++
			rows = append(rows, &row{store: store, sc: sc, skip: "no near cache in front of the memory store", ratio: math.NaN()})
			continue
		}
		s := svc
		if sc.nearCache {
			// A second instance with the near cache, on the same store.
			r.logf("benchrun: starting the service on %s with a near cache", store)
			env := append(slices.Clone(be.env), "LOCAL_CACHE_SIZE_IN_BYTES="+strconv.Itoa(nearCacheBytes))
			nc, err := startWithRules(ctx, bin, "ratelimit ("+store+", near cache)", root, skipped, env...)
			if err != nil {
				return nil, nil, err
			}
			s = nc
		}
		rw, err := r.measure(ctx, store, sc, target{addr: s.grpcAddr, proc: s.process, statsURL: s.statsURL, rtStat: be.rtStat})
		if s != svc {
			s.stop()
		}
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, rw)
	}
	return rows, notes, nil
}
