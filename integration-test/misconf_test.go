package integration

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/service"
)

// Common mistakes leave a line in the log that names their fix (issue
// 34, item 4); this file holds the tests of the built binary's lines.

const misconfRules = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n"

// linesWith returns p's log lines that hold every one of substrs.
func (p *proc) linesWith(substrs ...string) []string {
	var out []string
	for _, line := range strings.Split(p.logs(), "\n") {
		ok := line != ""
		for _, s := range substrs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// TestUnmatchedLoggedAtDebug: with LOG_LEVEL=debug, a flood of requests
// for an unknown domain, and of descriptors no rule matches, each leave a
// line naming what to fix, one a second at most; at the default level,
// none.
func TestUnmatchedLoggedAtDebug(t *testing.T) {
	for _, level := range []string{"debug", "warn"} {
		t.Run(level, func(t *testing.T) {
			p := start(t, map[string]string{"web.yaml": misconfRules}, "LOG_LEVEL="+level)
			c := p.client(t)
			start := time.Now()
			for range 200 {
				if _, err := c.ShouldRateLimit(callCtx(t), request("wbe", "user", "alice")); err != nil {
					t.Fatal(err)
				}
				if _, err := c.ShouldRateLimit(callCtx(t), request("web", "usr", "alice")); err != nil {
					t.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			domain := p.linesWith("unknown domain", "domain=wbe", "add the domain to the rules")
			desc := p.linesWith("descriptor matches no rule", "domain=web", `descriptor="usr=alice"`)
			if level != "debug" {
				if len(domain)+len(desc) != 0 {
					t.Errorf("at LOG_LEVEL=%s: %q %q, want no line", level, domain, desc)
				}
				return
			}
			// One a second at most: the flood took elapsed.
			most := int(elapsed/time.Second) + 1
			for what, got := range map[string][]string{"unknown domain": domain, "no rule": desc} {
				if len(got) < 1 || len(got) > most {
					t.Errorf("%s: %d lines for 200 requests in %v, want 1 to %d:\n%s", what, len(got), elapsed, most, p.logs())
				}
			}
		})
	}
}

// TestHTTP1OnGRPCPortWarned: at the default LOG_LEVEL, an HTTP/1.1 request
// on the gRPC port leaves one warning that names Envoy's fix, however many
// come at once; so does real Envoy whose cluster of the service was left
// at HTTP/1.1 (a cluster's default).
func TestHTTP1OnGRPCPortWarned(t *testing.T) {
	const warning = "speaks HTTP/1.x"
	fix := []string{"explicit_http_config: {http2_protocol_options: {}}", "typed_extension_protocol_options", "http2_protocol_options: {}"}
	t.Run("http1_request", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": misconfRules}, "LOG_LEVEL=warn")
		began := time.Now()
		post := func() {
			// Any answer but a gRPC one: the connection is closed.
			resp, err := http.Post("http://"+p.grpc+"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "application/grpc", strings.NewReader(""))
			if err == nil {
				resp.Body.Close()
				t.Errorf("HTTP/1.1 on the gRPC port answered %d, want the connection closed", resp.StatusCode)
			}
		}
		post()
		eventually(t, "the warning", 10*time.Second, func() bool { return len(p.linesWith(warning)) > 0 })
		line := p.linesWith(warning)[0]
		for _, f := range append(fix, "level=WARN", "suppressed=0") {
			if !strings.Contains(line, f) {
				t.Errorf("warning %q lacks %q", line, f)
			}
		}
		for range 50 {
			post()
		}
		if got, most := len(p.linesWith(warning)), int(time.Since(began)/time.Second)+1; got > most {
			t.Errorf("51 HTTP/1.1 requests logged %d warnings, want at most %d (one a second)", got, most)
		}
	})
	t.Run("envoy_http1_cluster", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": misconfRules}, "LOG_LEVEL=warn")
		up := startUpstream(t)
		e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: shadowRoute, Filters: rateLimitFilter("web", ""), RLS: httpCluster("ratelimit", p.grpc)}, up, p)
		httpGet(t, e.listener(t, "http"), "/", map[string]string{"x-user": "alice"})
		eventually(t, "the warning", 10*time.Second, func() bool { return len(p.linesWith(warning)) > 0 })
		line := p.linesWith(warning)[0]
		for _, f := range fix {
			if !strings.Contains(line, f) {
				t.Errorf("warning %q lacks %q", line, f)
			}
		}
	})
}

// TestNoRulesWarnedAtStart: at the default LOG_LEVEL, a rules directory
// without rule files leaves one warning besides the startup line, naming
// the directory, the settings that make it and the file there that does
// not load.
func TestNoRulesWarnedAtStart(t *testing.T) {
	p := start(t, map[string]string{"ratelimit.json": "{}"}, "LOG_LEVEL=warn")
	got := p.linesWith("no rules: the rules directory holds no rule file")
	if len(got) != 1 {
		t.Fatalf("%d warnings of no rules, want 1:\n%s", len(got), p.logs())
	}
	for _, want := range []string{"level=WARN", "dir=" + filepath.Join(p.root, "config"), "RUNTIME_ROOT=" + p.root,
		"RUNTIME_SUBDIRECTORY=", "RUNTIME_APPDIRECTORY=config", "not_rule_files=[ratelimit.json]"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("warning %q lacks %q", got[0], want)
		}
	}
}

// TestRedisAddressOnUnixSocketRefused: REDIS_URL=host:port with the
// anchor's default REDIS_SOCKET_TYPE (unix) stops the start with an error
// that names REDIS_SOCKET_TYPE=tcp, instead of failing every dial.
func TestRedisAddressOnUnixSocketRefused(t *testing.T) {
	p := launchWith(t, launchOpts{noWait: true}, map[string]string{"web.yaml": misconfRules},
		"BACKEND_TYPE=redis", "REDIS_URL=127.0.0.1:6379")
	if code := p.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("exit code 0, want a failed start:\n%s", p.logs())
	}
	if !strings.Contains(p.logs(), "REDIS_URL") || !strings.Contains(p.logs(), "set REDIS_SOCKET_TYPE=tcp") {
		t.Errorf("log does not name REDIS_SOCKET_TYPE=tcp:\n%s", p.logs())
	}
}

// TestPortsInUseNamedAtStart: with two ports in use (PORT and
// DEBUG_PORT), the service exits non-zero and its error names both
// settings, each with the fix.
func TestPortsInUseNamedAtStart(t *testing.T) {
	var ports []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	p := launchWith(t, launchOpts{noWait: true}, map[string]string{"web.yaml": misconfRules},
		"PORT="+ports[0], "DEBUG_PORT="+ports[1])
	if code := p.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("exit code 0, want a failed start:\n%s", p.logs())
	}
	for _, want := range []string{"PORT=" + ports[0], "set PORT to a free port", "DEBUG_PORT=" + ports[1], "set DEBUG_PORT to a free port"} {
		if !strings.Contains(p.logs(), want) {
			t.Errorf("log lacks %q:\n%s", want, p.logs())
		}
	}
}

// explainRules have a fixed window and a sliding window, whose stores'
// reads differ (a GET, a script).
const explainRules = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: page
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window}
`

// TestExplainEndpoint: on every store, the debug listener's
// /api/v1/explain, with the live view off too, says of a request which
// rule each descriptor matched or why none did, with the counters now,
// read without counting (the next decision is as if it had not been
// asked), and the answer the request would get; ratelimit-check -explain
// -debug_addr prints it and exits with that answer.
func TestExplainEndpoint(t *testing.T) {
	for _, s := range []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string { return redisEnv(harness.StartRedis(t, harness.RedisOptions{})) }},
		{"memcached", func(t *testing.T) []string { return memcacheEnv(harness.StartMemcached(t)) }},
	} {
		t.Run(s.name, func(t *testing.T) {
			testExplainEndpoint(t, s.name == "memory", append(s.env(t), "LIVE_VIEW_ENABLED=false")...)
		})
	}
}

func testExplainEndpoint(t *testing.T, withChecker bool, env ...string) {
	p := start(t, map[string]string{"web.yaml": explainRules}, env...)
	c := p.client(t)
	for range 2 {
		for _, r := range []*rlsv3.RateLimitRequest{request("web", "user", "alice"), request("web", "page", "home")} {
			if _, err := c.ShouldRateLimit(callCtx(t), r); err != nil {
				t.Fatal(err)
			}
		}
	}
	body := `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"alice"}]},{"entries":[{"key":"page","value":"home"}]},{"entries":[{"key":"usr","value":"bob"}]}]}`
	explain := func() service.Explanation {
		t.Helper()
		resp, err := http.Post("http://"+p.debug+"/api/v1/explain", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var x service.Explanation
		if err := json.NewDecoder(resp.Body).Decode(&x); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /api/v1/explain: %s, %v", resp.Status, err)
		}
		return x
	}
	for range 5 {
		explain()
	}
	x := explain()
	if len(x.Descriptors) != 3 || x.Counters != "read" || x.OverallCode != "OK" {
		t.Fatalf("explanation: %+v", x)
	}
	for i, rule := range []string{"web.user", "web.page"} {
		if d := x.Descriptors[i]; d.Rule != rule || len(d.Limits) != 1 || d.Limits[0].Remaining == nil || *d.Limits[0].Remaining != 1 || d.Code != "OK" {
			t.Errorf("%s after 2 of 3: %+v", rule, d)
		}
	}
	if d := x.Descriptors[2]; !strings.Contains(d.Why, `no rule has the key "usr"`) || d.Code != "OK" {
		t.Errorf("usr=bob: %+v", d)
	}
	for _, r := range []*rlsv3.RateLimitRequest{request("web", "user", "alice"), request("web", "page", "home")} {
		resp, err := c.ShouldRateLimit(callCtx(t), r)
		if err != nil || resp.GetStatuses()[0].GetLimitRemaining() != 0 || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("the third call after six explanations: %v %v, want OK with 0 left (explaining counts nothing)", resp, err)
		}
	}
	if !withChecker {
		return
	}
	var stdout, stderr strings.Builder
	cmd := exec.Command(checkerBinary(t), "-explain", body, "-debug_addr", p.debug)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if code := exitCode(cmd.Run()); code != 1 {
		t.Fatalf("ratelimit-check -explain: exit %d, want 1 (over the limit now)\n%s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"user=alice matched user by key (web.yaml:3)", "now 0 left", "answer: OVER_LIMIT", `no rule has the key "usr"`, "overall: OVER_LIMIT"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("ratelimit-check output lacks %q:\n%s", want, stdout.String())
		}
	}
	index, err := http.Get("http://" + p.debug + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer index.Body.Close()
	if b, _ := io.ReadAll(index.Body); !strings.Contains(string(b), "/api/v1/explain") {
		t.Errorf("the debug listener's index does not list /api/v1/explain:\n%s", b)
	}
}
