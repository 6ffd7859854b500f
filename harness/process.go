package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// readyTimeout bounds how long a launcher waits for a process to answer.
const readyTimeout = 15 * time.Second

// proc is one server process that can be started, probed until it answers,
// and killed. Its methods are safe for concurrent use; the zero value has no
// process.
type proc struct {
	// mu guards cmd and done; start holds it until the process is ready.
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// procSpec describes how proc.start runs and probes one process.
type procSpec struct {
	// name is the program's name in error messages ("redis-server").
	name string
	// addr is the address the process listens on, for error messages.
	addr string
	// output, when set, is the file that receives the process's stdout and
	// stderr (appended to, so that a restart keeps the earlier output).
	output string
	// ready returns nil once the process with pid answers on addr. Where the
	// protocol tells, it checks that pid is the one answering: another
	// server that took the port first must not pass for ours.
	ready func(ctx context.Context, pid int) error
	// tail returns the end of the process's logs for error messages.
	tail func() string
}

// start runs cmd, unless a process is already running, and polls spec.ready
// every 20 ms until it succeeds. When the process exits first, or is not
// ready within readyTimeout (it is then killed), start returns an error with
// the end of its logs.
func (p *proc) start(cmd *exec.Cmd, spec procSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	// Kill the server if the test binary dies without running its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out *os.File
	if spec.output != "" {
		var err error
		out, err = os.OpenFile(spec.output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		if out != nil {
			_ = out.Close()
		}
		return fmt.Errorf("harness: start %s: %w", spec.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if out != nil {
			_ = out.Close()
		}
		close(done)
	}()
	p.cmd, p.done = cmd, done

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for {
		err := spec.ready(ctx, cmd.Process.Pid)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			p.cmd, p.done = nil, nil
			return fmt.Errorf("harness: %s on %s exited at start: %v\n%s", spec.name, spec.addr, err, spec.tail())
		case <-ctx.Done():
			p.killLocked()
			return fmt.Errorf("harness: %s on %s not ready after %v: %v\n%s", spec.name, spec.addr, readyTimeout, err, spec.tail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop kills the process (SIGKILL, as a crash or a network cut would look to
// clients) and waits for it to exit. It does nothing when none is running.
func (p *proc) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

func (p *proc) killLocked() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd, p.done = nil, nil
}

// signal sends sig to the process; it fails when none is running. With
// SIGSTOP it returns once every thread of the process has stopped (see
// Freeze).
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("harness: no process to signal")
	}
	if sig == syscall.SIGSTOP {
		return Freeze(p.cmd.Process)
	}
	return p.cmd.Process.Signal(sig)
}

// Freeze sends SIGSTOP to process and returns once every thread of it has
// stopped, as far as /proc tells. The kernel stops a process's threads
// only once one of them has taken the signal, which on a busy machine can
// be milliseconds after the signal was sent; meanwhile the others still
// answer what they are sent.
func Freeze(process *os.Process) error {
	if err := process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	for !stopped(process.Pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("harness: process %d not stopped after %v", process.Pid, readyTimeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// stopped reports whether every thread of process pid is stopped (state T
// in /proc); true when /proc cannot tell.
func stopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return true
	}
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 || i+2 >= len(data) {
			return true
		}
		if data[i+2] != 'T' && data[i+2] != 't' {
			return false
		}
	}
	return true
}

// freeze stops the process with SIGSTOP and returns once the kernel reports
// it stopped (see signal): a signal is delivered asynchronously, and a
// process still running could answer a request sent after freeze returned.
func (p *proc) freeze() error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("harness: freeze: %w", err)
	}
	return nil
}

// running reports whether the process is up.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// launchOnFreePort prepares a server on a fresh free port and starts it. A
// free port can be taken by another process between our probe and the
// server's bind, so a failed start is tried again on a new port, three times
// in all; an error from prepare (a configuration that cannot be written) is
// returned at once.
func launchOnFreePort[T any](prepare func(port int) (T, error), start func(T) error) (T, error) {
	var zero T
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return zero, err
		}
		s, err := prepare(port)
		if err != nil {
			return zero, err
		}
		if lastErr = start(s); lastErr == nil {
			return s, nil
		}
	}
	return zero, lastErr
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
// Ports above 55535 are skipped so that port+10000 (Redis Cluster's default
// bus offset) stays valid should anyone rely on it.
func freePort() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("harness: free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port <= 55535 {
			return port, nil
		}
	}
	return 0, errors.New("harness: no free port below 55536")
}

// fileTail returns the end of a log file, for error messages.
func fileTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return fmt.Sprintf("--- %s\n%s", filepath.Base(path), data)
}
