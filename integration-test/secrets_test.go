package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

func randomSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "secret-" + hex.EncodeToString(b)
}

// TestCredentialsAreNeverShown starts the service with wrong credentials
// against a Redis that requires a password, at debug level, directly and
// through the Sentinel path: no secret appears in the logs, the debug
// endpoints or the errors clients get.
func TestCredentialsAreNeverShown(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{Password: randomSecret(t)})
	tests := []struct {
		name string
		env  func(auth, sentinel, perSecond string) []string
	}{
		{"single_and_per_second", func(auth, sentinel, perSecond string) []string {
			return redisEnv(r, "REDIS_AUTH="+auth, "REDIS_SENTINEL_AUTH="+sentinel,
				"REDIS_PERSECOND=true", "REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_PERSECOND_URL="+r.Addr,
				"REDIS_PERSECOND_AUTH=user:"+perSecond, "REDIS_PERSECOND_TIMEOUT=500ms")
		}},
		// The Redis stands in for a sentinel: the service authenticates to
		// it with REDIS_SENTINEL_AUTH, which it refuses.
		{"sentinel_json_logs", func(auth, sentinel, _ string) []string {
			return redisEnv(r, "REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster,"+r.Addr,
				"REDIS_AUTH=user:"+auth, "REDIS_SENTINEL_AUTH="+sentinel, "LOG_FORMAT=json")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth, sentinel, perSecond := randomSecret(t), randomSecret(t), randomSecret(t)
			env := append(tt.env(auth, sentinel, perSecond), "REDIS_TIMEOUT=500ms", "LOG_LEVEL=debug")
			p := launch(t, map[string]string{"shared.yaml": sharedRules}, env...)
			p.waitHealth(t, http.StatusInternalServerError) // Redis refuses the password
			checkNoSecrets(t, p, auth, sentinel, perSecond)
		})
	}
}

// checkNoSecrets gathers what the service shows (a failing request's error
// over gRPC and /json, the debug endpoints, health, then its logs up to
// exit) and fails if any holds one of secrets.
func checkNoSecrets(t *testing.T, p *proc, secrets ...string) {
	t.Helper()
	shown := map[string]string{}
	_, err := p.client(t).ShouldRateLimit(callCtx(t), request("shared", "user", "x"))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("with the wrong password: %v, want Unavailable", err)
	}
	shown["gRPC error"] = fmt.Sprint(err)
	code, body := p.postJSON(t, `{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}`)
	if code != http.StatusServiceUnavailable {
		t.Errorf("/json with the wrong password: %d %s, want 503", code, body)
	}
	shown["/json answer"] = body
	get := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, path := range []string{"/", "/rlconfig", "/stats", "/metrics", "/debug/pprof/cmdline"} {
		shown[path] = get("http://" + p.debug + path)
	}
	shown["/healthcheck"] = get("http://" + p.http + "/healthcheck")

	p.signal(t, syscall.SIGTERM)
	p.wait(t, 20*time.Second)
	logs := p.logs()
	if !strings.Contains(strings.ToUpper(logs), "DEBUG") {
		t.Errorf("no debug lines logged; the test needs them to mean anything:\n%s", logs)
	}
	shown["stderr"] = logs
	for where, text := range shown {
		for _, s := range secrets {
			if strings.Contains(text, s) || strings.Contains(text, strings.TrimPrefix(s, "secret-")) {
				t.Errorf("%s shows a credential:\n%s", where, text)
			}
		}
	}
}
