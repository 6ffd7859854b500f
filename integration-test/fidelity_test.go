package integration

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stat returns the line of the debug port's /stats that names counter.
func (p *proc) stat(t *testing.T, counter string) string {
	t.Helper()
	resp, err := http.Get("http://" + p.debug + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, counter+":") {
			return line
		}
	}
	return ""
}

// TestEmptyReloadKeepsRules removes the only rule file. The reload must be
// refused, logged and counted, and the rules in use must keep serving with
// health unchanged, even with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED;
// with RUNTIME_ALLOW_EMPTY_RELOAD=true the empty rules load and health
// follows them, as in envoyproxy/ratelimit.
func TestEmptyReloadKeepsRules(t *testing.T) {
	env := []string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true", "RUNTIME_QUIET_PERIOD=50ms"}
	t.Run("refused", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules}, env...)
		if err := os.Remove(filepath.Join(p.root, "config", "web.yaml")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the empty reload logged", 15*time.Second, func() bool { return strings.Contains(p.logs(), "no domain left") })
		if got := p.stat(t, "ratelimit.service.config_load_error"); got != "ratelimit.service.config_load_error: 1" {
			t.Errorf("/stats: %q, want config_load_error 1", got)
		}
		resp, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "kept"))
		if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Errorf("after the empty reload: %v, %v; want the old limit 3", resp, err)
		}
		if c := p.healthCode(); c != http.StatusOK {
			t.Errorf("/healthcheck %d after the empty reload, want 200: the old rules still serve", c)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules}, append(env, "RUNTIME_ALLOW_EMPTY_RELOAD=true")...)
		if err := os.Remove(filepath.Join(p.root, "config", "web.yaml")); err != nil {
			t.Fatal(err)
		}
		p.waitHealth(t, http.StatusInternalServerError)
	})
}

// TestAnchorSettingsNotImplemented starts the service with settings of
// envoyproxy/ratelimit that it does not implement. One that would change
// security or the rules in force stops it at start, naming the setting;
// a harmless one is logged once, and the service serves.
func TestAnchorSettingsNotImplemented(t *testing.T) {
	for _, env := range []string{"DESCRIPTOR_KEY_CONFIG=/etc/keys.yaml", "GRPC_SERVER_USE_TLS=true"} {
		t.Run(env, func(t *testing.T) {
			p := launch(t, map[string]string{"web.yaml": webRules}, env)
			if code := p.wait(t, 30*time.Second); code == 0 {
				t.Errorf("exit code 0 with %s, want a failure", env)
			}
			if name, _, _ := strings.Cut(env, "="); !strings.Contains(p.logs(), name) {
				t.Errorf("stderr does not name %s:\n%s", name, p.logs())
			}
		})
	}
	// A harmless setting not implemented (PROTO=udp; the listeners are
	// TCP here): one warning naming it, and the service serves.
	t.Run("PROTO", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules}, "PROTO=udp",
			"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=false", "LOG_FORMAT=json")
		logs := p.logs()
		if n := strings.Count(logs, `"setting":"PROTO"`); n != 1 {
			t.Errorf("%d warnings naming PROTO, want 1:\n%s", n, logs)
		}
		if strings.Contains(logs, "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS") {
			t.Errorf("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=false asks for nothing, but was warned about:\n%s", logs)
		}
		if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "proto")); err != nil {
			t.Errorf("ShouldRateLimit: %v", err)
		}
	})
}
