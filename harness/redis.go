package harness

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
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

// redisInstall is appended to every "binary not found" error: a missing
// server is a test failure that says how to fix it, never a skip.
const redisInstall = "install it with `apt-get install -y redis-server` (Debian/Ubuntu; also provides Sentinel) or `brew install redis` (macOS)"

// RedisOptions configures one redis-server process. The zero value is a plain
// server without authentication or TLS.
type RedisOptions struct {
	// Password is the server's requirepass, or the ACL user's password when
	// User is set.
	Password string
	// User, when set, creates an ACL user with Password and full rights and
	// disables the default user, so only User:Password authenticates.
	User string
	// TLS makes the server accept only TLS connections (tls-port), with
	// certificates generated for the test; clients must present the client
	// certificate (tls-auth-clients yes).
	TLS bool
	// Config holds extra redis.conf lines ("name value"), applied last.
	Config []string
}

// RedisServer is a redis-server process on a free 127.0.0.1 port. Its methods
// are safe for concurrent use.
type RedisServer struct {
	// Addr is "127.0.0.1:port"; it stays the same across Stop and Start.
	Addr string
	// Dir holds the configuration, the log and (with TLS) the certificates.
	Dir string
	// TLS holds the certificate files and client configuration when the
	// server was started with RedisOptions.TLS; nil otherwise.
	TLS *TLSFiles

	opts     RedisOptions
	conf     string
	sentinel bool
	proc     proc
}

// StartRedis starts a redis-server for the test and stops it in t.Cleanup.
// The test fails when the binary is missing or the server does not start.
func StartRedis(tb testing.TB, opts RedisOptions) *RedisServer {
	tb.Helper()
	return startFor(tb, func(dir string) (*RedisServer, error) { return LaunchRedis(dir, opts) })
}

// startFor launches a server in a temporary directory of the test and
// closes it in t.Cleanup; the test fails when it does not start.
func startFor[T interface{ Close() error }](tb testing.TB, launch func(dir string) (T, error)) T {
	tb.Helper()
	v, err := launch(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = v.Close() })
	return v
}

// LaunchRedis starts a redis-server whose files live in dir, for programs
// without a testing.TB (the benchmark runner). The caller must call Close.
func LaunchRedis(dir string, opts RedisOptions) (*RedisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("harness: redis-server not found in PATH; %s", redisInstall)
	}
	var files *TLSFiles
	if opts.TLS {
		var err error
		if files, err = WriteTLS(dir, "localhost"); err != nil {
			return nil, err
		}
	}
	return launchRedisProcess(redisProcess{
		dir:  dir,
		opts: opts,
		tls:  files,
		lines: func(port int) []string {
			lines := []string{"port " + strconv.Itoa(port)}
			if opts.TLS {
				lines = []string{
					"port 0",
					"tls-port " + strconv.Itoa(port),
					"tls-cert-file " + files.ServerCertFile,
					"tls-key-file " + files.ServerKeyFile,
					"tls-ca-cert-file " + files.CAFile,
					"tls-auth-clients yes",
				}
			}
			lines = append(lines, redisAuthLines(opts)...)
			return append(lines, opts.Config...)
		},
	})
}

// redisProcess describes one redis-server process for launchRedisProcess.
type redisProcess struct {
	// dir holds the configuration and the logs.
	dir string
	// opts holds the credentials Do authenticates with.
	opts RedisOptions
	// tls is set when the process accepts only TLS connections.
	tls *TLSFiles
	// sentinel runs the process as a Sentinel (redis-server --sentinel).
	sentinel bool
	// lines returns the configuration lines that follow the base ones
	// (writeRedisConf or writeSentinelConf) for a process on port.
	lines func(port int) []string
}

// launchRedisProcess starts p on a free port and waits until it answers.
func launchRedisProcess(p redisProcess) (*RedisServer, error) {
	name, writeConf := "redis", writeRedisConf
	if p.sentinel {
		name, writeConf = "sentinel", writeSentinelConf
	}
	return launchOnFreePort(func(port int) (*RedisServer, error) {
		s := &RedisServer{
			Addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Dir:      p.dir,
			TLS:      p.tls,
			opts:     p.opts,
			sentinel: p.sentinel,
		}
		s.conf = filepath.Join(p.dir, fmt.Sprintf("%s-%d.conf", name, port))
		if err := writeConf(s.conf, p.dir, port, p.lines(port)); err != nil {
			return nil, err
		}
		return s, nil
	}, (*RedisServer).Start)
}

func redisAuthLines(opts RedisOptions) []string {
	switch {
	case opts.User != "":
		return []string{
			"user default off",
			fmt.Sprintf("user %s on >%s ~* &* +@all", opts.User, opts.Password),
		}
	case opts.Password != "":
		return []string{"requirepass " + opts.Password}
	}
	return nil
}

// writeRedisConf writes a configuration that keeps the process small and
// ephemeral: loopback only, no persistence, logs to a file in dir.
func writeRedisConf(path, dir string, port int, extra []string) error {
	lines := []string{
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		"dir " + dir,
		fmt.Sprintf("logfile %s", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port))),
		"loglevel notice",
		`save ""`,
		"appendonly no",
		fmt.Sprintf("dbfilename dump-%d.rdb", port),
	}
	lines = append(lines, extra...)
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// Start starts the process again after Stop, on the same port and with the
// same configuration, and waits until it answers. Data is not kept.
func (s *RedisServer) Start() error {
	args := []string{s.conf}
	if s.sentinel {
		args = append(args, "--sentinel")
	}
	return s.proc.start(exec.Command("redis-server", args...), procSpec{
		name:   "redis-server",
		addr:   s.Addr,
		output: filepath.Join(s.Dir, "stdout-"+filepath.Base(s.conf)+".log"),
		ready: func(ctx context.Context, pid int) error {
			// Ask for the process id, not just PING: another server that
			// took the port first must not pass for ours.
			info, err := s.Do(ctx, "INFO", "server")
			if err != nil {
				return err
			}
			if redisInfoField(info, "process_id") != strconv.Itoa(pid) {
				return fmt.Errorf("port %s answered by another process", s.Addr)
			}
			return nil
		},
		tail: s.logTail,
	})
}

// Stop kills the process (SIGKILL, as a crash or a network cut would look to
// clients) and waits for it to exit. The port and directory stay reserved for
// Start.
func (s *RedisServer) Stop() error {
	s.proc.stop()
	return nil
}

// Freeze stops the process with SIGSTOP and returns once it has stopped:
// it keeps its connections and the kernel still accepts new ones, but
// nothing is answered, as with a Redis stuck in a long command or a machine
// that froze. Thaw resumes it; Stop kills it even frozen.
func (s *RedisServer) Freeze() error { return s.proc.freeze() }

// Thaw resumes a process stopped by Freeze (SIGCONT).
func (s *RedisServer) Thaw() error { return s.proc.signal(syscall.SIGCONT) }

// Close stops the process for good. It is safe to call more than once.
func (s *RedisServer) Close() error { return s.Stop() }

// Running reports whether the process is up.
func (s *RedisServer) Running() bool { return s.proc.running() }

// Port returns the server's TCP port.
func (s *RedisServer) Port() int {
	_, p, _ := net.SplitHostPort(s.Addr)
	n, _ := strconv.Atoi(p)
	return n
}

// Auth returns the credentials in REDIS_AUTH form: "", "password" or "user:password".
func (s *RedisServer) Auth() string {
	if s.opts.User != "" {
		return s.opts.User + ":" + s.opts.Password
	}
	return s.opts.Password
}

// Do sends one command on a fresh connection (authenticated, over TLS when
// the server uses it) and returns the reply: string, int64, []any, nil, or
// an error for a Redis error reply.
func (s *RedisServer) Do(ctx context.Context, args ...string) (any, error) {
	var tlsConf *tls.Config
	if s.TLS != nil {
		tlsConf = s.TLS.ClientConfig()
	}
	return redisDo(ctx, s.Addr, tlsConf, s.opts.User, s.opts.Password, args...)
}

func (s *RedisServer) logTail() string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(s.Dir, "*.log"))
	for _, l := range logs {
		b.WriteString(fileTail(l))
	}
	return b.String()
}

// dialProbe opens a connection for a one-off probe or setup command: TLS
// when tlsConf is set, dialling within a second, and every read and write
// bounded by 5 s or ctx's deadline, whichever comes first.
func dialProbe(ctx context.Context, addr string, tlsConf *tls.Config) (net.Conn, *bufio.Reader, error) {
	d := net.Dialer{Timeout: time.Second}
	var conn net.Conn
	var err error
	if tlsConf != nil {
		td := tls.Dialer{NetDialer: &d, Config: tlsConf}
		conn, err = td.DialContext(ctx, "tcp", addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(5 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	return conn, bufio.NewReader(conn), nil
}

// redisDo is a minimal RESP2 client, enough to probe readiness and to set up
// Sentinel and Cluster without depending on the client under test.
func redisDo(ctx context.Context, addr string, tlsConf *tls.Config, user, password string, args ...string) (any, error) {
	conn, rd, err := dialProbe(ctx, addr, tlsConf)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if password != "" {
		auth := []string{"AUTH", password}
		if user != "" {
			auth = []string{"AUTH", user, password}
		}
		if _, err := redisRoundTrip(conn, rd, auth); err != nil {
			return nil, err
		}
	}
	return redisRoundTrip(conn, rd, args)
}

func redisRoundTrip(w io.Writer, rd *bufio.Reader, args []string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return nil, err
	}
	return redisReadReply(rd)
}

// redisError is an error reply from the server.
type redisError string

func (e redisError) Error() string { return string(e) }

func redisReadReply(rd *bufio.Reader) (any, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("harness: empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, redisError(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			v, err := redisReadReply(rd)
			if err != nil {
				var re redisError
				if !errors.As(err, &re) {
					return nil, err
				}
				v = re
			}
			out[i] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("harness: unexpected reply %q", line)
}

// redisInfoField returns one "name:value" field of an INFO reply.
func redisInfoField(info any, name string) string {
	s, _ := info.(string)
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}

// StartCPU starts measuring the CPU redis-server uses (INFO cpu), reported
// per op as redis-cpu-ns/op by the meter's Report.
func (s *RedisServer) StartCPU(ctx context.Context) *CPUMeter {
	return StartCPU(func() (time.Duration, bool) {
		v, err := s.Do(ctx, "INFO", "cpu")
		info, _ := v.(string)
		if err != nil || info == "" {
			return 0, false
		}
		var total float64
		for _, name := range []string{"used_cpu_user", "used_cpu_sys"} {
			f, err := strconv.ParseFloat(redisInfoField(info, name), 64)
			if err != nil {
				return 0, false
			}
			total += f
		}
		return time.Duration(total * float64(time.Second)), true
	}, "redis-cpu-ns/op")
}
