package integration

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

// Bounds of the outage tests, generous for the -race binary on a loaded
// machine; the tests log what they measured.
const (
	outageBudget  = 300 * time.Millisecond // REQUEST_TIMEOUT
	outageFast    = 100 * time.Millisecond // an answer without waiting for the store, over gRPC
	outageRecover = 2 * time.Second        // from the store's return to decisions from it
)

// breakerEnv are the settings of the outage tests: a breaker that opens
// after 3 failures and probes every 100ms, and a request budget that a
// frozen store makes every request wait for.
var breakerEnv = []string{
	"REQUEST_TIMEOUT=" + outageBudget.String(),
	"STORE_BREAKER_FAILURES=3", "STORE_BREAKER_PROBE_INTERVAL=100ms",
}

// testBreakerOverTheWire serves with env, takes the store down with down,
// and checks over gRPC that after a few slow failures the answers are
// Unavailable at once, that /stats shows the open breaker under prefix,
// and that decisions come back within outageRecover of up.
func testBreakerOverTheWire(t *testing.T, down, up func() error, prefix string, env []string) {
	p := start(t, map[string]string{"shared.yaml": sharedRules}, env...)
	c := p.client(t)
	if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "b")); err != nil {
		t.Fatal(err)
	}
	if err := down(); err != nil {
		t.Fatal(err)
	}
	// Until the breaker opens, requests fail after their budget (frozen
	// store); then the breaker's own error comes back at once.
	var open []time.Duration
	for i := 0; len(open) < 20; i++ {
		if i > 30 {
			t.Fatalf("only %d answers from the open breaker after %d requests with the store down", len(open), i)
		}
		began := time.Now()
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "b"))
		took := time.Since(began)
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			t.Fatalf("request %d with the store down: %v, want Unavailable or DeadlineExceeded", i, err)
		}
		if strings.Contains(status.Convert(err).Message(), "circuit breaker open") {
			open = append(open, took)
		} else if len(open) > 0 {
			t.Errorf("request %d: %v after %d answers from the open breaker: it closed with the store down", i, err, len(open))
		}
	}
	slices.Sort(open)
	t.Logf("with the breaker open: answers in %v (median), %v (slowest) over gRPC; budget %v", open[len(open)/2], open[len(open)-1], outageBudget)
	if open[len(open)/2] > outageFast {
		t.Errorf("median answer with the breaker open %v, want at once (< %v)", open[len(open)/2], outageFast)
	}
	st := p.stats(t)
	if st[prefix+"breaker_open"] != 1 || st[prefix+"breaker_trips"] != 1 || st[prefix+"breaker_open_rejections"] < 20 {
		t.Errorf("/stats: breaker_open %d, breaker_trips %d, breaker_open_rejections %d; want 1, 1, at least 20",
			st[prefix+"breaker_open"], st[prefix+"breaker_trips"], st[prefix+"breaker_open_rejections"])
	}

	if err := up(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	eventually(t, "a decision from the store", outageRecover, func() bool {
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "b"))
		return err == nil
	})
	t.Logf("decisions from the store again %v after it returned", time.Since(back))
	if st := p.stats(t); st[prefix+"breaker_open"] != 0 {
		t.Errorf("/stats: breaker_open %d after the store returned, want 0", st[prefix+"breaker_open"])
	}
}

// outageStoreTimeout is the Redis tests' REDIS_TIMEOUT: a frozen Redis is
// known to fail when its round trips pass it (a request's own budget
// passing says nothing of Redis), and it is shorter than the budget.
const outageStoreTimeout = 200 * time.Millisecond

// TestRedisBreakerOverTheWire freezes Redis: requests fail when their round
// trip passes REDIS_TIMEOUT until the breaker opens, then at once.
func TestRedisBreakerOverTheWire(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	t.Cleanup(func() { _ = r.Thaw() })
	testBreakerOverTheWire(t, r.Freeze, r.Thaw, "ratelimit.redis.",
		redisEnv(r, append([]string{"REDIS_TIMEOUT=" + outageStoreTimeout.String()}, breakerEnv...)...))
}

// TestMemcachedBreakerOverTheWire freezes memcached: each request waits
// for its round trip's timeout (the budget) until the breaker opens.
func TestMemcachedBreakerOverTheWire(t *testing.T) {
	m := harness.StartMemcached(t)
	t.Cleanup(func() { _ = m.Thaw() })
	testBreakerOverTheWire(t, m.Freeze, m.Thaw, "ratelimit.memcache.", memcacheEnv(m, breakerEnv...))
}

// TestFrozenRedisFailsFast freezes Redis with the settings at their
// defaults (REDIS_TIMEOUT 10 s, REDIS_STALL_TIMEOUT 250 ms, the breaker
// on) under callers allowing the harness's 2 s budget: the calls in flight
// fail with Unavailable once Redis has been silent for
// REDIS_STALL_TIMEOUT, well before their budget, the breaker opens on that
// one silence, and the calls after it are refused at once; decisions come
// back after the thaw. (Issue 36: each call waited for its whole budget,
// DeadlineExceeded, until REDIS_TIMEOUT had passed.)
func TestFrozenRedisFailsFast(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	t.Cleanup(func() { _ = r.Thaw() })
	p := start(t, map[string]string{"shared.yaml": sharedRules}, redisEnv(r)...)
	c := p.client(t)
	if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "warm")); err != nil {
		t.Fatal(err)
	}
	const budget = 2 * time.Second // the harness's REQUEST_TIMEOUT
	if err := r.Freeze(); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		err  error
		took time.Duration
	}
	const calls = 8
	answers := make(chan answer, calls)
	for i := range calls {
		go func() {
			began := time.Now()
			_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", fmt.Sprint("frozen", i)))
			answers <- answer{err, time.Since(began)}
		}()
	}
	for range calls {
		a := <-answers
		if status.Code(a.err) != codes.Unavailable || a.took >= budget {
			t.Errorf("call in flight on a frozen Redis: %v after %v, want Unavailable before its %v budget", a.err, a.took, budget)
		}
	}
	var refused []time.Duration
	for i := range 10 {
		began := time.Now()
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", fmt.Sprint("after", i)))
		refused = append(refused, time.Since(began))
		if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "circuit breaker open") {
			t.Errorf("call after the silence: %v, want the open breaker's Unavailable", err)
		}
	}
	slices.Sort(refused)
	t.Logf("with the breaker open: answers in %v (median) over gRPC", refused[len(refused)/2])
	if st := p.stats(t); st["ratelimit.redis.breaker_trips"] != 1 {
		t.Errorf("/stats: breaker_trips %d, want 1", st["ratelimit.redis.breaker_trips"])
	}
	if err := r.Thaw(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a decision after the thaw", outageRecover, func() bool {
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "thawed"))
		return err == nil
	})
}

// TestBreakerOffOverTheWire: STORE_BREAKER_FAILURES=0 keeps the behaviour
// without a breaker: every request on a frozen Redis waits for its budget.
func TestBreakerOffOverTheWire(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	t.Cleanup(func() { _ = r.Thaw() })
	p := start(t, map[string]string{"shared.yaml": sharedRules},
		redisEnv(r, "REQUEST_TIMEOUT="+outageBudget.String(), "STORE_BREAKER_FAILURES=0")...)
	c := p.client(t)
	if err := r.Freeze(); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		began := time.Now()
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", fmt.Sprint("off", i)))
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("request %d: %v, want DeadlineExceeded", i, err)
		}
		if took := time.Since(began); took < outageBudget*9/10 {
			t.Errorf("request %d answered after %v, before its %v budget", i, took, outageBudget)
		}
	}
	if st := p.stats(t); st["ratelimit.redis.breaker_trips"] != 0 {
		t.Errorf("/stats: breaker_trips %d with the breaker off", st["ratelimit.redis.breaker_trips"])
	}
}

const outageRules = `domain: outage
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// prefix is the statistics prefix of the store env configures.
func prefix(env []string) string {
	if slices.Contains(env, "BACKEND_TYPE=memcache") {
		return "ratelimit.memcache."
	}
	return "ratelimit.redis."
}

// degraded reports whether a response carries the "degraded" mark.
func degraded(resp *rlsv3.RateLimitResponse) bool {
	return resp.GetDynamicMetadata().GetFields()["degraded"].GetBoolValue()
}

// TestDegradedModeOverTheWire takes the store down under
// STORE_FAILURE_MODE=local: a limit of 3 per hour admits 3 then refuses,
// from this instance's own counts, every answer marked degraded and
// counted; once the store is back, decisions come from it again within
// outageRecover, and the local counts are not merged into it. With
// STORE_FAILURE_MODE=error the outage is an error, as before.
func TestDegradedModeOverTheWire(t *testing.T) {
	slow(t)
	tests := []struct {
		name  string
		mode  string
		store func(t *testing.T) (down, up func() error, env []string)
	}{
		{"redis_stopped", "local", func(t *testing.T) (func() error, func() error, []string) {
			r := harness.StartRedis(t, harness.RedisOptions{})
			return r.Stop, r.Start, redisEnv(r)
		}},
		{"redis_frozen", "local", func(t *testing.T) (func() error, func() error, []string) {
			r := harness.StartRedis(t, harness.RedisOptions{})
			t.Cleanup(func() { _ = r.Thaw() })
			return r.Freeze, r.Thaw, redisEnv(r, "REDIS_TIMEOUT="+outageStoreTimeout.String())
		}},
		{"memcached_stopped", "local", func(t *testing.T) (func() error, func() error, []string) {
			m := harness.StartMemcached(t)
			return m.Stop, m.Start, memcacheEnv(m)
		}},
		{"redis_error_mode", "error", func(t *testing.T) (func() error, func() error, []string) {
			r := harness.StartRedis(t, harness.RedisOptions{})
			return r.Stop, r.Start, redisEnv(r)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			down, up, env := tt.store(t)
			env = append(env, breakerEnv...)
			env = append(env, "STORE_FAILURE_MODE="+tt.mode)
			p := start(t, map[string]string{"outage.yaml": outageRules}, env...)
			c := p.client(t)
			call := func(user string) (*rlsv3.RateLimitResponse, error) {
				return c.ShouldRateLimit(callCtx(t), request("outage", "user", user))
			}
			resp, err := call("before")
			if err != nil || degraded(resp) {
				t.Fatalf("before the outage: %v, %v; want a decision from the store", resp, err)
			}
			if err := down(); err != nil {
				t.Fatal(err)
			}
			// Open the breaker with another user's requests, so that none
			// of alice's is sent: a frozen Redis would apply those when it
			// thaws.
			opened := false
			for i := 0; i < 20 && !opened; i++ {
				_, _ = call("opener")
				opened = p.stats(t)[prefix(env)+"breaker_open"] == 1
			}
			if !opened {
				t.Fatal("breaker not open after 20 requests with the store down")
			}

			for i := 1; i <= 5; i++ {
				began := time.Now()
				resp, err := call("alice")
				if took := time.Since(began); took >= outageBudget {
					t.Errorf("request %d with the breaker open answered after %v: it waited for the %v budget", i, took, outageBudget)
				}
				if tt.mode == "error" {
					if code := status.Code(err); code != codes.Unavailable {
						t.Errorf("request %d, STORE_FAILURE_MODE=error: %v, want Unavailable", i, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("request %d with the store down: %v, want a decision from local counts", i, err)
				}
				want := rlsv3.RateLimitResponse_OK
				if i > 3 {
					want = rlsv3.RateLimitResponse_OVER_LIMIT
				}
				if resp.GetOverallCode() != want || !degraded(resp) {
					t.Errorf("request %d with the store down: %v, degraded %v; want %v, degraded", i, resp.GetOverallCode(), degraded(resp), want)
				}
			}
			if tt.mode == "local" {
				// The instance answers without the store, so health does
				// not follow it (with Memcached it otherwise would): watch
				// it over more than two of the server's health polls.
				for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
					if code := p.healthCode(); code != http.StatusOK {
						t.Fatalf("/healthcheck %d during the outage with STORE_FAILURE_MODE=local, want 200", code)
					}
				}
			}
			switch got := p.stats(t)["ratelimit.service.degraded_decisions"]; {
			case tt.mode == "error" && got != 0:
				t.Errorf("/stats: degraded_decisions %d with STORE_FAILURE_MODE=error, want 0", got)
			case tt.mode == "local" && got < 5:
				t.Errorf("/stats: degraded_decisions %d, want at least alice's 5", got)
			}
			if tt.mode == "error" {
				return
			}

			if err := up(); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			eventually(t, "a decision from the store", outageRecover, func() bool {
				resp, err := call("probe")
				return err == nil && !degraded(resp)
			})
			t.Logf("decisions from the store again %v after it returned", time.Since(back))
			// The store never saw alice's local hits: her count there
			// is untouched (local counts are not merged back).
			resp, err = call("alice")
			if err != nil || degraded(resp) || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 2 {
				t.Errorf("alice once the store is back: %v, %v; want OK with 2 remaining, from the store", resp, err)
			}
		})
	}
}
