package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestFailuresNameNoStoreAddressOrKey: what a caller is told of a failure
// of the store names the kind of failure, never the store's address, its
// port or a cache key (issue 24, case 10). Before, the gRPC message and the
// /json body carried "redis 127.0.0.1:PORT: ... dial tcp 127.0.0.1:PORT"
// and `key "shared_user_x_..."`.
func TestFailuresNameNoStoreAddressOrKey(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	p := start(t, map[string]string{"shared.yaml": sharedRules}, redisEnv(r, "REDIS_TIMEOUT=500ms", "STORE_BREAKER_FAILURES=0")...)
	c := p.client(t)
	port := fmt.Sprint(r.Port())
	leaks := func(what, msg string, keys ...string) {
		t.Helper()
		for _, s := range append([]string{port, "127.0.0.1"}, keys...) {
			if strings.Contains(msg, s) {
				t.Errorf("%s: the caller is told %q, which names %q", what, msg, s)
			}
		}
	}

	// A key holding something else than a counter, in this window and
	// the next (the hour may turn during the test).
	now := time.Now().Unix()
	var keys []string
	for _, w := range []int64{now / 3600 * 3600, (now/3600 + 1) * 3600} {
		k := fmt.Sprintf("shared_user_wrongtype_%d", w)
		keys = append(keys, k)
		if _, err := r.Do(t.Context(), "LPUSH", k, "x"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "wrongtype"))
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "store refused the data" {
		t.Errorf("a key of another type: %v %q, want Internal \"store refused the data\"", st.Code(), st.Message())
	}
	leaks("gRPC, a key of another type", status.Convert(err).Message(), keys...)
	code, body := p.postJSON(t, `{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"wrongtype"}]}]}`)
	if code != http.StatusInternalServerError {
		t.Errorf("/json, a key of another type: %d %q, want 500", code, body)
	}
	leaks("/json, a key of another type", body, keys...)

	// Redis down: the store is unavailable.
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err = c.ShouldRateLimit(callCtx(t), request("shared", "user", "down"))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "store unavailable" {
		t.Errorf("Redis down: %v %q, want Unavailable \"store unavailable\"", st.Code(), st.Message())
	}
	leaks("gRPC, Redis down", status.Convert(err).Message())
	code, body = p.postJSON(t, `{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"down"}]}]}`)
	if code != http.StatusServiceUnavailable {
		t.Errorf("/json, Redis down: %d %q, want 503", code, body)
	}
	leaks("/json, Redis down", body)

	// The log has what the caller is not told.
	if logs := p.logs(); !strings.Contains(logs, port) {
		t.Errorf("the log does not name the store's address:\n%s", logs)
	}
}
