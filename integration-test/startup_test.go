package integration

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestStartupLineAtDefaultLevel: at the default LOG_LEVEL (WARN) a healthy
// start prints exactly one line, and it says where the service listens and
// which store and rules it uses, so that an operator sees that it started.
func TestStartupLineAtDefaultLevel(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
		"LOG_LEVEL=WARN")
	var lines []string
	// The line is written before the listeners serve, so it is there once
	// /healthcheck answers; poll a little all the same for the pipe.
	eventually(t, "the startup line", 5*time.Second, func() bool {
		lines = strings.Split(strings.TrimSpace(p.logs()), "\n")
		return len(lines) > 0 && lines[0] != ""
	})
	if len(lines) != 1 {
		t.Fatalf("at LOG_LEVEL=WARN the start printed %d lines, want 1:\n%s", len(lines), p.logs())
	}
	line := lines[0]
	for _, want := range []string{
		"grpc=" + p.grpc,
		"http=" + p.http,
		"store=memory",
		"rules=" + filepath.Join(p.root, "config"),
		"domains=[web]",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("startup line lacks %q:\n%s", want, line)
		}
	}
}

// TestHealthcheckFlag: `ratelimit -healthcheck`, the image's HEALTHCHECK,
// exits 0 while the service with the same settings is healthy, with the
// default HOST (every interface) probed on loopback; 1 while it runs
// unhealthy, and 1 once it is gone.
func TestHealthcheckFlag(t *testing.T) {
	slow(t)
	p := start(t, map[string]string{"web.yaml": "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"})
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		if code, out := healthcheck(t, p, host); code != 0 {
			t.Errorf("-healthcheck with HOST=%s on a healthy service: exit %d, want 0\n%s", host, code, out)
		}
	}
	p.signal(t, syscall.SIGTERM)
	p.wait(t, 20*time.Second)
	if code, out := healthcheck(t, p, "127.0.0.1"); code != 1 || !strings.Contains(out, "healthcheck") {
		t.Errorf("-healthcheck with the service stopped: exit %d (%q), want 1 and a reason", code, out)
	}

	// Running but unhealthy (no valid rules): /healthcheck answers 500.
	u := launch(t, map[string]string{"bad.yaml": "domain: [\n"}, "FORCE_START_WITHOUT_INITIAL_CONFIG=true")
	u.waitHealth(t, http.StatusInternalServerError)
	if code, out := healthcheck(t, u, "127.0.0.1"); code != 1 || !strings.Contains(out, "500") {
		t.Errorf("-healthcheck on an unhealthy service: exit %d (%q), want 1 and the status", code, out)
	}
}

// healthcheck runs `ratelimit -healthcheck` with the PORT of p and HOST
// host, and returns its exit code and stderr.
func healthcheck(t *testing.T, p *proc, host string) (int, string) {
	t.Helper()
	_, port, err := net.SplitHostPort(p.http)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "-healthcheck")
	cmd.Env = append(os.Environ(), "PORT="+port, "HOST="+host)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	default:
		t.Fatal(err)
		return -1, ""
	}
}

// TestHealthInStepWithStore: started with its store down, the service is
// unhealthy while no decision can be answered, and healthy by the time the
// first decision answered from the store reaches its caller, not a poll of
// the store later: /healthcheck, read right after that decision, is 200.
func TestHealthInStepWithStore(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	m := harness.StartMemcached(t)
	tests := []struct {
		name        string
		stop, start func() error
		env         []string
	}{
		{"redis", r.Stop, r.Start, redisEnv(r)},
		{"memcache", m.Stop, m.Start, memcacheEnv(m)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.stop(); err != nil {
				t.Fatal(err)
			}
			p := launch(t, map[string]string{"web.yaml": statsdRules}, tt.env...)
			c := p.client(t)
			eventually(t, "/healthcheck to answer", 30*time.Second, func() bool { return p.healthCode() != 0 })
			for i := range 5 {
				if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "erin")); err == nil {
					t.Fatalf("call %d answered with the store down", i)
				}
				if code := p.healthCode(); code != http.StatusInternalServerError {
					t.Fatalf("/healthcheck = %d with the store down, want 500", code)
				}
			}
			if err := tt.start(); err != nil {
				t.Fatal(err)
			}
			eventually(t, "a decision from the store", 30*time.Second, func() bool {
				_, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "erin"))
				return err == nil
			})
			if code := p.healthCode(); code != http.StatusOK {
				t.Errorf("/healthcheck = %d right after a decision answered from the store, want 200", code)
			}
		})
	}
}
