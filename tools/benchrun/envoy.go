package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// The end-to-end cost through real Envoy (-envoy): HTTP load from h2load
// through one Envoy to a trivial upstream, with no rate-limit filter, with
// the filter calling this service on each store, and calling
// envoyproxy/ratelimit (the anchor) when a binary of it is given; one
// descriptor and three per request. Each round measures every target once,
// so ratios are taken within a round.

// upstreamEnv, when set, makes benchrun serve the trivial HTTP upstream on
// the address it holds: benchrun starts itself this way, so the upstream's
// CPU is a process of its own.
const upstreamEnv = "BENCHRUN_UPSTREAM_ADDR"

// envoyRules are the rules of every target: limits no load reaches, so
// every request is decided (and counted) and none refused.
const envoyRules = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: generic_key
    value: bench
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: header_match
    value: get
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// envoyTarget is one listener of the benchmark's Envoy.
type envoyTarget struct {
	// name is the listener's name and the row's label.
	name string
	// impl is "" (no filter), "ratelimit" or "anchor".
	impl  string
	store string
	descs int
	svc   *service
	be    *backend
}

// envoyOptions are the -envoy mode's settings.
type envoyOptions struct {
	anchor   string // envoyproxy/ratelimit binary, or ""
	bin      string // this service's binary
	stores   []string
	runs     int
	duration time.Duration
	// conns × streams is the closed-loop concurrency of the throughput
	// runs; rate is the fixed request rate of the latency runs.
	conns, streams int
	rate           int
	out            string
	command        string
}

// envoyRun is one measurement of one target.
type envoyRun struct {
	reqPerSec float64
	// latency percentiles at the fixed rate, in microseconds.
	p50, p99, p999 float64
	// cpu per request, in microseconds, by process.
	cpu map[string]float64
	// errors are requests not answered 200 (both runs).
	errors int
}

// runEnvoyBench is the -envoy mode.
func runEnvoyBench(ctx context.Context, o envoyOptions, tmp string, logf func(string, ...any)) error {
	envoyBin, err := harness.FindEnvoy()
	if err != nil {
		return fmt.Errorf("benchrun: -envoy needs Envoy: %v; %s", err, harness.EnvoyInstall)
	}
	h2load, err := exec.LookPath("h2load")
	if err != nil {
		return errors.New("benchrun: -envoy needs h2load: apt-get install nghttp2-client (Debian/Ubuntu), brew install nghttp2 (macOS)")
	}
	rulesRoot := filepath.Join(tmp, "envoy-rules")
	if err := writeRules(rulesRoot, envoyRules); err != nil {
		return err
	}
	up, upAddr, err := startUpstreamProcess(ctx)
	if err != nil {
		return err
	}
	defer up.stop()

	targets := []*envoyTarget{{name: "no_filter"}}
	for _, st := range o.stores {
		be, err := startBackend(ctx, st, filepath.Join(tmp, "envoy-"+st), logf)
		if err != nil {
			return err
		}
		if be.stop != nil {
			defer be.stop()
		}
		impls := []string{"ratelimit"}
		if o.anchor != "" && st != "memory" {
			impls = append(impls, "anchor")
		}
		for _, impl := range impls {
			bin := o.bin
			if impl == "anchor" {
				bin = o.anchor
			}
			// The anchor's /healthcheck stays 500 on Memcached: wait for
			// its port there.
			healthy := impl != "anchor" || st != "memcache"
			svc, err := startServiceUntil(ctx, bin, impl+" ("+st+")", rulesRoot, healthy, be.env...)
			if err != nil {
				return err
			}
			defer svc.stop()
			for _, n := range []int{1, 3} {
				targets = append(targets, &envoyTarget{name: fmt.Sprintf("%s_%s_%d", impl, st, n), impl: impl, store: st, descs: n, svc: svc, be: be})
			}
		}
	}

	e, err := startBenchEnvoy(ctx, envoyBin, filepath.Join(tmp, "envoy"), envoyBootstrap(targets, upAddr))
	if err != nil {
		return err
	}
	defer e.Stop()
	addrs := map[string]string{}
	for _, tg := range targets {
		if addrs[tg.name], err = e.Listener(tg.name); err != nil {
			return err
		}
	}

	results := map[string][]envoyRun{}
	for round := range o.runs {
		for _, tg := range targets {
			logf("benchrun: envoy round %d/%d: %s", round+1, o.runs, tg.name)
			run, err := measureEnvoyTarget(ctx, o, h2load, filepath.Join(tmp, "h2load.log"), addrs[tg.name], tg, e, up)
			if err != nil {
				return err
			}
			results[tg.name] = append(results[tg.name], run)
		}
	}
	return writeEnvoyReport(o, targets, results)
}

// serveUpstream answers every request 200 "ok" on addr until SIGTERM, or
// for an hour at most.
func serveUpstream(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	select {
	case <-signalled():
	case <-time.After(time.Hour):
	}
	return nil
}

// startUpstreamProcess starts benchrun again as the trivial upstream.
func startUpstreamProcess(ctx context.Context) (*process, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("benchrun: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), upstreamEnv+"="+addr)
	p, err := startProcess("upstream", cmd)
	if err != nil {
		return nil, "", err
	}
	if err := p.waitUntil(ctx, 10*time.Second, "answering", func() error { return httpOK("http://" + addr + "/") }); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

// envoyBootstrap has one listener per target, on 127.0.0.1 port 0: HTTP
// (h2c or HTTP/1.1) to the upstream, with the rate-limit filter calling the
// target's service when it has one. Its route makes 1 descriptor
// (remote_address) or 3 (and generic_key, header_value_match); the
// filter's timeout is long (1 s) and it fails closed, so that a slow
// answer shows as time and an error as a 5xx, never as a silent pass.
func envoyBootstrap(targets []*envoyTarget, upstream string) string {
	var b strings.Builder
	b.WriteString("admin:\n  address: {socket_address: {address: 127.0.0.1, port_value: 0}}\nstatic_resources:\n  listeners:\n")
	for _, tg := range targets {
		limits := ""
		filter := ""
		if tg.svc != nil {
			limits = `
                  rate_limits:
                  - actions: [{remote_address: {}}]`
			if tg.descs == 3 {
				limits += `
                  - actions: [{generic_key: {descriptor_value: bench}}]
                  - actions: [{header_value_match: {descriptor_value: get, headers: [{name: ":method", string_match: {exact: GET}}]}}]`
			}
			filter = fmt.Sprintf(`
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: rls_%s}}`, tg.name)
		}
		fmt.Fprintf(&b, `  - name: %s
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: %s
          codec_type: AUTO
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route:
                  cluster: upstream%s
          http_filters:%s
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, tg.name, tg.name, limits, filter)
	}
	b.WriteString("  clusters:")
	b.WriteString(harness.EnvoyCluster("upstream", upstream, false, ""))
	for _, tg := range targets {
		if tg.svc != nil {
			b.WriteString(harness.EnvoyCluster("rls_"+tg.name, tg.svc.grpcAddr, true, ""))
		}
	}
	return b.String() + "\n"
}

// benchEnvoy is the running Envoy.
type benchEnvoy struct {
	*harness.Envoy
}

// startBenchEnvoy runs Envoy with config and waits for its admin's /ready.
func startBenchEnvoy(ctx context.Context, bin, dir, config string) (*benchEnvoy, error) {
	p, err := harness.LaunchEnvoy(ctx, bin, dir, config, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("benchrun: %w", err)
	}
	return &benchEnvoy{p}, nil
}

// requests is the number of requests Envoy's listener name has taken.
func (e *benchEnvoy) requests(name string) (float64, error) {
	n, err := e.Counter("http." + name + ".downstream_rq_total")
	return float64(n), err
}

// cpuSnapshot is the CPU (seconds) of each process of a run.
type cpuSnapshot map[string]float64

// snapshotCPU reads the CPU of Envoy, the upstream, the service and its
// store.
func snapshotCPU(ctx context.Context, tg *envoyTarget, e *benchEnvoy, up *process, clkTck int) (cpuSnapshot, error) {
	s := cpuSnapshot{}
	read := func(name string, p *process) error {
		t, err := cpuTicks(p.pid())
		if err != nil {
			return fmt.Errorf("benchrun: %s: %w", name, err)
		}
		s[name] = float64(t) / float64(clkTck)
		return nil
	}
	t, err := cpuTicks(e.Cmd.Process.Pid)
	if err != nil {
		return nil, fmt.Errorf("benchrun: envoy: %w", err)
	}
	s["envoy"] = float64(t) / float64(clkTck)
	if err := read("upstream", up); err != nil {
		return nil, err
	}
	if tg.svc != nil {
		if err := read("rls", tg.svc.process); err != nil {
			return nil, err
		}
		switch {
		case len(tg.be.redis) > 0:
			u, err := readRedisUsage(ctx, tg.be.redis)
			if err != nil {
				return nil, err
			}
			s["store"] = u.cpu
		case tg.be.proc != nil:
			if err := read("store", tg.be.proc); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// measureEnvoyTarget runs h2load against one listener twice: closed loop
// at o.conns×o.streams for the throughput and the CPU per request, then at
// the fixed rate o.rate for the latency.
func measureEnvoyTarget(ctx context.Context, o envoyOptions, h2load, logPath, addr string, tg *envoyTarget, e *benchEnvoy, up *process) (envoyRun, error) {
	clk := clockTicks()
	url := "http://" + addr + "/"
	dur := strconv.Itoa(int(o.duration.Seconds())) + "s"
	run := envoyRun{cpu: map[string]float64{}}

	before, err := snapshotCPU(ctx, tg, e, up, clk)
	if err != nil {
		return run, err
	}
	rq0, err := e.requests(tg.name)
	if err != nil {
		return run, err
	}
	out, usage, err := runH2load(ctx, h2load, "-c", strconv.Itoa(o.conns), "-m", strconv.Itoa(o.streams), "-D", dur, url)
	if err != nil {
		return run, err
	}
	after, err := snapshotCPU(ctx, tg, e, up, clk)
	if err != nil {
		return run, err
	}
	rq1, err := e.requests(tg.name)
	if err != nil {
		return run, err
	}
	if run.reqPerSec, run.errors, err = parseH2load(out); err != nil {
		return run, err
	}
	n := rq1 - rq0
	if n <= 0 {
		return run, fmt.Errorf("benchrun: envoy %s took no request", tg.name)
	}
	for name, v := range after {
		run.cpu[name] = (v - before[name]) / n * 1e6
	}
	run.cpu["h2load"] = usage / n * 1e6

	// The latency at a rate every target sustains: o.rate in all, spread
	// over 4 connections of 1 stream.
	_ = os.Remove(logPath)
	out, _, err = runH2load(ctx, h2load, "-c", "4", "-m", "1", "--rps", strconv.Itoa(o.rate/4), "-D", dur, "--log-file", logPath, url)
	if err != nil {
		return run, err
	}
	_, errs, err := parseH2load(out)
	if err != nil {
		return run, err
	}
	run.errors += errs
	lat, err := readH2loadLog(logPath)
	if err != nil {
		return run, err
	}
	run.p50, run.p99, run.p999 = percentile(lat, 0.50), percentile(lat, 0.99), percentile(lat, 0.999)
	return run, nil
}

// runH2load runs h2load with args and returns its output and CPU seconds.
func runH2load(ctx context.Context, h2load string, args ...string) (string, float64, error) {
	cmd := exec.CommandContext(ctx, h2load, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", 0, fmt.Errorf("benchrun: h2load %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	var cpu float64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	return string(out), cpu, nil
}

var (
	h2loadFinished = regexp.MustCompile(`finished in [0-9.]+m?s, ([0-9.]+) req/s`)
	h2loadRequests = regexp.MustCompile(`requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadCodes    = regexp.MustCompile(`status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx`)
)

// parseH2load reads the request rate and the requests not answered 2xx
// (failed, errored, timed out, or answered 3xx to 5xx) from h2load's
// report.
func parseH2load(out string) (float64, int, error) {
	m := h2loadFinished.FindStringSubmatch(out)
	r := h2loadRequests.FindStringSubmatch(out)
	c := h2loadCodes.FindStringSubmatch(out)
	if m == nil || r == nil || c == nil {
		return 0, 0, fmt.Errorf("benchrun: h2load's report not understood:\n%s", out)
	}
	rate, _ := strconv.ParseFloat(m[1], 64)
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	bad := atoi(r[5]) + atoi(r[6]) + atoi(r[7]) + atoi(c[2]) + atoi(c[3]) + atoi(c[4])
	return rate, bad, nil
}

// readH2loadLog reads the latencies (µs, the third column) of h2load's
// per-request log.
func readH2loadLog(path string) ([]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("benchrun: h2load log: %w", err)
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "\t")
		if len(cols) < 3 {
			continue
		}
		v, err := strconv.ParseFloat(cols[2], 64)
		if err != nil {
			continue
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("benchrun: h2load log: no request")
	}
	slices.Sort(out)
	return out, sc.Err()
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// signalled is closed at SIGTERM or SIGINT.
func signalled() <-chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	return c
}

// The generated part of docs/BENCHMARKS.md for -envoy sits between these.
const (
	envoyStartMarker = "<!-- benchrun-envoy:start -->"
	envoyEndMarker   = "<!-- benchrun-envoy:end -->"
)

// envoyCPUProcesses are the processes whose CPU per request is reported,
// in the table's order.
var envoyCPUProcesses = []string{"h2load", "envoy", "upstream", "rls", "store"}

// writeEnvoyReport writes the -envoy tables into o.out between the
// markers: per target the medians over rounds, the per-round ratios to the
// no-filter run and, with the anchor, this service against the anchor in
// the same round.
func writeEnvoyReport(o envoyOptions, targets []*envoyTarget, results map[string][]envoyRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\n_Generated by `%s` on %s, %s; Envoy 1.40 with one worker thread, h2load (nghttp2 %s) as the load generator, a Go HTTP upstream; %d rounds of %v per run, each round measuring every row once; medians over the rounds._\n\n",
		o.command, time.Now().UTC().Format("2006-01-02 15:04 MST"), machineInfo(), h2loadVersion(), o.runs, o.duration)
	fmt.Fprintf(&b, "Throughput: h2load closed loop, %d connections × %d streams (h2c), one descriptor value for every request. Latency: %d requests/s in all (4 connections, `--rps`), percentiles of every request's time in h2load's log. CPU: µs per request of each process during the throughput run (Redis from `INFO`). _added_ is the row's latency less the no-filter row's of the same round (median over rounds).\n\n", o.conns, o.streams, o.rate)
	b.WriteString("| rate-limit service | store | descriptors | requests/s through Envoy | × no filter | p50 / p99 / p99.9 (µs) | added p50 / p99 / p99.9 (µs) | CPU µs/request: h2load / Envoy / upstream / RLS / store | not 200 |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	base := results["no_filter"]
	for _, tg := range targets {
		runs := results[tg.name]
		var rate, ratio, p50, p99, p999, a50, a99, a999 []float64
		errs := 0
		cpu := map[string][]float64{}
		for i, r := range runs {
			rate = append(rate, r.reqPerSec)
			p50, p99, p999 = append(p50, r.p50), append(p99, r.p99), append(p999, r.p999)
			if i < len(base) {
				ratio = append(ratio, r.reqPerSec/base[i].reqPerSec)
				a50, a99, a999 = append(a50, r.p50-base[i].p50), append(a99, r.p99-base[i].p99), append(a999, r.p999-base[i].p999)
			}
			for k, v := range r.cpu {
				cpu[k] = append(cpu[k], v)
			}
			errs += r.errors
		}
		impl, store, descs := "none (no filter)", "–", "–"
		if tg.svc != nil {
			impl = "this service"
			if tg.impl == "anchor" {
				impl = "envoyproxy/ratelimit"
			}
			store, descs = tg.store, strconv.Itoa(tg.descs)
		}
		var cpus []string
		for _, k := range envoyCPUProcesses {
			if v, ok := cpu[k]; ok {
				cpus = append(cpus, fmt.Sprintf("%.1f", median(v)))
			} else {
				cpus = append(cpus, "–")
			}
		}
		added := "–"
		if tg.svc != nil {
			added = fmt.Sprintf("%.0f / %.0f / %.0f", median(a50), median(a99), median(a999))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %.0f / %.0f / %.0f | %s | %s | %d |\n",
			impl, store, descs, thousands(median(rate)), median(ratio), median(p50), median(p99), median(p999), added, strings.Join(cpus, " / "), errs)
	}
	if o.anchor != "" {
		b.WriteString("\nThis service against envoyproxy/ratelimit, per round (median and range of the rounds' ratios):\n\n")
		b.WriteString("| store | descriptors | requests/s through Envoy, ours ÷ anchor | RLS CPU per request, anchor ÷ ours | added p99, anchor − ours (µs) |\n|---|--:|--:|--:|--:|\n")
		for _, tg := range targets {
			if tg.impl != "ratelimit" || tg.store == "memory" {
				continue
			}
			ours, theirs := results[tg.name], results[strings.Replace(tg.name, "ratelimit_", "anchor_", 1)]
			var tput, cpu, p99 []float64
			for i := range min(len(ours), len(theirs)) {
				tput = append(tput, ours[i].reqPerSec/theirs[i].reqPerSec)
				cpu = append(cpu, theirs[i].cpu["rls"]/ours[i].cpu["rls"])
				p99 = append(p99, theirs[i].p99-ours[i].p99)
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %.0f |\n", tg.store, tg.descs, ratioRange(tput), ratioRange(cpu), median(p99))
		}
	}
	b.WriteString("\n")
	doc, err := os.ReadFile(o.out)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("benchrun: %w", err)
	}
	return os.WriteFile(o.out, []byte(replaceBetween(string(doc), envoyStartMarker, envoyEndMarker, b.String())), 0o644)
}

// thousands formats a rate with a thousands separator.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// h2loadVersion is h2load's version, as it prints it.
func h2loadVersion() string {
	out, err := exec.Command("h2load", "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "h2load nghttp2/")
}
