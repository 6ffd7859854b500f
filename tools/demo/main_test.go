package main

import (
	"bufio"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestDemo runs the demo as `make demo` does, with real Envoy, and reads
// what it prints: the requests through Envoy answered 200 and then 429.
// It sends its own request through the Envoy the demo names, stops the demo
// as Ctrl-C does, and checks that nothing the demo started is left: no
// process, no listener, no temporary folder.
func TestDemo(t *testing.T) {
	if _, err := harness.FindEnvoy(); err != nil {
		t.Fatalf("real Envoy is needed: %v; %s", err, harness.EnvoyInstall)
	}
	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait closes the pipe: it must come after the last read (os/exec),
	// or the demo's last line may be lost.
	read := make(chan struct{})
	exited := make(chan struct{})
	lines := make(chan string)
	go func() { <-read; _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			_ = stdout.Close() // its children may hold the pipe
			for range lines {
			}
			<-exited
		}
	})
	go func() {
		defer close(read)
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// next returns the demo's next line, "" and false once it closed its
	// output. The bound only keeps a hung demo from hanging the suite: it
	// builds the service first, which takes minutes on a cold cache.
	var printed []string
	next := func() (string, bool) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if ok {
				printed = append(printed, l)
			}
			return l, ok
		case <-time.After(10 * time.Minute):
			t.Fatalf("the demo printed nothing for 10 minutes:\n%s\n%s", strings.Join(printed, "\n"), readFile(stderr.Name()))
			return "", false
		}
	}
	for {
		l, ok := next()
		if !ok {
			t.Fatalf("the demo ended before it was ready:\n%s\n%s", strings.Join(printed, "\n"), readFile(stderr.Name()))
		}
		if l == "Ctrl-C stops everything." {
			break
		}
	}
	out := strings.Join(printed, "\n")
	find := func(re string) []string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("the demo printed no %s:\n%s", re, out)
		}
		return m
	}
	dir := find(`building the service .* in (\S+)`)[1]
	envoyURL := find(`(?m)^  envoy +(http://\S+/) +\(admin http://(\S+)/`)
	svc := find(`(?m)^  ratelimit +gRPC (\S+), HTTP (\S+), debug (\S+) `)
	upstream := find(`(?m)^  upstream +http://(\S+)/`)[1]

	// What it printed of its own requests: 200s, then 429s.
	codes := strings.Fields(find(`(?m)^\$ for i in .*\n(.*)`)[1])
	if ok, _ := regexp.MatchString(`^(200 )+(429 ?)+$`, strings.Join(codes, " ")); !ok {
		t.Errorf("the demo's requests through Envoy were answered %v; want 200s, then 429s", codes)
	}
	find(`x-envoy-ratelimited: true`)

	// Its Envoy refuses this test's requests too, now that the client's
	// budget is spent (a request may come back meanwhile: a few tries).
	refused := false
	for range 10 {
		resp, err := http.Get(envoyURL[1])
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("x-envoy-ratelimited") == "true" {
			refused = true
			break
		}
	}
	if !refused {
		t.Errorf("the demo's Envoy at %s answered no 429 with x-envoy-ratelimited in 10 requests", envoyURL[1])
	}

	// What it started: the service and Envoy, children of its own.
	children := childrenOf(t, cmd.Process.Pid)
	var names []string
	for _, name := range children {
		names = append(names, name)
	}
	for _, want := range []string{"ratelimit", "envoy"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("the demo's children are %v; want %s among them", names, want)
		}
	}

	// Ctrl-C: it stops them all and exits 0.
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := next(); !ok {
			break
		}
	}
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the demo still runs 2 minutes after SIGINT:\n%s", readFile(stderr.Name()))
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the demo exited %d after SIGINT, want 0:\n%s", code, readFile(stderr.Name()))
	}
	if last := printed[len(printed)-1]; last != "demo: stopped" {
		t.Errorf("the demo's last line is %q, want %q", last, "demo: stopped")
	}
	for pid, name := range children {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s (pid %d) still runs after the demo stopped", name, pid)
		}
	}
	for _, addr := range []string{strings.TrimSuffix(strings.TrimPrefix(envoyURL[1], "http://"), "/"), envoyURL[2], svc[1], svc[2], svc[3], upstream} {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the demo stopped", addr)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the demo's folder %s is still there (%v)", dir, err)
	}
}

// childrenOf returns the processes whose parent is pid, by pid, with their
// command names.
func childrenOf(t *testing.T, pid int) map[int]string {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // it exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and ')'.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		child, err := strconv.Atoi(strings.TrimSpace(s[:open]))
		if err != nil {
			continue
		}
		out[child] = s[open+1 : end]
	}
	return out
}

// readFile is the text of a file, "" when it cannot be read.
func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
