package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// The shipped Envoy configs run in real Envoy, with the built service
// behind them on Redis and an upstream of the test's. Only addresses and
// ports are rewritten: the admin and the listeners bind 127.0.0.1 port 0,
// and each cluster's endpoint becomes the process the test started for it.

// rewriteBootstrap returns the bootstrap at path with the admin and every
// listener on 127.0.0.1 port 0, and the endpoints of each cluster named in
// clusters at that address (harness.RewriteBootstrap). A cluster not in clusters
// fails the test: an example must not call anything the test does not
// stand up.
func rewriteBootstrap(t *testing.T, path string, clusters map[string]string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := harness.RewriteBootstrap(data, clusters)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// dig walks nested YAML maps.
func dig(t *testing.T, m map[string]any, path ...string) map[string]any {
	t.Helper()
	for _, k := range path {
		next, ok := m[k].(map[string]any)
		if !ok {
			t.Fatalf("no map at %q of %v", k, path)
		}
		m = next
	}
	return m
}

// list is a YAML list of maps.
func list(t *testing.T, v any) []map[string]any {
	t.Helper()
	items, ok := v.([]any)
	if !ok {
		t.Fatalf("not a list: %T", v)
	}
	out := make([]map[string]any, len(items))
	for i, it := range items {
		if out[i], ok = it.(map[string]any); !ok {
			t.Fatalf("list item %d is %T, not a map", i, it)
		}
	}
	return out
}

// redisCounts reads Redis as the service left it.
type redisCounts struct {
	c *goredis.Client
}

func newRedisCounts(t *testing.T, r *harness.RedisServer) redisCounts {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	t.Cleanup(func() { c.Close() })
	return redisCounts{c: c}
}

func (rc redisCounts) flush(t *testing.T) {
	t.Helper()
	if err := rc.c.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
}

// fixedWindowSum is the sum of the fixed-window counters whose key starts
// with prefix and goes on with the window's start time: the hits counted
// for that descriptor whichever windows they fell in (the anchor's key,
// prefix + the window's start in seconds).
func (rc redisCounts) fixedWindowSum(t *testing.T, prefix string) int64 {
	t.Helper()
	keys, err := rc.c.Keys(t.Context(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, k := range keys {
		if _, err := strconv.ParseInt(strings.TrimPrefix(k, prefix), 10, 64); err != nil {
			continue // a longer descriptor's key, or another algorithm's
		}
		n, err := rc.c.Get(t.Context(), k).Int64()
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		sum += n
	}
	return sum
}

// awaitWindowRoom returns at once when more than need is left of the
// current window of length w, and otherwise waits for the next window to
// begin: a test that expects N admitted in one window must not straddle two.
func awaitWindowRoom(t *testing.T, w, need time.Duration) {
	t.Helper()
	now := time.Now()
	left := now.Truncate(w).Add(w).Sub(now)
	if left > need {
		return
	}
	t.Logf("waiting %v for the next %v window", left.Round(time.Millisecond), w)
	select {
	case <-time.After(left + 10*time.Millisecond):
	case <-t.Context().Done():
	}
}

// envoyHTTPCase is a request through Envoy and what the rules say of it:
// admitted times 200, then 429.
type envoyHTTPCase struct {
	name     string
	path     string
	headers  map[string]string
	admitted int
	// rules are the rules (FullKey) the request's descriptors land on.
	rules []string
	// counted are fixed-window key prefixes and the hits each must hold
	// after admitted+1 requests (a fixed window counts a refused hit too).
	counted map[string]int64
}

// driveEnvoy sends c's request admitted+1 times: 200s, then a 429 from the
// service (x-envoy-ratelimited), and checks the upstream saw the 200s only
// and the service counted the hits under c.rules and no other rule.
func driveEnvoy(t *testing.T, p *proc, addr string, up *upstream, c envoyHTTPCase) {
	t.Helper()
	before, _ := up.seen()
	hitsBefore := ruleHits(t, p)
	defer func() {
		var got []string
		for rule, n := range ruleHits(t, p) {
			if n > hitsBefore[rule] {
				got = append(got, rule)
			}
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(c.rules))
		if !slices.Equal(got, want) {
			t.Errorf("%s: Envoy's descriptors landed on the rules %q, want %q", c.name, got, want)
		}
	}()
	for i := range c.admitted + 1 {
		r := httpGet(t, addr, c.path, c.headers)
		want := 200
		if i == c.admitted {
			want = 429
		}
		if r.code != want {
			t.Fatalf("%s: request %d of %d: HTTP %d %q, want %d", c.name, i+1, c.admitted+1, r.code, r.body, want)
		}
		if got := r.header.Get("x-envoy-ratelimited"); (want == 429) != (got == "true") {
			t.Errorf("%s: request %d: x-envoy-ratelimited %q on HTTP %d", c.name, i+1, got, r.code)
		}
	}
	if after, _ := up.seen(); after-before != c.admitted {
		t.Errorf("%s: the upstream got %d requests, want %d", c.name, after-before, c.admitted)
	}
}

// TestRealEnvoyExamples runs examples/envoy/envoy.yaml and envoy-tcp.yaml
// in Envoy, with the service started as docker-compose.yml starts it
// (its environment, Redis, the demo rules), and checks each route's
// sample requests: 200 up to the rule's limit, 429 after it, and the
// counts the fixed-window rules left in Redis.
func TestRealEnvoyExamples(t *testing.T) {
	compose := loadCompose(t)
	svc := compose.Services["ratelimit"]
	bootstrap := filepath.Join("..", compose.Services["envoy"].mount("/etc/envoy/envoy.yaml"))
	r := harness.StartRedis(t, harness.RedisOptions{})
	counts := newRedisCounts(t, r)
	var env []string
	for k, v := range svc.Environment {
		switch k {
		case "REDIS_URL":
			v = r.Addr
		case "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY":
			continue // the test's own folder
		}
		env = append(env, k+"="+v)
	}
	rulesFile := readRules(t, demoRules)
	p := start(t, map[string]string{rulesFile.Name: string(rulesFile.Data)}, env...)
	up := startUpstream(t)

	t.Run("http", func(t *testing.T) {
		e := startEnvoy(t, rewriteBootstrap(t, bootstrap, map[string]string{"upstream": up.addr, "ratelimit": p.grpc}))
		addr := e.listener(t, "ingress")
		// Every request comes from 127.0.0.1, so each case starts from an
		// empty Redis: (remote_address=127.0.0.1) is shared by all.
		cases := []envoyHTTPCase{
			// (path=/login)(remote_address): 2 a minute (sliding log);
			// (remote_address): 5 a minute (token bucket).
			{name: "login", path: "/login", admitted: 2,
				rules: []string{"demo.path_/login.remote_address", "demo.remote_address"}},
			// (api_key), (generic_key=api)(plan=free)(api_key),
			// (remote_address): the address's 5 a minute decides. The
			// fixed windows count all six hits.
			{name: "api_free_plan", path: "/api/items", headers: map[string]string{"x-api-key": "key-free", "x-plan": "free"}, admitted: 5,
				rules:   []string{"demo.api_key", "demo.generic_key_api.plan_free.api_key", "demo.remote_address"},
				counted: map[string]int64{"demo_api_key_key-free_": 6, "demo_generic_key_api_plan_free_api_key_key-free_": 6}},
			{name: "api_pro_plan", path: "/api/items", headers: map[string]string{"x-api-key": "key-pro", "x-plan": "pro"}, admitted: 5,
				rules:   []string{"demo.api_key", "demo.generic_key_api.plan_pro.api_key", "demo.remote_address"},
				counted: map[string]int64{"demo_api_key_key-pro_": 6, "demo_generic_key_api_plan_pro_api_key_key-pro_": 6}},
			{name: "api_without_key", path: "/api/items", admitted: 5, rules: []string{"demo.remote_address"}},
			{name: "anything_else", path: "/index.html", admitted: 5, rules: []string{"demo.remote_address"}},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				counts.flush(t)
				driveEnvoy(t, p, addr, up, c)
				for prefix, want := range c.counted {
					if got := counts.fixedWindowSum(t, prefix); got != want {
						t.Errorf("Redis %s*: %d hits, want %d", prefix, got, want)
					}
				}
			})
		}
		if n := e.counter(t, "cluster.upstream.ratelimit.over_limit"); n != int64(len(cases)) {
			t.Errorf("envoy cluster.upstream.ratelimit.over_limit = %d, want %d", n, len(cases))
		}
		if n := e.counter(t, "cluster.upstream.ratelimit.error"); n != 0 {
			t.Errorf("envoy cluster.upstream.ratelimit.error = %d, want 0", n)
		}
	})

	t.Run("tcp", func(t *testing.T) {
		echo := startEcho(t)
		tcpBootstrap := filepath.Join(envoyExamples, "envoy-tcp.yaml")
		e := startEnvoy(t, rewriteBootstrap(t, tcpBootstrap, map[string]string{"upstream": echo, "ratelimit": p.grpc}))
		addr := e.listener(t, "tcp_echo")
		counts.flush(t)
		// (listener=tcp_echo): 10 connections a minute, a fixed window.
		awaitWindowRoom(t, time.Minute, 5*time.Second)
		for i := range 11 {
			echoed := echoOnce(t, addr, fmt.Sprintf("hello %d", i))
			if want := i < 10; echoed != want {
				t.Fatalf("connection %d: echoed %v, want %v", i+1, echoed, want)
			}
		}
		if got := counts.fixedWindowSum(t, "demo_listener_tcp_echo_"); got != 11 {
			t.Errorf("Redis ratelimit_demo_listener_tcp_echo_*: %d, want 11", got)
		}
		if n := e.counter(t, "ratelimit.tcp_echo.over_limit"); n != 1 {
			t.Errorf("envoy ratelimit.tcp_echo.over_limit = %d, want 1", n)
		}
	})
	everyRuleReached(t, p, parseRules(t, rulesFile), "examples/envoy")
}

// ruleHits are the service's total_hits per rule (its FullKey).
func ruleHits(t *testing.T, p *proc) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for name, n := range p.stats(t) {
		if rule, ok := strings.CutPrefix(name, stats.RulePrefix); ok {
			if rule, ok := strings.CutSuffix(rule, ".total_hits"); ok {
				out[rule] = n
			}
		}
	}
	return out
}

// everyRuleReached fails for each rule of cfg that got no hit: a rule no
// action of the example reaches is dead weight or a typo.
func everyRuleReached(t *testing.T, p *proc, cfg *rules.Config, example string) {
	t.Helper()
	hits := ruleHits(t, p)
	for _, l := range cfg.Limits() {
		if hits[l.FullKey] == 0 {
			t.Errorf("rule %s (%s) is reached by no request through %s", l.FullKey, l.Source, example)
		}
	}
}

// startEcho is a TCP echo server, the upstream of the network filter.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echoOnce connects through Envoy, sends a line and reports whether it
// came back; Envoy closes a connection over the limit before any byte.
func echoOnce(t *testing.T, addr, line string) bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return false
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && got == line+"\n"
}
