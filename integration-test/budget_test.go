package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// TestBudgetFollowsTheCaller: on a Redis whose replies take 50 ms (a proxy
// delays them), with REQUEST_TIMEOUT at its default (15 ms), a call whose
// caller allows 5 s is answered: the budget is the caller's deadline, not a
// fixed 15 ms. /json, which carries no deadline, gets REQUEST_TIMEOUT:
// 503. REQUEST_TIMEOUT set by the operator bounds every call, as in the
// anchor: the same 5 s call then fails with DeadlineExceeded.
func TestBudgetFollowsTheCaller(t *testing.T) {
	r := storetest.StartRedis(t, storetest.RedisOptions{})
	px := storetest.StartProxy(t, r.Addr)
	const latency = 50 * time.Millisecond
	call := func(p *proc) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := p.client(t).ShouldRateLimit(ctx, request("web", "user", "frank"))
		return err
	}
	env := []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + px.Addr}

	t.Run("default", func(t *testing.T) {
		px.SetLatency(0)
		p := launchWith(t, launchOpts{defaultBudget: true}, map[string]string{"web.yaml": statsdRules}, env...)
		p.waitHealth(t, http.StatusOK)
		px.SetLatency(latency)
		if err := call(p); err != nil {
			t.Errorf("a call allowing 5s on a Redis answering in %v: %v, want an answer", latency, err)
		}
		code, body := p.postJSON(t, `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"frank"}]}]}`)
		if code != http.StatusServiceUnavailable {
			t.Errorf("/json (no deadline, REQUEST_TIMEOUT 15ms) on a Redis answering in %v = %d %s, want 503", latency, code, body)
		}
	})
	t.Run("ceiling", func(t *testing.T) {
		px.SetLatency(0)
		p := launchWith(t, launchOpts{defaultBudget: true}, map[string]string{"web.yaml": statsdRules},
			append(env, "REQUEST_TIMEOUT=30ms")...)
		p.waitHealth(t, http.StatusOK)
		px.SetLatency(latency)
		if err := call(p); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("a call allowing 5s with REQUEST_TIMEOUT=30ms on a Redis answering in %v: %v, want DeadlineExceeded", latency, err)
		}
	})
}
