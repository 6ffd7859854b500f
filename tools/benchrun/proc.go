package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// freePorts returns n distinct free TCP ports on 127.0.0.1. All listeners
// stay open until every port is chosen, so the n ports differ; another
// process may still take one before it is used, which the callers report.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("benchrun: free port: %w", err)
		}
		lis = append(lis, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startOnFreePorts picks n free ports, starts a process on them (start)
// and waits until it serves (ready), and does it all again on new ports,
// twice at most, when the process failed because another took one of them
// first: ports picked in advance cannot escape that race, and
// envoyproxy/ratelimit cannot bind port 0 and say what it bound.
func startOnFreePorts(ctx context.Context, n int, timeout time.Duration, what string,
	start func(ports []int) (*process, error), ready func(ports []int) func() error) (*process, []int, error) {
	for attempt := 0; ; attempt++ {
		ports, err := freePorts(n)
		if err != nil {
			return nil, nil, err
		}
		p, err := start(ports)
		if err != nil {
			return nil, nil, err
		}
		err = p.waitUntil(ctx, timeout, what, ready(ports))
		if err == nil {
			return p, ports, nil
		}
		p.stop()
		if attempt == 2 || !strings.Contains(strings.ToLower(p.out.tail(4096)), "address already in use") {
			return nil, nil, err
		}
	}
}

// cpuTicks returns utime+stime of a process in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatTicks(string(b))
}

// parseStatTicks reads fields 14 (utime) and 15 (stime) of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may hold spaces or ')',
// so fields are counted from the last ')'.
func parseStatTicks(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("benchrun: /proc stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state), so field k is f[k-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("benchrun: /proc stat: %d fields after the name, want at least 13", len(f))
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("benchrun: /proc stat: %w", err)
	}
	return utime + stime, nil
}

// rssBytes returns VmRSS of a process.
func rssBytes(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(string(b))
}

// parseVmRSS reads the "VmRSS:   1234 kB" line of /proc/<pid>/status.
func parseVmRSS(status string) (uint64, error) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("benchrun: /proc status: VmRSS %q", strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("benchrun: /proc status: %w", err)
		}
		return kb * 1024, nil
	}
	return 0, errors.New("benchrun: /proc status: no VmRSS")
}

// clockTicks returns the kernel's clock ticks per second (getconf CLK_TCK),
// 100 when it cannot be read.
func clockTicks() int {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		return 100
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || n <= 0 {
		return 100
	}
	return n
}

// parseStats reads the plain-text counters of the debug endpoint, one
// "name: value" per line; lines of another form are skipped.
func parseStats(r io.Reader) map[string]float64 {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		m[strings.TrimSpace(name)] = v
	}
	return m
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// fetchStat returns one counter from GET url, and false when the endpoint
// or the counter is missing. Underscores in name also match hyphens.
func fetchStat(url, name string) (float64, bool) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	m := parseStats(io.LimitReader(resp.Body, 1<<20))
	if v, ok := m[name]; ok {
		return v, true
	}
	// The same counter spelt with hyphens (round-trips), as some statsd
	// names are.
	v, ok := m[strings.ReplaceAll(name, "_", "-")]
	return v, ok
}

// process is a child process started by benchrun: redis-server, memcached
// or the service. Its output is kept (the last 64 KiB) for error messages.
type process struct {
	name   string
	cmd    *exec.Cmd
	out    *tailBuffer
	exited chan struct{}
	err    error // set before exited is closed
}

func startProcess(name string, cmd *exec.Cmd) (*process, error) {
	p := &process{name: name, cmd: cmd, out: &tailBuffer{max: 64 << 10}, exited: make(chan struct{})}
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("benchrun: start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// exitError is the error of a child that exited when it should be running.
type exitError struct {
	name string
	err  error
	// out is the end of the process's output.
	out string
}

func (e *exitError) Error() string {
	return fmt.Sprintf("benchrun: %s exited (%v):\n%s", e.name, e.err, e.out)
}

// exitError describes an early exit with the end of the process's output.
func (p *process) exitError() error {
	return &exitError{name: p.name, err: p.err, out: p.out.tail(2000)}
}

// stop sends SIGTERM, waits up to 5 s, then kills. It ends only this process.
func (p *process) stop() {
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// waitUntil polls ready every 50 ms until it returns nil, the process
// exits, or timeout passes.
func (p *process) waitUntil(ctx context.Context, timeout time.Duration, what string, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if !p.running() {
			return p.exitError()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("benchrun: %s: not %s after %v: %w\n%s", p.name, what, timeout, err, p.out.tail(2000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent use.
type tailBuffer struct {
	// mu guards b.
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

// tail returns the last n bytes, trimmed.
func (t *tailBuffer) tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.b
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// tcpProbe connects to addr, sends req and checks that the reply starts with
// want: PING/+PONG for Redis, version/VERSION for memcached.
func tcpProbe(addr, req, want string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != want {
		return fmt.Errorf("reply %q, want %q", buf, want)
	}
	return nil
}

// httpOK checks that GET url answers 200.
func httpOK(url string) error {
	resp, err := httpClient.Get(url)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
