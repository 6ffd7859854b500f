package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

const liveRules = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5, algorithm: sliding_window}
  - key: api_key
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: token_bucket, burst: 40}
`

// hostileUser is a descriptor value that would run script if the page put
// request data into its markup.
const hostileUser = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>`

// chromium returns the path of a Chromium (or Chrome) binary, failing the
// test with how to install one when there is none: this test is part of
// make test, which installs it (scripts/ensure-servers.sh).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("Chromium not found: the live view's browser test needs it. Install it with 'apt-get install chromium' " +
		"(Debian; make test does it through scripts/ensure-servers.sh) or put chromium on PATH")
	return ""
}

// TestLiveViewInBrowser loads the live view of the running service in
// headless Chromium, on the memory store and on Redis: the page loads
// without a console error, shows the service's rules, its figures move
// with traffic, a key pushed over its limit shows in the top keys within
// 2 s, as text (a descriptor value holding markup runs nothing), the
// page works from the keyboard, and it shows a failed reload and then a
// good one's new limit. With LIVE_VIEW_SCREENSHOT=FILE it saves a
// screenshot of the memory run there (docs/ui.png is made so).
func TestLiveViewInBrowser(t *testing.T) {
	slow(t)
	busyParallel(t)
	alloc, cancel := chromedp.NewExecAllocator(t.Context(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000))...)
	defer cancel()
	browser, cancel := chromedp.NewContext(alloc)
	defer cancel()
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	for _, tt := range []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string { return redisEnv(harness.StartRedis(t, harness.RedisOptions{})) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			shot := ""
			if tt.name == "memory" {
				shot = os.Getenv("LIVE_VIEW_SCREENSHOT")
			}
			testLiveView(t, browser, tt.name, shot, tt.env(t))
		})
	}
}

func testLiveView(t *testing.T, browser context.Context, backend, shot string, env []string) {
	p := start(t, map[string]string{"live.yaml": liveRules}, append(env, "USE_STATSD=false", "RUNTIME_QUIET_PERIOD=100ms")...)
	c := p.client(t)
	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	within := 30 * time.Second
	if shot != "" {
		within += time.Minute // the traffic of the screenshot
	}
	ctx, cancelRun := context.WithTimeout(tab, within)
	defer cancelRun()
	if err := chromedp.Do(ctx); err != nil { // opens the tab
		t.Fatal(err)
	}
	problems := watchConsole(ctx)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string, v any) {
		t.Helper()
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr))
		if err != nil {
			t.Fatalf("evaluating %s: %v", expr, err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("decoding %s: %v", raw, err)
		}
	}
	poll := func(what, expr string, within time.Duration) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(within), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
			t.Fatalf("waiting %v for %s: %v", within, what, err)
		}
	}

	// The page shows the rules the service serves, from its own API.
	run("loading the page", chromedp.Navigate("http://"+p.debug+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#rules-body tr[data-id="web.user"]`)))
	var shown, served []string
	eval(`Array.from(document.querySelectorAll("#rules-body tr[data-id]"), r => r.dataset.id)`, &shown)
	var rules struct {
		Domains []struct {
			Rules []struct{ ID string }
		}
	}
	getJSON(t, "http://"+p.debug+"/api/v1/rules", &rules)
	for _, d := range rules.Domains {
		for _, r := range d.Rules {
			served = append(served, r.ID)
		}
	}
	want := []string{"web.api_key", "web.path_/login.remote_address", "web.user"}
	if !slices.Equal(shown, want) || !slices.Equal(served, want) {
		t.Fatalf("rules shown %q, served %q, want %q", shown, served, want)
	}
	poll("the store's backend", fmt.Sprintf(`document.querySelector("#store dd")?.textContent === %q`, backend), 5*time.Second)

	// Traffic moves the figures; the hostile user goes over its limit of 3.
	for range 2 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "alice")); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", hostileUser)); err != nil {
			t.Fatal(err)
		}
	}
	over := time.Now()
	poll("the over-limit key in the top keys",
		fmt.Sprintf(`Array.from(document.querySelectorAll("#keys-body tr:is(.is-over, .is-full) td.key .v"), e => e.textContent).includes(%q)`, hostileUser),
		2*time.Second)
	t.Logf("%s: the key over its limit showed %v after its request", backend, time.Since(over).Round(time.Millisecond))
	poll("the rule's figures to move",
		`/peak [1-9]/.test(document.querySelector('#rules-body tr[data-id="web.user"] canvas').getAttribute("aria-label"))`, 3*time.Second)
	var pwned struct {
		Pwned    any `json:"pwned"`
		Elements int `json:"elements"`
	}
	eval(`({pwned: window.__pwned ?? null, elements: document.querySelectorAll("#keys-body img, #keys-body script").length})`, &pwned)
	if pwned.Pwned != nil || pwned.Elements != 0 {
		t.Fatalf("a descriptor value became markup: %+v", pwned)
	}

	// Requests that matched nothing show under "Matched nothing", as
	// text: a domain no rule names (one holding markup) and a key no rule
	// has.
	for _, r := range []*rlsv3.RateLimitRequest{request(hostileUser, "user", "alice"), request("web", "usr", "bob")} {
		if _, err := c.ShouldRateLimit(callCtx(t), r); err != nil {
			t.Fatal(err)
		}
	}
	poll("the unknown domain and the unmatched key", fmt.Sprintf(`(() => {
		const cells = Array.from(document.querySelectorAll("#unmatched-body td.key"), e => e.textContent);
		return cells.includes(%q) && cells.includes("usr") && cells.includes("usr=bob");
	})()`, hostileUser), 3*time.Second)
	eval(`({pwned: window.__pwned ?? null, elements: document.querySelectorAll("#unmatched-body img, #unmatched-body script").length})`, &pwned)
	if pwned.Pwned != nil || pwned.Elements != 0 {
		t.Fatalf("a domain became markup: %+v", pwned)
	}

	// Without a mouse: / focuses the filter, typing filters the rules, Esc
	// clears it; p pauses.
	run("filtering from the keyboard", chromedp.KeyEvent("/"))
	poll("the filter to have focus", `document.activeElement.id === "filter"`, time.Second)
	run("typing a filter", chromedp.KeyEvent("login"))
	poll("the rules to filter", `Array.from(document.querySelectorAll("#rules-body tr[data-id]")).filter(r => !r.hidden).map(r => r.dataset.id).join() === "web.path_/login.remote_address"`, time.Second)
	run("clearing the filter", chromedp.KeyEvent(kb.Escape))
	poll("the rules to come back", `Array.from(document.querySelectorAll("#rules-body tr[data-id]")).every(r => !r.hidden)`, time.Second)
	run("pausing", chromedp.KeyEvent("p"))
	poll("the pause", `document.getElementById("pause").getAttribute("aria-pressed") === "true"`, time.Second)
	run("resuming", chromedp.KeyEvent("p"))

	if backend == "memory" {
		// Did my change take effect? A failed reload shows as a banner
		// while the rules in use stay; a good one shows its new limit.
		writeRules(t, p.root, "live.yaml", "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 4}\n")
		poll("the failed reload's banner", `!document.getElementById("load-error").hidden && document.getElementById("load-error").textContent.includes("fortnight")`, 10*time.Second)
		writeRules(t, p.root, "live.yaml", strings.Replace(liveRules, "requests_per_unit: 3}", "requests_per_unit: 4}", 1))
		poll("the new limit", `document.getElementById("load-error").hidden && document.querySelector('#rules-body tr[data-id="web.user"] td:nth-child(2)').textContent === "4 / min"`, 10*time.Second)
	}

	if shot != "" {
		screenshot(t, ctx, c, shot)
	}
	cancelRun()
	if p := problems(); len(p) > 0 {
		t.Fatalf("the page wrote to the console:\n%s", strings.Join(p, "\n"))
	}
}

// browserTab starts Chromium with a tab open, for at most within, and
// returns the tab's context and its cancel (the caller may end it early:
// watchConsole's results wait for that); both end with the test.
func browserTab(t *testing.T, within time.Duration) (context.Context, context.CancelFunc) {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(t.Context(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000))...)
	t.Cleanup(cancelAlloc)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(cancelTab)
	ctx, cancel := context.WithTimeout(tab, within)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // starts Chromium, opens the tab
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx, cancel
}

// watchConsole collects the errors and exceptions a tab writes to its
// console until ctx ends; the function it returns waits for that end
// (the caller cancels ctx first) and returns them.
func watchConsole(ctx context.Context) func() []string {
	var problems []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				problems = append(problems, m.String())
			}
		}
	}()
	return func() []string {
		<-done
		return problems
	}
}

// screenshot sends 40 s of traffic in waves, so that the figures show
// something, and saves the page to file.
func screenshot(t *testing.T, ctx context.Context, c rlsv3.RateLimitServiceClient, file string) {
	t.Helper()
	end := time.Now().Add(40 * time.Second)
	for i := 0; time.Now().Before(end); i++ {
		reqs := []*rlsv3.RateLimitRequest{
			request("web", "user", fmt.Sprint("user-", i%5)),
			request("web", "api_key", "team-a"),
		}
		if i%3 == 0 {
			reqs = append(reqs, request("web", "path", "/login", "remote_address", fmt.Sprint("203.0.113.", i%4)))
		}
		if i%10 == 0 {
			reqs = append(reqs, request("web", "user", hostileUser))
		}
		for _, r := range reqs {
			if _, err := c.ShouldRateLimit(callCtx(t), r); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Duration(15+25*(1+math.Sin(float64(i)/40))) * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot written to %s", file)
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
