package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// shadowListRules try two stricter limits beside the one in force: its
// twin (the same algorithm and window, a key of its own), and a token
// bucket.
const shadowListRules = `domain: shd
descriptors:
  - key: user
    rate_limits:
      - {unit: day, requests_per_unit: 50}
      - {unit: day, requests_per_unit: 20, shadow_mode: true, name: strict}
      - {unit: hour, requests_per_unit: 10, algorithm: token_bucket, shadow_mode: true, name: bucket}
`

// TestShadowLimitsOverTheWire runs shadow limits through the built binary
// on every store: concurrent requests are admitted exactly as by the
// enforced limit alone, each shadow limit counts exactly what it would have
// refused, in shadow_over_limit, and /rlconfig marks it.
func TestShadowLimitsOverTheWire(t *testing.T) {
	cluster := func(t *testing.T) []string {
		c := harness.StartRedisCluster(t, harness.RedisOptions{})
		return []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=CLUSTER", "REDIS_URL=" + c.URL}
	}
	stores := []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string { return redisEnv(harness.StartRedis(t, harness.RedisOptions{})) }},
		{"redis_cluster", cluster},
		{"redis_cluster_stop_increment", func(t *testing.T) []string {
			return append(cluster(t), "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true")
		}},
		{"memcached", func(t *testing.T) []string { return memcacheEnv(harness.StartMemcached(t)) }},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			p := start(t, map[string]string{"shd.yaml": shadowListRules}, append(s.env(t), "USE_STATSD=false")...)
			c := p.client(t)
			const goroutines, requests = 8, 25
			var admitted atomic.Int64
			var wg sync.WaitGroup
			var failed atomic.Value
			for range goroutines {
				wg.Go(func() {
					for range requests {
						resp, err := c.ShouldRateLimit(callCtx(t), request("shd", "user", "hot"))
						if err != nil {
							failed.Store(err)
							return
						}
						if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if err, _ := failed.Load().(error); err != nil {
				t.Fatal(err)
			}
			const total = goroutines * requests
			if got := admitted.Load(); got != 50 {
				t.Errorf("admitted %d of %d, want exactly the enforced limit's 50", got, total)
			}
			st := p.stats(t)
			for name, want := range map[string]int64{
				"ratelimit.service.rate_limit.shd.user.over_limit":               total - 50,
				"ratelimit.service.rate_limit.shd.user.strict.total_hits":        total,
				"ratelimit.service.rate_limit.shd.user.strict.over_limit":        0,
				"ratelimit.service.rate_limit.shd.user.strict.shadow_over_limit": total - 20,
				"ratelimit.service.rate_limit.shd.user.bucket.shadow_over_limit": total - 10,
				"ratelimit.service.rate_limit.shd.user.bucket.within_limit":      10,
			} {
				if got := st[name]; got != want {
					t.Errorf("%s = %d, want %d", name, got, want)
				}
			}
			res, err := http.Get("http://" + p.debug + "/rlconfig")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if want := "rate_limits: 2/3 strict, shadow: true, name: strict\n"; !strings.Contains(string(body), want) {
				t.Errorf("/rlconfig lacks %q:\n%s", want, body)
			}
		})
	}
}

// shadowRoute limits requests by (user=x-user); misconf_test.go's too.
const shadowRoute = `
              - match: {prefix: /}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-user, descriptor_key: user}`

// envoyShadowRules: 4 an hour in force, 2 an hour tried beside it.
const envoyShadowRules = `domain: shd
descriptors:
  - key: user
    rate_limits:
      - {unit: hour, requests_per_unit: 4}
      - {unit: hour, requests_per_unit: 2, algorithm: sliding_window, shadow_mode: true, name: strict}
`

// TestRealEnvoyShadowLimits: through real Envoy, a shadow limit never
// makes a request 429, and Envoy's access log reads from the filter's
// dynamic metadata which shadow limits would have refused each request,
// without RESPONSE_DYNAMIC_METADATA.
func TestRealEnvoyShadowLimits(t *testing.T) {
	up := startUpstream(t)
	p := start(t, map[string]string{"shd.yaml": envoyShadowRules})
	e, accessLog := startEnvoyHTTP(t, envoyHTTP{Routes: shadowRoute, Filters: rateLimitFilter("shd", "")}, up, p)
	addr := e.listener(t, "http")
	for i := range 5 {
		r := httpGet(t, addr, fmt.Sprintf("/r%d", i+1), map[string]string{"x-user": "envoy"})
		want := http.StatusOK // the shadow limit of 2 refuses none
		if i == 4 {
			want = http.StatusTooManyRequests // the enforced limit of 4
		}
		if r.code != want {
			t.Fatalf("request %d: HTTP %d, want %d", i+1, r.code, want)
		}
	}
	eventually(t, "the access log", 10*time.Second, func() bool {
		b, _ := os.ReadFile(accessLog)
		return strings.Count(string(b), "\n") >= 5
	})
	b, _ := os.ReadFile(accessLog)
	const mark = `"shadowOverLimit":["shd.user.strict"]`
	for i := range 5 {
		path := fmt.Sprintf(" /r%d ", i+1)
		var line string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, path) {
				line = l
			}
		}
		if want := i >= 2; strings.Contains(line, mark) != want {
			t.Errorf("request %d: access log line %q; want %s in it: %t", i+1, line, mark, want)
		}
	}
	if n := e.counter(t, "cluster.upstream.ratelimit.over_limit"); n != 1 {
		t.Errorf("envoy cluster.upstream.ratelimit.over_limit = %d, want 1 (the enforced limit's)", n)
	}
	if got := p.stats(t)["ratelimit.service.rate_limit.shd.user.strict.shadow_over_limit"]; got != 3 {
		t.Errorf("shadow_over_limit = %d, want 3 (requests 3 to 5)", got)
	}
}

// TestLiveViewShadowTwins: the live view marks a shadow limit, shows what
// it would refuse (its Over/s and its keys), and links it and the limit
// in force beside it to each other.
func TestLiveViewShadowTwins(t *testing.T) {
	// A fixed window as the shadow limit: the hits it would refuse are
	// counted, so its key stays over until the window ends.
	rules := strings.Replace(envoyShadowRules, "unit: hour, requests_per_unit: 2, algorithm: sliding_window", "unit: day, requests_per_unit: 2", 1)
	p := start(t, map[string]string{"shd.yaml": rules}, "USE_STATSD=false")
	c := p.client(t)
	ctx, cancelRun := browserTab(t, 30*time.Second)
	problems := watchConsole(ctx)
	poll := func(what, expr string, within time.Duration) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(within), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
			t.Fatalf("waiting %v for %s: %v", within, what, err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+p.debug+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#rules-body tr[data-id="shd.user.strict"]`))); err != nil {
		t.Fatal(err)
	}
	const strict, enforced = `#rules-body tr[data-id="shd.user.strict"]`, `#rules-body tr[data-id="shd.user.hour"]`
	poll("the shadow limit's marks", `(() => {
		const s = document.querySelector('`+strict+`'), e = document.querySelector('`+enforced+`');
		return s.textContent.includes("shadow limit") && s.textContent.includes("shadow of hour") &&
			e.textContent.includes("twin strict") && !e.textContent.includes("shadow limit");
	})()`, 5*time.Second)
	// One request of 3 hits: the limit of 4 admits it, the shadow limit
	// of 2 would refuse it.
	r := request("shd", "user", "eve")
	r.HitsAddend = 3
	if resp, err := c.ShouldRateLimit(callCtx(t), r); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit = %v, %v; want OK", resp, err)
	}
	poll("the key the shadow limit would refuse", `Array.from(document.querySelectorAll("#keys-body tr")).some(r =>
		r.querySelector("td.rule")?.textContent === "shd.user.strict (shadow)" && r.querySelector("td.state")?.textContent === "WOULD REFUSE")`,
		3*time.Second)
	poll("its would-refuse figures", `/ would$/.test(document.querySelector('`+strict+` td.over').textContent)`, 3*time.Second)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(enforced+` a.twin`))); err != nil {
		t.Fatal(err)
	}
	poll("the twin link to show the shadow limit", `document.querySelector('`+strict+`').classList.contains("flash")`, time.Second)
	cancelRun()
	if p := problems(); len(p) > 0 {
		t.Fatalf("the page wrote to the console:\n%s", strings.Join(p, "\n"))
	}
}
