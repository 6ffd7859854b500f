package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestBudgetFollowsTheCaller: on a Redis whose replies take 50 ms (a proxy
// delays them), with REQUEST_TIMEOUT at its default (0, as in the anchor),
// a call whose caller allows 5 s is answered: the budget is the caller's
// deadline, not a fixed time; and so are calls that carry no deadline at
// all (/json, a gRPC client without one), which no fixed time fails either
// (issue 36: at the old 15 ms default they failed whenever the host was
// busy). A Redis that stops answering still answers such a call at once
// (503), through its silence bound and the breaker, not after
// REDIS_TIMEOUT. REQUEST_TIMEOUT set by the operator bounds every call, as
// in the anchor: the same 5 s call then fails with DeadlineExceeded.
func TestBudgetFollowsTheCaller(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	px := harness.StartProxy(t, r.Addr)
	const latency = 50 * time.Millisecond
	call := func(p *proc) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := p.client(t).ShouldRateLimit(ctx, request("web", "user", "frank"))
		return err
	}
	const storeTimeout = time.Minute
	env := []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + px.Addr, "REDIS_TIMEOUT=" + storeTimeout.String()}
	const jsonBody = `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"frank"}]}]}`

	t.Run("default", func(t *testing.T) {
		px.SetLatency(0)
		p := launchWith(t, launchOpts{defaultBudget: true}, map[string]string{"web.yaml": statsdRules}, env...)
		p.waitHealth(t, http.StatusOK)
		px.SetLatency(latency)
		if err := call(p); err != nil {
			t.Errorf("a call allowing 5s on a Redis answering in %v: %v, want an answer", latency, err)
		}
		// No deadline: the caller waits as long as it takes.
		if _, err := p.client(t).ShouldRateLimit(t.Context(), request("web", "user", "frank")); err != nil {
			t.Errorf("a gRPC call without a deadline on a Redis answering in %v: %v, want an answer", latency, err)
		}
		if code, body := p.postJSON(t, jsonBody); code != http.StatusOK {
			t.Errorf("/json (no deadline) on a Redis answering in %v = %d %s, want 200", latency, code, body)
		}
		px.Blackhole()
		t.Cleanup(px.Heal)
		began := time.Now()
		code, body := p.postJSON(t, jsonBody)
		took := time.Since(began)
		t.Logf("/json (no deadline) on a blackholed Redis: %d after %v", code, took)
		if code != http.StatusServiceUnavailable || took >= storeTimeout/2 {
			t.Errorf("/json (no deadline) on a blackholed Redis = %d %s after %v, want 503 long before REDIS_TIMEOUT (%v)", code, body, took, storeTimeout)
		}
	})
	t.Run("ceiling", func(t *testing.T) {
		px.Heal()
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
