package harness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memcachedInstall is the "binary not found" advice: a missing server is a
// test failure that says how to fix it, never a skip.
const memcachedInstall = "run `make servers` (apt-get install memcached; brew install memcached)"

// MemcachedServer is a memcached process on a free 127.0.0.1 port: TCP only
// (-U 0), 64 MiB of memory. Its methods are safe for concurrent use.
type MemcachedServer struct {
	// Addr is "127.0.0.1:port"; it stays the same across Stop and Start.
	Addr string
	// Dir holds the process's log (and, with TLS, the certificates).
	Dir string
	// TLS holds the certificate files and client configuration when the
	// server was started with StartMemcachedTLS; nil otherwise. The server
	// does not ask for a client certificate.
	TLS *TLSFiles

	bin  string
	args []string // added to the command line
	proc proc
}

// StartMemcached starts a memcached for the test and stops it in t.Cleanup;
// args are added to its command line ("-m", "2", "-M": 2 MiB, refuse to
// store when full). The test fails when the binary is missing or the
// server does not start.
func StartMemcached(tb testing.TB, args ...string) *MemcachedServer {
	tb.Helper()
	return startFor(tb, func(dir string) (*MemcachedServer, error) { return launchMemcached(dir, false, args) })
}

// StartMemcachedTLS starts a memcached that accepts only TLS connections
// (-Z), with certificates generated for the test, and stops it in
// t.Cleanup. Connect with TLS.ClientConfig().
func StartMemcachedTLS(tb testing.TB) *MemcachedServer {
	tb.Helper()
	return startFor(tb, LaunchMemcachedTLS)
}

// LaunchMemcached starts a memcached whose log lives in dir, for programs
// without a testing.TB (the benchmark runner). The caller must call Close.
func LaunchMemcached(dir string) (*MemcachedServer, error) {
	return launchMemcached(dir, false, nil)
}

// LaunchMemcachedTLS is LaunchMemcached with TLS, as StartMemcachedTLS.
func LaunchMemcachedTLS(dir string) (*MemcachedServer, error) {
	return launchMemcached(dir, true, nil)
}

func launchMemcached(dir string, withTLS bool, args []string) (*MemcachedServer, error) {
	bin, err := memcachedPath()
	if err != nil {
		return nil, err
	}
	var files *TLSFiles
	if withTLS {
		if files, err = WriteTLS(dir, "localhost"); err != nil {
			return nil, err
		}
	}
	return launchOnFreePort(func(port int) (*MemcachedServer, error) {
		return &MemcachedServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, TLS: files, bin: bin, args: args}, nil
	}, (*MemcachedServer).Start)
}

// memcachedPath finds the binary; Debian installs it in /usr/bin, which is
// normally on PATH, but a minimal PATH may lack it.
func memcachedPath() (string, error) {
	if p, err := exec.LookPath("memcached"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/memcached"); err == nil {
		return "/usr/bin/memcached", nil
	}
	return "", errors.New("harness: memcached not found in PATH; " + memcachedInstall)
}

// Start starts the process again after Stop, on the same port, and waits
// until it answers. Data is not kept.
func (s *MemcachedServer) Start() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "64"}
	if s.TLS != nil {
		args = append(args, "-Z", "-o", "ssl_chain_cert="+s.TLS.ServerCertFile+",ssl_key="+s.TLS.ServerKeyFile)
	}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root") // memcached refuses to run as root otherwise
	}
	args = append(args, s.args...)
	logPath := filepath.Join(s.Dir, "memcached-"+port+".log")
	return s.proc.start(exec.Command(s.bin, args...), procSpec{
		name:   "memcached",
		addr:   s.Addr,
		output: logPath,
		ready: func(ctx context.Context, pid int) error {
			// Ask for the process id after VERSION: another server that took
			// the port first must not pass for ours.
			stats, err := s.Stats(ctx)
			if err != nil {
				return err
			}
			if stats["pid"] != strconv.Itoa(pid) {
				return fmt.Errorf("port %s answered by another process", s.Addr)
			}
			return nil
		},
		tail: func() string { return fileTail(logPath) },
	})
}

// Stop kills the process (SIGKILL, as a crash or a network cut would look to
// clients) and waits for it to exit. The port stays reserved for Start.
func (s *MemcachedServer) Stop() error {
	s.proc.stop()
	return nil
}

// Freeze stops the process (SIGSTOP), as a server stuck in swap or a
// network that drops packets looks to clients: the kernel still accepts
// connections into the listen backlog, but nothing answers. It returns
// once the process has stopped. Thaw resumes it; Stop works on a frozen
// process too. (RedisServer has the same pair.)
func (s *MemcachedServer) Freeze() error { return s.proc.freeze() }

// Thaw lets a frozen process run again (SIGCONT); it answers what it was
// sent meanwhile.
func (s *MemcachedServer) Thaw() error { return s.proc.signal(syscall.SIGCONT) }

// Close stops the process for good. It is safe to call more than once.
func (s *MemcachedServer) Close() error { return s.Stop() }

// Running reports whether the process is up.
func (s *MemcachedServer) Running() bool { return s.proc.running() }

// StartCPU starts measuring the CPU memcached uses (stats rusage_*),
// reported per op as memcached-cpu-ns/op by the meter's Stop.
func (s *MemcachedServer) StartCPU(ctx context.Context) *CPUMeter {
	return StartCPU(func() (time.Duration, bool) {
		stats, err := s.Stats(ctx)
		if err != nil {
			return 0, false
		}
		var total float64
		for _, name := range []string{"rusage_user", "rusage_system"} {
			f, err := strconv.ParseFloat(stats[name], 64)
			if err != nil {
				return 0, false
			}
			total += f
		}
		return time.Duration(total * float64(time.Second)), true
	}, "memcached-cpu-ns/op")
}

// Stats returns the server's "stats" (curr_items, pid, ...) read on a fresh
// connection (TLS when the server uses it).
func (s *MemcachedServer) Stats(ctx context.Context) (map[string]string, error) {
	var tlsConf *tls.Config
	if s.TLS != nil {
		tlsConf = s.TLS.ClientConfig()
	}
	return memcachedStats(ctx, s.Addr, tlsConf)
}

// memcachedStats checks that addr answers "version" with VERSION, then
// returns its "stats".
func memcachedStats(ctx context.Context, addr string, tlsConf *tls.Config) (map[string]string, error) {
	conn, rd, err := dialProbe(ctx, addr, tlsConf)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("version\r\n")); err != nil {
		return nil, err
	}
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "VERSION") {
		return nil, fmt.Errorf("harness: %s answered version with %q", addr, line)
	}
	if _, err := conn.Write([]byte("stats\r\n")); err != nil {
		return nil, err
	}
	stats := make(map[string]string)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimSuffix(line, "\r\n")
		if line == "END" {
			return stats, nil
		}
		f := strings.SplitN(line, " ", 3)
		if len(f) != 3 || f[0] != "STAT" {
			return nil, fmt.Errorf("harness: %s: unexpected stats line %q", addr, line)
		}
		stats[f[1]] = f[2]
	}
}
