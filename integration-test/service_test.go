package integration

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const webRules = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
`

func TestDecisionsOverTheWire(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": webRules})
	c := p.client(t)
	for i := 1; i <= 4; i++ {
		resp, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "alice"))
		if err != nil {
			t.Fatal(err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 4 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.GetOverallCode() != want {
			t.Errorf("grpc call %d: %v, want %v", i, resp.GetOverallCode(), want)
		}
	}
	// /json shares the counters with gRPC.
	code, body := p.postJSON(t, `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`)
	if code != 429 || !strings.Contains(body, "OVER_LIMIT") {
		t.Errorf("/json after the limit: %d %s, want 429", code, body)
	}
	code, _ = p.postJSON(t, `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`)
	if code != 200 {
		t.Errorf("/json for another user: %d, want 200", code)
	}
	if _, err := c.ShouldRateLimit(callCtx(t), &rlsv3.RateLimitRequest{Domain: "web"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no descriptors: %v, want InvalidArgument", err)
	}
}

func TestInvalidRulesAtStartupExitNonZero(t *testing.T) {
	p := launch(t, map[string]string{
		"ok.yaml":  webRules,
		"bad.yaml": "domain: api\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
	})
	if code := p.wait(t, 20*time.Second); code == 0 {
		t.Fatal("service started with invalid rules")
	}
	if logs := p.logs(); !strings.Contains(logs, "bad.yaml:4") || !strings.Contains(logs, "fortnight") {
		t.Errorf("startup error does not name file, line and problem:\n%s", logs)
	}
}

func TestMalformedSettingExitNonZero(t *testing.T) {
	p := launch(t, map[string]string{"web.yaml": webRules}, "BACKEND_TYPE=foo")
	if code := p.wait(t, 20*time.Second); code == 0 {
		t.Fatal("service started with BACKEND_TYPE=foo")
	}
	if !strings.Contains(p.logs(), "BACKEND_TYPE") {
		t.Errorf("error does not name BACKEND_TYPE:\n%s", p.logs())
	}
}

// TestJSONLogsFromTheFirstLine checks that with LOG_FORMAT=JSON (any case)
// every line the service prints, the error about a bad setting included,
// is JSON with envoyproxy/ratelimit's keys and value formats.
func TestJSONLogsFromTheFirstLine(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": webRules}, "LOG_FORMAT=JSON", "LOG_LEVEL=debug")
	if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "log")); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	bad := launch(t, map[string]string{"web.yaml": webRules}, "LOG_FORMAT=Json", "PORT=abc")
	bad.wait(t, 20*time.Second)
	levels := map[string]bool{"debug": true, "info": true, "warning": true, "error": true}
	for _, out := range []string{p.logs(), bad.logs()} {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) == 0 || lines[0] == "" {
			t.Fatal("no log lines")
		}
		for _, l := range lines {
			var line map[string]any
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Errorf("not JSON: %q", l)
				continue
			}
			ts, _ := line["@timestamp"].(string)
			if parsed, err := time.Parse(time.RFC3339Nano, ts); err != nil || parsed.Format(time.RFC3339Nano) != ts {
				t.Errorf("@timestamp %q is not RFC 3339 with nanoseconds: %q", ts, l)
			}
			if msg, _ := line["@message"].(string); msg == "" {
				t.Errorf("no @message: %q", l)
			}
			if lv, _ := line["level"].(string); !levels[lv] {
				t.Errorf("level %q is not one of logrus's names: %q", lv, l)
			}
			for _, k := range []string{"time", "msg"} {
				if _, ok := line[k]; ok {
					t.Errorf("slog's key %q in %q", k, l)
				}
			}
		}
	}
	if !strings.Contains(bad.logs(), "PORT") {
		t.Errorf("PORT=abc error does not name PORT: %s", bad.logs())
	}
}

func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": webRules})
	c := p.client(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok int
	unexpected := map[codes.Code]int{}
	stop := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "load"))
				mu.Lock()
				switch status.Code(err) {
				case codes.OK:
					ok++
				case codes.Unavailable: // after the listener closed: refused, never half-answered
				default:
					unexpected[status.Code(err)]++
				}
				mu.Unlock()
			}
		}()
	}
	eventually(t, "traffic", 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return ok > 50 })
	p.signal(t, syscall.SIGTERM)
	code := p.wait(t, 20*time.Second)
	close(stop)
	wg.Wait()
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if len(unexpected) > 0 {
		t.Errorf("calls failed with unexpected codes during shutdown: %v", unexpected)
	}
}

func TestReloadAppliesNewRulesAndKeepsOldOnError(t *testing.T) {
	slow(t)
	p := start(t, map[string]string{"web.yaml": webRules})
	c := p.client(t)
	remaining := func(user string) (uint32, error) {
		resp, err := c.ShouldRateLimit(callCtx(t), request("web", "user", user))
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), err
	}
	writeRules(t, p.root, "web.yaml", strings.Replace(webRules, "requests_per_unit: 3", "requests_per_unit: 7", 1))
	eventually(t, "limit 7 applied", 15*time.Second, func() bool { n, err := remaining("r1"); return err == nil && n == 7 })

	writeRules(t, p.root, "web.yaml", "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: -1}\n")
	eventually(t, "reload error logged", 15*time.Second, func() bool { return strings.Contains(p.logs(), "reload failed") })
	if n, err := remaining("r2"); err != nil || n != 7 {
		t.Errorf("after an invalid rewrite: limit %d, err %v; want the old limit 7 still served", n, err)
	}
	if p.healthCode() != 200 {
		t.Error("unhealthy after an invalid reload; the old rules still serve")
	}
}

// TestSymlinkSwapReloadsInBothWatchModes publishes new rules as the
// anchor's runtime layout does: RUNTIME_ROOT is a symlink (current -> v1)
// and a new link is renamed over it (current -> v2). Both values of
// RUNTIME_WATCH_ROOT must apply the new limit.
func TestSymlinkSwapReloadsInBothWatchModes(t *testing.T) {
	for _, watchRoot := range []string{"true", "false"} {
		t.Run("RUNTIME_WATCH_ROOT="+watchRoot, func(t *testing.T) {
			base := t.TempDir()
			for v, limit := range map[string]string{"v1": "3", "v2": "9"} {
				writeRules(t, filepath.Join(base, v), "web.yaml", strings.Replace(webRules, "requests_per_unit: 3", "requests_per_unit: "+limit, 1))
			}
			current := filepath.Join(base, "current")
			if err := os.Symlink("v1", current); err != nil {
				t.Fatal(err)
			}
			p := start(t, nil, "RUNTIME_ROOT="+current, "RUNTIME_WATCH_ROOT="+watchRoot)
			c := p.client(t)
			limit := func() uint32 {
				resp, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "swap"))
				if err != nil {
					t.Fatal(err)
				}
				return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
			}
			if got := limit(); got != 3 {
				t.Fatalf("limit before the swap = %d, want 3", got)
			}
			tmp := current + ".tmp"
			if err := os.Symlink("v2", tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, current); err != nil {
				t.Fatal(err)
			}
			eventually(t, "limit 9 after the swap", 15*time.Second, func() bool { return limit() == 9 })
		})
	}
}

func TestForceStartServesUnhealthyUntilValidRules(t *testing.T) {
	p := launch(t, map[string]string{"web.yaml": "domain: web\ndescriptors: [\n"}, "FORCE_START_WITHOUT_INITIAL_CONFIG=true")
	p.waitHealth(t, 500)
	c := p.client(t)
	if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "x")); status.Code(err) != codes.Unavailable {
		t.Errorf("without rules: %v, want Unavailable", err)
	}
	writeRules(t, p.root, "web.yaml", webRules)
	p.waitHealth(t, 200)
	if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "x")); err != nil {
		t.Errorf("after valid rules: %v", err)
	}
}

func TestGRPCUnixSocket(t *testing.T) {
	sock := t.TempDir() + "/rl.sock"
	p := start(t, map[string]string{"web.yaml": webRules}, "GRPC_UDS="+sock)
	p.grpc = "unix://" + sock
	resp, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "uds"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("over GRPC_UDS: %v %v", resp, err)
	}
}

// TestGRPCUnixSocketIsNotTakenOver: a second instance on the same GRPC_UDS
// refuses to start and leaves the first one's socket alone (it used to
// remove it, leaving the first healthy and unreachable); a successor
// started once the first has closed its listener serves on the path
// (TestOwnSocketRemovesOnlyItsOwn in src/server shows the first one's
// shutdown leaving the successor's socket in place).
func TestGRPCUnixSocketIsNotTakenOver(t *testing.T) {
	sock := t.TempDir() + "/rl.sock"
	rulesFiles := map[string]string{"web.yaml": webRules}
	first := start(t, rulesFiles, "GRPC_UDS="+sock)
	first.grpc = "unix://" + sock

	second := launch(t, rulesFiles, "GRPC_UDS="+sock)
	if code := second.wait(t, 30*time.Second); code == 0 {
		t.Fatal("a second instance on a socket in use started")
	}
	if !strings.Contains(second.logs(), "another process serves on this socket") {
		t.Errorf("the second instance does not say why:\n%s", second.logs())
	}
	if _, err := first.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "still")); err != nil {
		t.Fatalf("the first instance over its socket after the second one's attempt: %v", err)
	}

	// A rolling restart: the first one's listener is closed at the start
	// of its drain, the successor takes the path, then the first exits.
	first.signal(t, syscall.SIGTERM)
	eventually(t, "the first instance's listener closed", 30*time.Second, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	next := launch(t, rulesFiles, "GRPC_UDS="+sock)
	next.waitHealth(t, http.StatusOK)
	first.wait(t, 30*time.Second)
	next.grpc = "unix://" + sock
	if _, err := next.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "next")); err != nil {
		t.Errorf("the successor over its socket after the first one exited: %v", err)
	}
}
