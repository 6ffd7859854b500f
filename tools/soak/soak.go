package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

// config is one soak run.
type config struct {
	// duration is how long the measured traffic runs.
	duration time.Duration
	// faultEvery is the time between two faults' starts; the first starts
	// a quarter of it into the run, and a fault starts only if it can end,
	// and the service recover, before the run does.
	faultEvery, faultLength time.Duration
	// budget is the service's REQUEST_TIMEOUT.
	budget time.Duration
	// background is the number of senders of background traffic.
	background int
	// binary is the service to run; "" builds it.
	binary string
}

func defaultConfig() config {
	return config{
		duration:    2 * time.Minute,
		faultEvery:  20 * time.Second,
		faultLength: 3 * time.Second,
		// Production would use Envoy's 20 ms or less; 100 ms keeps a
		// loaded 2-core machine from turning scheduling delays into
		// errors outside the faults, which would hide the faults' own.
		budget:     100 * time.Millisecond,
		background: 4,
	}
}

func (c config) validate() error {
	switch {
	case c.duration < 5*time.Second || c.duration > 24*time.Hour:
		return fmt.Errorf("soak: duration %v: want 5s..24h", c.duration)
	case c.faultLength <= 0 || c.faultEvery < c.faultLength+recoverBound:
		return fmt.Errorf("soak: a fault of %v every %v: want faults that end, and leave %v to recover, before the next", c.faultLength, c.faultEvery, recoverBound)
	case c.budget <= 0:
		return fmt.Errorf("soak: budget %v: want > 0", c.budget)
	case c.background < 0 || c.background > 64:
		return fmt.Errorf("soak: %d background senders: want 0..64", c.background)
	}
	return nil
}

// recoverBound is how soon after a store's return every sender must be
// deciding again; errors up to then count as the fault's.
const recoverBound = 2 * time.Second

// redisPoolSize is the service's REDIS_POOL_SIZE (its default): the most
// connections it keeps to Redis for requests; the probes add one or two.
const redisPoolSize = 10

// Rules of the soak. The hot, /login and override streams are checked for
// exactness (stream.limit); the rest is background traffic for every
// algorithm and a spread of keys.
const apiRules = `domain: api
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window}
  - key: sl
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_log}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
`

const webRules = `domain: web
descriptors:
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: ovr
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`

// stream is one kind of traffic: its senders each send one request every
// pace. A stream with a limit sends a fixed request whose fixed-window limit
// per second is limit, and is checked for exactness.
type stream struct {
	name    string
	limit   uint64
	senders int
	pace    time.Duration
	// next returns the request to send; rng is the sender's own.
	next func(rng *rand.Rand) *rlsv3.RateLimitRequest
}

func fixed(req *rlsv3.RateLimitRequest) func(*rand.Rand) *rlsv3.RateLimitRequest {
	return func(*rand.Rand) *rlsv3.RateLimitRequest { return req }
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func req(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// streams returns the soak's traffic: the checked streams first, each well
// over its limit (two senders on a hot key, so that their hits race), then
// background senders that pick a request at random.
func streams(background int) []stream {
	override := desc("ovr", "o1")
	override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 15, Unit: typev3.RateLimitUnit_SECOND}
	ss := []stream{
		{name: "api hot=h1 (20/s)", limit: 20, senders: 2, pace: 20 * time.Millisecond, next: fixed(req("api", desc("hot", "h1")))},
		{name: "api hot=h2 (20/s)", limit: 20, senders: 2, pace: 20 * time.Millisecond, next: fixed(req("api", desc("hot", "h2")))},
		{name: "web /login 10.0.0.1 (5/s)", limit: 5, senders: 1, pace: 50 * time.Millisecond,
			next: fixed(req("web", desc("path", "/login", "remote_address", "10.0.0.1")))},
		{name: "web override ovr=o1 (15/s)", limit: 15, senders: 2, pace: 40 * time.Millisecond, next: fixed(req("web", override))},
	}
	if background > 0 {
		ss = append(ss, stream{name: "background", senders: background, pace: 5 * time.Millisecond, next: backgroundRequest})
	}
	return ss
}

// backgroundRequest is a request of the background traffic: a user among
// 10,000 (under the limit), a hot value of one of the other algorithms
// (often over), a path among 50, or /login from one of 250 addresses, or
// a user and a token bucket in one request.
func backgroundRequest(rng *rand.Rand) *rlsv3.RateLimitRequest {
	switch rng.IntN(4) {
	case 0:
		return req("api", desc("user", "u"+strconv.Itoa(rng.IntN(10_000))))
	case 1:
		alg := []string{"sw", "sl", "tb"}[rng.IntN(3)]
		return req("api", desc(alg, "v"+strconv.Itoa(rng.IntN(20))))
	case 2:
		if rng.IntN(2) == 0 {
			return req("web", desc("path", "/p"+strconv.Itoa(rng.IntN(50))))
		}
		return req("web", desc("path", "/login", "remote_address", "10.1.0."+strconv.Itoa(rng.IntN(250))))
	default:
		// Two descriptors of two algorithms in one request.
		return req("api", desc("user", "u"+strconv.Itoa(rng.IntN(10_000))), desc("tb", "v"+strconv.Itoa(rng.IntN(20))))
	}
}

// call is one request's outcome.
type call struct {
	began, ended time.Time
	code         codes.Code // OK for a decision
	over         bool       // the decision was OVER_LIMIT
}

func (c call) took() time.Duration { return c.ended.Sub(c.began) }

// sender is one goroutine of a stream, and what it saw.
type sender struct {
	stream int
	calls  []call
}

// windowGuard: a checked sender sends nothing this close before a
// one-second boundary, so that a request's window is known from when it was
// sent and answered (both in one second) without reading the service's
// clock; one that still crosses a boundary (a slow answer) makes its two
// windows unchecked.
const windowGuard = 10 * time.Millisecond

// traffic runs ss against the service until ctx ends or until, and
// returns every sender's calls.
func traffic(ctx context.Context, conns []*grpc.ClientConn, ss []stream, until time.Time, deadline time.Duration) []*sender {
	var senders []*sender
	var wg sync.WaitGroup
	n := 0
	for si, s := range ss {
		for range s.senders {
			sd := &sender{stream: si}
			senders = append(senders, sd)
			client := rlsv3.NewRateLimitServiceClient(conns[n%len(conns)])
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			n++
			// Bounded: by until, and by the calls the pace allows.
			maxCalls := int(time.Until(until)/s.pace) + 1
			wg.Go(func() {
				for range maxCalls {
					now := time.Now()
					if s.limit > 0 {
						if next := now.Truncate(time.Second).Add(time.Second); next.Sub(now) < windowGuard {
							sleep(ctx, time.Until(next))
							now = time.Now()
						}
					}
					if !now.Before(until) || ctx.Err() != nil {
						return
					}
					c := call{began: now}
					cctx, cancel := context.WithTimeout(ctx, deadline)
					resp, err := client.ShouldRateLimit(cctx, s.next(rng))
					cancel()
					c.ended, c.code = time.Now(), status.Code(err)
					c.over = err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
					sd.calls = append(sd.calls, c)
					sleep(ctx, time.Until(c.began.Add(s.pace)))
				}
			})
		}
	}
	wg.Wait()
	return senders
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// faultKind is one of the faults the soak rotates through.
type faultKind int

const (
	faultKill faultKind = iota
	faultFreeze
	faultLatency
	faultDrops
	faultKinds
)

func (k faultKind) String() string {
	return [...]string{"Redis killed, restarted", "Redis frozen (SIGSTOP), resumed", "replies delayed past the budget", "replies cut mid-way"}[k]
}

// fault is one fault injected during the run.
type fault struct {
	kind            faultKind
	injected, fixed time.Time
	err             error // injecting or fixing failed
}

// inject runs one fault of kind k for length and returns when it is fixed:
// the store answers again.
func inject(ctx context.Context, k faultKind, length time.Duration, r *harness.RedisServer, px *harness.Proxy, budget time.Duration) fault {
	f := fault{kind: k, injected: time.Now()}
	var fix func() error
	switch k {
	case faultKill:
		f.err, fix = r.Stop(), r.Start
	case faultFreeze:
		f.err, fix = r.Freeze(), r.Thaw
	case faultLatency:
		px.SetLatency(3 * budget)
		fix = func() error { px.Heal(); return nil }
	case faultDrops:
		px.DropReplies()
		fix = func() error { px.Heal(); return nil }
	}
	sleep(ctx, time.Until(f.injected.Add(length)))
	// Fixed even when ctx ended, so that the run's cleanup finds the
	// store as it was.
	f.err = errors.Join(f.err, fix())
	f.fixed = time.Now()
	return f
}

// service is the running service process.
type service struct {
	cmd               *exec.Cmd
	grpc, http, debug string
	stderr            *lockedBuffer
	done              chan struct{}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Keep the first MiB: enough for any panic, bounded however much the
	// service logs.
	if room := 1<<20 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startService runs bin with the soak's rules in root on Redis at
// redisAddr, and waits until it is healthy.
func startService(ctx context.Context, bin, root, redisAddr string, budget time.Duration) (*service, error) {
	for name, text := range map[string]string{"api.yaml": apiRules, "web.yaml": webRules} {
		if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(root, "config", name), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	// Every listener on port 0: its "serving" line says what it bound.
	s := &service{stderr: &lockedBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin)
	s.cmd.Env = append(os.Environ(),
		"RUNTIME_ROOT="+root, "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"GRPC_PORT=0", "PORT=0", "DEBUG_PORT=0",
		"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
		"REQUEST_TIMEOUT="+budget.String(), "REDIS_TIMEOUT="+storeTimeout.String(),
		"LOCAL_CACHE_SIZE_IN_BYTES=1048576", "LOG_LEVEL=warn")
	s.cmd.Stderr = s.stderr
	// Killed with us if we die without stopping it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("soak: start the service: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-s.done:
			return nil, fmt.Errorf("soak: the service exited at start:\n%s", s.stderr)
		default:
		}
		if at, ok := harness.ParseServing(s.stderr.String()); ok {
			s.grpc, s.http, s.debug = at.GRPC, at.HTTP, at.Debug
		}
		if resp, err := http.Get("http://" + s.http + "/healthcheck"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("soak: the service is not healthy after 30 s:\n%s", s.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the service: SIGTERM, then SIGKILL after 15 s (its drain).
func (s *service) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// usage is what the service holds.
type usage struct {
	rssBytes                 uint64
	goroutines, files, conns int
}

// usage reads the service's RSS and open files from /proc, its goroutines
// from its goroutine profile, and its connections from Redis's CLIENT LIST.
func (s *service) usage(r *harness.RedisServer) (usage, error) {
	var u usage
	pid := s.cmd.Process.Pid
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for line := range strings.Lines(string(st)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return u, fmt.Errorf("soak: VmRSS %q: %w", v, err)
			}
			u.rssBytes = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return u, err
	}
	u.files = len(fds)
	resp, err := http.Get("http://" + s.debug + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return u, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return u, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if u.goroutines, err = strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total ")); err != nil {
		return u, fmt.Errorf("soak: goroutine profile starts with %q", first)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := r.Do(ctx, "CLIENT", "LIST")
	if err != nil {
		return u, fmt.Errorf("soak: CLIENT LIST: %w", err)
	}
	text, _ := list.(string)
	u.conns = strings.Count(text, "\n") - 1 // less the one that asks
	return u, nil
}

// run is one soak: see the command's documentation.
func run(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	dir, err := os.MkdirTemp("", "ratelimit-soak")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := cfg.binary
	if bin == "" {
		bin = filepath.Join(dir, "ratelimit")
		fmt.Fprintln(logw, "soak: building the service")
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ratelimitd/ratelimit/cmd/ratelimit")
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("soak: building the service: %w\n%s", err, out)
		}
	}
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return nil, err
	}
	r, err := harness.LaunchRedis(rdir, harness.RedisOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	defer func() { _ = r.Thaw() }()
	px, err := harness.LaunchProxy(r.Addr)
	if err != nil {
		return nil, err
	}
	defer px.Close()
	svc, err := startService(ctx, bin, filepath.Join(dir, "root"), px.Addr, cfg.budget)
	if err != nil {
		return nil, err
	}
	defer svc.stop()

	// A few connections shared by the senders, as Envoy keeps a few.
	conns := make([]*grpc.ClientConn, 4)
	for i := range conns {
		if conns[i], err = grpc.NewClient(svc.grpc, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		defer conns[i].Close()
	}
	ss := streams(cfg.background)
	// Deadline of a call: Envoy's would be the budget or a little more;
	// far more here, so that an answer late for its budget shows as late.
	callDeadline := 10 * cfg.budget

	// A second of warm-up opens the connections, so that the usage at the
	// start compares with the end's.
	fmt.Fprintln(logw, "soak: warming up")
	traffic(ctx, conns, ss, time.Now().Add(time.Second), callDeadline)
	time.Sleep(200 * time.Millisecond)
	rep := &report{cfg: cfg, streams: ss}
	if rep.before, err = svc.usage(r); err != nil {
		return nil, err
	}

	rep.loadBefore = loadAverage()
	rep.began = time.Now()
	end := rep.began.Add(cfg.duration)
	fmt.Fprintf(logw, "soak: %v of traffic, a fault every %v for %v\n", cfg.duration, cfg.faultEvery, cfg.faultLength)
	faults := make(chan []fault, 1)
	go func() {
		var fs []fault
		for k := 0; ; k++ {
			at := rep.began.Add(cfg.faultEvery/4 + time.Duration(k)*cfg.faultEvery)
			if at.Add(cfg.faultLength + recoverBound).After(end) {
				break
			}
			sleep(ctx, time.Until(at))
			if ctx.Err() != nil {
				break
			}
			f := inject(ctx, faultKind(k)%faultKinds, cfg.faultLength, r, px, cfg.budget)
			fmt.Fprintf(logw, "soak: %v at %v, fixed after %v\n", f.kind, f.injected.Sub(rep.began).Round(time.Millisecond), f.fixed.Sub(f.injected).Round(time.Millisecond))
			fs = append(fs, f)
		}
		faults <- fs
	}()
	rep.senders = traffic(ctx, conns, ss, end, callDeadline)
	rep.ended = time.Now()
	rep.loadAfter = loadAverage()
	rep.faults = <-faults
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// The usage at the end, once the service has let go of the load: wait
	// up to 10 s for its goroutines to come back down.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rep.after, err = svc.usage(r)
		if err == nil && rep.after.goroutines <= rep.before.goroutines+goroutineSlack || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	rep.stderr = svc.stderr.String()
	rep.analyse()
	return rep, nil
}

// loadAverage returns the machine's 1-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
