// Package integration drives the built ratelimit binary only over the wire
// (gRPC, /json, /healthcheck, signals), with real stores on loopback ports.
package integration

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimit/harness"
)

// binary is the service built once for the whole package, with -race, in
// buildDir.
var binary, buildDir string

// parallelTests is how many tests marked parallel run at once, unless
// -parallel says otherwise. They run after the others, and are long
// tests that spend much of their time waiting (real Envoys' quota rounds,
// store floods against a cap, stalled clients, a browser): more at once
// than the 2 of a 2-core machine's default takes minutes off the suite.
// The tests whose bounds depend on the machine's pace (deadlines,
// breakers, load, shutdown) are not among them; the quota runs and the
// tests that keep the cores busy take turns (apart), and the quota runs
// are two at most (quotaRuns). The places are many because tests waiting
// for their turn hold theirs.
const parallelTests = 10

// apart keeps two groups of parallel tests from running at the same time:
// the real-Envoy quota runs, whose fair shares need Envoy to keep up, and
// the tests that keep the cores busy for seconds (floods, large messages,
// the browser). Within a group, tests run together.
var apart groups

// The groups of apart.
const (
	quotaGroup = iota + 1
	busyGroup
)

// groups lets the tests of one group at a time run.
type groups struct {
	mu      sync.Mutex
	changed *sync.Cond
	group   int // the group running, 0 for none
	running int
}

// enter waits until no test of another group runs, and holds the place of
// t in group until t ends.
func (g *groups) enter(t *testing.T, group int) {
	g.mu.Lock()
	if g.changed == nil {
		g.changed = sync.NewCond(&g.mu)
	}
	for g.running > 0 && g.group != group {
		g.changed.Wait()
	}
	g.group = group
	g.running++
	g.mu.Unlock()
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.running--; g.running == 0 {
			g.group = 0
			g.changed.Broadcast()
		}
	})
}

// busyParallel marks t as a parallel test that keeps the cores busy: it
// runs after the others and apart from the quota runs.
func busyParallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	apart.enter(t, busyGroup)
}

// slow marks a test that starts many processes, or waits through
// wall-clock phases (seconds of load, leases, reports): make test-short
// (go test -short) skips it, so that the quick loop stays quick; make test
// and CI run every test.
func slow(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow: make test runs it; -short (make test-short) skips it")
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelTests)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "ratelimit-it")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	binary = filepath.Join(dir, "ratelimit")
	// The service runs under the race detector, but for make test-short's
	// quick loop: its link alone takes most of a minute here.
	args := []string{"build", "-race", "-o", binary, "github.com/ratelimitd/ratelimit/cmd/ratelimit"}
	if testing.Short() {
		args = slices.Delete(args, 1, 2)
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: building the service:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// onceBuilt is a binary built once for the package's tests.
type onceBuilt struct {
	once sync.Once
	path string
	err  error
}

// build builds pkg as name in buildDir, once, and returns its path.
func (b *onceBuilt) build(t *testing.T, name, pkg string) string {
	t.Helper()
	b.once.Do(func() {
		b.path = filepath.Join(buildDir, name)
		out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("building %s: %w\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

var plain, checker onceBuilt

// plainBinary builds the service without -race, once, for the tests that
// measure memory: the race detector's shadow memory multiplies RSS several
// times over, and by how much depends on the machine's load.
func plainBinary(t *testing.T) string {
	t.Helper()
	return plain.build(t, "ratelimit-plain", "github.com/ratelimitd/ratelimit/cmd/ratelimit")
}

// checkerBinary builds ratelimit-check, once.
func checkerBinary(t *testing.T) string {
	t.Helper()
	return checker.build(t, "ratelimit-check", "github.com/ratelimitd/ratelimit/cmd/ratelimit-check")
}

// proc is one running service process.
type proc struct {
	cmd               *exec.Cmd
	root              string
	grpc, http, debug string
	// prom is the PROMETHEUS_ADDR listener's address, if any.
	prom    string
	stderr  harness.Log
	done    chan struct{}
	exitErr error
}

// portOf is the port of a host:port address.
func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// writeRules writes name into root/config.
func writeRules(t *testing.T, root, name, text string) {
	t.Helper()
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// launch starts the binary with rules in a fresh RUNTIME_ROOT and env on
// top of free loopback ports. It does not wait for readiness.
func launch(t *testing.T, rules map[string]string, env ...string) *proc {
	t.Helper()
	return launchWith(t, launchOpts{}, rules, env...)
}

// launchOpts change how launchWith starts the service.
type launchOpts struct {
	// binary replaces the -race build.
	binary string
	// nofile, when set, is the open-file limit (soft and hard) the service
	// starts with, set through the shell.
	nofile int
	// reuse, when set, is a service that has exited: the new one takes
	// its addresses and its RUNTIME_ROOT (a restart).
	reuse *proc
	// defaultBudget leaves REQUEST_TIMEOUT unset, at its default, instead
	// of the 2s the other tests get.
	defaultBudget bool
	// noWait returns at once, before the service says where it listens:
	// for a service that opens its ports late on purpose (the first rules
	// from an xDS server); the test calls awaitServing.
	noWait bool
}

// launchWith is launch with opts.
func launchWith(t *testing.T, opts launchOpts, rules map[string]string, env ...string) *proc {
	t.Helper()
	p := &proc{root: t.TempDir(), done: make(chan struct{})}
	for name, text := range rules {
		writeRules(t, p.root, name, text)
	}
	// The service binds port 0 and says in its "serving" line what it
	// bound: no port is picked in advance, where another process could
	// take it first. A restart takes its predecessor's ports.
	gp, hp, dp := 0, 0, 0
	if old := opts.reuse; old != nil {
		p.root = old.root
		gp, hp, dp = portOf(t, old.grpc), portOf(t, old.http), portOf(t, old.debug)
	}
	bin := binary
	if opts.binary != "" {
		bin = opts.binary
	}
	p.cmd = exec.Command(bin)
	if opts.nofile > 0 {
		// exec keeps the pid, so signals and /proc still reach the service.
		p.cmd = exec.Command("sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0"`, opts.nofile), bin)
	}
	p.cmd.Env = append(os.Environ(),
		"RUNTIME_ROOT="+p.root, "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		fmt.Sprintf("PORT=%d", hp), fmt.Sprintf("GRPC_PORT=%d", gp), fmt.Sprintf("DEBUG_PORT=%d", dp),
		"LOG_LEVEL=info")
	if !opts.defaultBudget {
		// A budget the -race binary meets on a loaded machine; tests of
		// the budget set their own.
		p.cmd.Env = append(p.cmd.Env, "REQUEST_TIMEOUT=2s")
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("service stderr:\n%s", p.logs())
		}
	})
	if !opts.noWait {
		p.awaitServing(t)
	}
	return p
}

// awaitServing waits until the service says where it listens, and sets
// p's addresses; it returns without them when the service exits first.
func (p *proc) awaitServing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p.readServing() {
			return
		}
		select {
		case <-p.done:
			p.readServing() // a line written just before the exit
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service did not say where it listens within 60s:\n%s", p.logs())
		}
	}
}

// readServing reads the "serving" line from the logs into p's addresses,
// and reports whether there was one.
func (p *proc) readServing() bool {
	sl, ok := harness.ParseServing(p.logs())
	if ok {
		p.grpc, p.http, p.debug, p.prom = sl.GRPC, sl.HTTP, sl.Debug, sl.Prometheus
	}
	return ok
}

func (p *proc) logs() string { return p.stderr.String() }

// start launches the service and waits until /healthcheck says 200.
func start(t *testing.T, rules map[string]string, env ...string) *proc {
	t.Helper()
	p := launch(t, rules, env...)
	p.waitHealth(t, http.StatusOK)
	return p
}

func (p *proc) healthCode() int {
	resp, err := http.Get("http://" + p.http + "/healthcheck")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (p *proc) waitHealth(t *testing.T, want int) {
	t.Helper()
	eventually(t, fmt.Sprintf("/healthcheck %d", want), 30*time.Second, func() bool {
		select {
		case <-p.done:
			t.Fatalf("service exited early: %v\n%s", p.exitErr, p.logs())
		default:
		}
		return p.healthCode() == want
	})
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("service still running after %v", within)
	}
	return p.cmd.ProcessState.ExitCode()
}

// signal sends sig to the service; with SIGSTOP it returns once the
// service has stopped (harness.Freeze), so that it answers nothing sent
// afterwards.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	var err error
	if sig == syscall.SIGSTOP {
		err = harness.Freeze(p.cmd.Process)
	} else {
		err = p.cmd.Process.Signal(sig)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func (p *proc) client(t *testing.T) rlsv3.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

func (p *proc) postJSON(t *testing.T, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+p.http+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	harness.WaitFor(t, within, what, cond)
}

// request builds a request of one descriptor from key/value pairs.
func request(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}
