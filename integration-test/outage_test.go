package integration

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/store/storetest"
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
	fast := 0
	fastest, slowest := time.Hour, time.Duration(0)
	for i := 0; fast < 20; i++ {
		if i > 30 {
			t.Fatalf("only %d fast answers after %d requests with the store down", fast, i)
		}
		began := time.Now()
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "b"))
		took := time.Since(began)
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			t.Fatalf("request %d with the store down: %v, want Unavailable or DeadlineExceeded", i, err)
		}
		if took < outageFast {
			fast++
			fastest, slowest = min(fastest, took), max(slowest, took)
			continue
		}
		if fast > 0 {
			t.Errorf("request %d took %v after %d fast answers: the breaker closed with the store down", i, took, fast)
		}
	}
	t.Logf("with the breaker open: answers in %v..%v over gRPC (budget %v)", fastest, slowest, outageBudget)
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

// TestRedisBreakerOverTheWire freezes Redis (REDIS_TIMEOUT stays long):
// requests fail after their budget until the breaker opens, then at once.
func TestRedisBreakerOverTheWire(t *testing.T) {
	r := storetest.StartRedis(t, storetest.RedisOptions{})
	t.Cleanup(func() { _ = r.Thaw() })
	testBreakerOverTheWire(t, r.Freeze, r.Thaw, "ratelimit.redis.",
		redisEnv(r, append([]string{"REDIS_TIMEOUT=10s"}, breakerEnv...)...))
}

// TestMemcachedBreakerOverTheWire freezes memcached: each request waits
// for its round trip's timeout (the budget) until the breaker opens.
func TestMemcachedBreakerOverTheWire(t *testing.T) {
	m := storetest.StartMemcached(t)
	t.Cleanup(func() { _ = m.Thaw() })
	testBreakerOverTheWire(t, m.Freeze, m.Thaw, "ratelimit.memcache.", memcacheEnv(m, breakerEnv...))
}

// TestBreakerOffOverTheWire: STORE_BREAKER_FAILURES=0 keeps the behaviour
// without a breaker: every request on a frozen Redis waits for its budget.
func TestBreakerOffOverTheWire(t *testing.T) {
	r := storetest.StartRedis(t, storetest.RedisOptions{})
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
