package integration

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// configMap is a rules directory laid out as the kubelet lays out a
// mounted ConfigMap: web.yaml -> ..data/web.yaml, ..data -> a timestamped
// directory holding one version of every file.
type configMap struct {
	dir     string
	updates int
	files   map[string]bool
}

func newConfigMap(t *testing.T, dir string, files map[string]string) *configMap {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &configMap{dir: dir}
	c.update(t, files)
	return c
}

// update publishes a new version as the kubelet's AtomicWriter does: a new
// timestamped directory written whole, ..data_tmp linked to it and renamed
// over ..data, links made for new files and removed for files gone, the
// old directory removed. It returns when ..data was swapped: when the
// new version became what a reader of the files sees.
func (c *configMap) update(t *testing.T, files map[string]string) time.Time {
	t.Helper()
	c.updates++
	ts := fmt.Sprintf("..2026_11_24_10_00_00.%09d", c.updates)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, tmp := filepath.Join(c.dir, "..data"), filepath.Join(c.dir, "..data_tmp")
	old, _ := os.Readlink(data)
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		t.Fatal(err)
	}
	swapped := time.Now()
	for name := range files {
		if !c.files[name] {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(c.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name := range c.files {
		if _, ok := files[name]; !ok {
			if err := os.Remove(filepath.Join(c.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.files = map[string]bool{}
	for name := range files {
		c.files[name] = true
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	return swapped
}

// envoyGatewayLayout makes a ConfigMap at base/data/ratelimit/config and
// returns it with the settings that serve it: Envoy Gateway's layout
// (RUNTIME_ROOT=/data, RUNTIME_SUBDIRECTORY=ratelimit, the ConfigMap
// mounted on RUNTIME_APPDIRECTORY config).
func envoyGatewayLayout(t *testing.T, files map[string]string) (*configMap, []string) {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	cm := newConfigMap(t, filepath.Join(data, "ratelimit", "config"), files)
	return cm, []string{"RUNTIME_ROOT=" + data, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config"}
}

// limitOf returns the limit the service applies to (key=value) in domain
// web, or 0 when the call fails.
func limitOf(ctx context.Context, c rlsv3.RateLimitServiceClient, key, value string) uint32 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, request("web", key, value))
	if err != nil {
		return 0
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// waitLimit polls, without pause, until (key=value) gets limit want, and
// returns how long after since it did; it fails after 10 s.
func waitLimit(t *testing.T, c rlsv3.RateLimitServiceClient, key, value string, want uint32, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for limitOf(t.Context(), c, key, value) != want {
		if time.Now().After(deadline) {
			t.Fatalf("limit %d not applied %v after the ConfigMap update", want, time.Since(since))
		}
	}
	return time.Since(since)
}

// TestConfigMapUpdateAppliesWithin2s updates a mounted ConfigMap as the
// kubelet does, with the default RUNTIME_QUIET_PERIOD (1 s), in both
// RUNTIME_WATCH_ROOT modes, with RUNTIME_IGNOREDOTFILES on (Envoy Gateway
// sets it: the files reached through ..data must still load) and off.
// Each update must apply within 2 s of the kubelet's swap of ..data.
func TestConfigMapUpdateAppliesWithin2s(t *testing.T) {
	const within = 2 * time.Second
	rulesWith := func(limit int) string {
		return strings.Replace(webRules, "requests_per_unit: 3", fmt.Sprintf("requests_per_unit: %d", limit), 1)
	}
	for _, watchRoot := range []string{"true", "false"} {
		for _, ignoreDotFiles := range []string{"true", "false"} {
			t.Run("RUNTIME_WATCH_ROOT="+watchRoot+",RUNTIME_IGNOREDOTFILES="+ignoreDotFiles, func(t *testing.T) {
				cm, env := envoyGatewayLayout(t, map[string]string{"web.yaml": rulesWith(3)})
				p := start(t, nil, append(env, "RUNTIME_WATCH_ROOT="+watchRoot, "RUNTIME_IGNOREDOTFILES="+ignoreDotFiles)...)
				c := p.client(t)
				if got := limitOf(t.Context(), c, "user", "cm"); got != 3 {
					t.Fatalf("limit %d at the start, want 3", got)
				}
				var slowest time.Duration
				for _, limit := range []int{4, 5, 6} {
					swapped := cm.update(t, map[string]string{"web.yaml": rulesWith(limit)})
					took := waitLimit(t, c, "user", "cm", uint32(limit), swapped)
					if took > within {
						t.Errorf("limit %d applied %v after the ConfigMap update, want within %v", limit, took, within)
					}
					slowest = max(slowest, took)
				}
				t.Logf("slowest of 3 ConfigMap updates applied %v after the swap of ..data", slowest)
				if s := p.stats(t); s["ratelimit.service.config_load_error"] != 0 {
					t.Errorf("config_load_error = %d, want 0", s["ratelimit.service.config_load_error"])
				}
			})
		}
	}
}

// TestConfigMapReloadsUnderTraffic updates a ConfigMap 100 times while
// clients keep asking. No request may fail, and the counter of the rule
// that never changes must never go back: its cache key is the same in
// every version, so it counts every request across every reload. The rule
// whose limit changes at each reload keeps its key too (the window and
// algorithm stay), so it counts every request as well.
func TestConfigMapReloadsUnderTraffic(t *testing.T) {
	slow(t)
	t.Parallel() // one of the long tests that mostly wait: see TestMain
	const (
		reloads = 100
		workers = 4
		steady  = 1_000_000_000
		moving  = 1_000_000 // plus the version
	)
	rulesV := func(v int) string {
		// A year's window, so that no window ends during the test.
		return fmt.Sprintf("domain: web\ndescriptors:\n"+
			"  - key: user\n    rate_limit: {unit: year, requests_per_unit: %d}\n"+
			"  - key: path\n    rate_limit: {unit: year, requests_per_unit: %d}\n", steady, moving+v)
	}
	cm, env := envoyGatewayLayout(t, map[string]string{"web.yaml": rulesV(0)})
	p := start(t, nil, append(env, "RUNTIME_IGNOREDOTFILES=true")...)
	c := p.client(t)

	// Each traffic request counts one hit on (user=alice) and one on
	// (path=/x); the probe that waits for each reload uses path=/probe,
	// a key of its own.
	traffic := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		request("web", "user", "alice").GetDescriptors()[0],
		request("web", "path", "/x").GetDescriptors()[0],
	}}
	var (
		sent     atomic.Int64
		mu       sync.Mutex
		failures []string // the first few
		failed   int
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failed++
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every request of this worker counts one more hit, so the
			// remaining count it sees only goes down.
			last := uint32(math.MaxUint32)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := c.ShouldRateLimit(ctx, traffic)
				cancel()
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					fail("worker %d: %v, %v", w, resp.GetOverallCode(), err)
					continue
				}
				sent.Add(1)
				remaining := resp.GetStatuses()[0].GetLimitRemaining()
				if remaining >= last {
					fail("worker %d: user=alice has %d remaining after %d: its counter went back", w, remaining, last)
				}
				last = remaining
				// Pace, not an assertion: leave the shared machine's
				// cores to the service too.
				time.Sleep(time.Millisecond)
			}
		}()
	}

	var slowest, total time.Duration
	for v := 1; v <= reloads; v++ {
		swapped := cm.update(t, map[string]string{"web.yaml": rulesV(v)})
		took := waitLimit(t, c, "path", "/probe", uint32(moving+v), swapped)
		slowest, total = max(slowest, took), total+took
	}
	close(stop)
	wg.Wait()
	t.Logf("%d reloads under %d clients (%d requests): each applied %v after the swap on average, %v at most",
		reloads, workers, sent.Load(), total/reloads, slowest)

	if failed > 0 {
		t.Errorf("%d failures during the reloads; the first: %s", failed, strings.Join(failures, "; "))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, traffic)
	if err != nil {
		t.Fatal(err)
	}
	n := uint32(sent.Load()) + 1
	if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint32(steady)-n; got != want {
		t.Errorf("user=alice: %d remaining after %d requests, want %d: the unchanged rule lost counts", got, n, want)
	}
	if got, want := resp.GetStatuses()[1].GetLimitRemaining(), uint32(moving+reloads)-n; got != want {
		t.Errorf("path=/x: %d remaining after %d requests, want %d: the rule whose limit changed lost counts", got, n, want)
	}
	if s := p.stats(t); s["ratelimit.service.config_load_error"] != 0 || s["ratelimit.service.config_load_success"] < reloads+1 {
		t.Errorf("config_load_success %d, config_load_error %d; want at least %d and 0",
			s["ratelimit.service.config_load_success"], s["ratelimit.service.config_load_error"], reloads+1)
	}

	// The binary is built with -race: a race in a reload under traffic
	// shows in its log.
	if strings.Contains(p.logs(), "DATA RACE") {
		t.Errorf("the service reported a data race:\n%s", p.logs())
	}

	// /rlconfig says where the rules in use came from and that no load
	// failed, over the wire.
	r, err := http.Get("http://" + p.debug + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	if !strings.Contains(string(body), "# source: files "+cm.dir+"\n# version: sha256:") ||
		strings.Contains(string(body), "# last load error") ||
		!strings.Contains(string(body), fmt.Sprintf("\nweb.path: unit=YEAR requests_per_unit=%d,", moving+reloads)) {
		t.Errorf("/rlconfig =\n%s\nwant the ConfigMap as source, no load error and the last version", body)
	}
}
