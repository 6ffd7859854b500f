package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

const fillRules = `domain: fill
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// fill is what a flood of new keys did: answers by code.
type fill struct {
	ok, over, exhausted, other int
	lastOther                  error
}

// flood sends n requests of 256 new values each (the service refuses
// more descriptors per request), as a client inventing values would.
func flood(t *testing.T, p *proc, n int) fill {
	t.Helper()
	c := p.client(t)
	var f fill
	for r := range n {
		req := &rlsv3.RateLimitRequest{Domain: "fill"}
		for i := range 256 {
			req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("flood-%d-%d", r, i)}}})
		}
		resp, err := c.ShouldRateLimit(callCtx(t), req)
		switch {
		case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			f.ok++
		case err == nil:
			f.over++
		case status.Code(err) == codes.ResourceExhausted:
			f.exhausted++
		default:
			f.other++
			f.lastOther = err
		}
	}
	return f
}

// spend pushes user=spent over its limit of 3 an hour.
func spend(t *testing.T, p *proc) {
	t.Helper()
	c := p.client(t)
	for range 4 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("fill", "user", "spent")); err != nil {
			t.Fatal(err)
		}
	}
}

// spentAnswer is the answer to the spent client now: its code, or the
// gRPC code of its error.
func spentAnswer(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := p.client(t).ShouldRateLimit(callCtx(t), request("fill", "user", "spent"))
	if err != nil {
		return status.Code(err).String()
	}
	return resp.GetOverallCode().String()
}

// fills waits until p has read its store's memory cap and policy, checks
// what it exports under prefix (ratelimit.redis., ratelimit.memcache.)
// and, when the store may evict, its warning; then pushes user=spent over
// its limit and floods the store with 102,400 new keys, some 10 times
// what 2 MiB holds.
func fills(t *testing.T, p *proc, prefix string, capBytes, evicting int64) fill {
	t.Helper()
	eventually(t, "the memory cap read", 30*time.Second, func() bool {
		return p.stats(t)[prefix+"maxmemory_bytes"] == capBytes
	})
	if got := p.stats(t)[prefix+"evicting_servers"]; got != evicting {
		t.Errorf("%sevicting_servers = %d, want %d", prefix, got, evicting)
	}
	if warned := strings.Contains(p.logs(), "may evict counters before they expire"); warned != (evicting > 0) {
		t.Errorf("warned that the store may evict counters: %v, want %v\n%s", warned, evicting > 0, p.logs())
	}
	spend(t, p)
	return flood(t, p, 400)
}

// TestRedisFills shows what the service does when a small Redis fills
// with keys that clients invent (issue 24, case 2). At start it reads
// maxmemory and maxmemory-policy, logs them, warns when the policy evicts
// counters before they expire, and exports them. Then: with allkeys-lru
// Redis forgets counters, a spent client's among them, and the client
// starts afresh; with noeviction nothing is forgotten, and the writes that
// need memory are refused, ResourceExhausted for those requests, never
// OK, never an outage. Before, the service said nothing of the policy.
func TestRedisFills(t *testing.T) {
	slow(t)
	busyParallel(t)
	const capBytes = 2 << 20
	redis := func(t *testing.T, policy string) (*harness.RedisServer, *proc) {
		r := harness.StartRedis(t, harness.RedisOptions{Config: []string{fmt.Sprintf("maxmemory %d", capBytes), "maxmemory-policy " + policy}})
		return r, start(t, map[string]string{"fill.yaml": fillRules}, redisEnv(r)...)
	}
	t.Run("allkeys-lru", func(t *testing.T) {
		r, p := redis(t, "allkeys-lru")
		if f := fills(t, p, "ratelimit.redis.", capBytes, 1); f.other != 0 || f.exhausted != 0 {
			t.Errorf("flooding: %+v, want every request decided", f)
		}
		if !strings.Contains(p.logs(), "policy=allkeys-lru") {
			t.Errorf("the warning does not name the policy:\n%s", p.logs())
		}
		info, err := r.Do(t.Context(), "INFO", "stats")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(fmt.Sprint(info), "evicted_keys:") || strings.Contains(fmt.Sprint(info), "evicted_keys:0\r") {
			t.Errorf("Redis evicted no key: %v", info)
		}
		// The spent client's counter, if Redis evicted it, is gone: the
		// client starts afresh. That is what the warning is about.
		key := fmt.Sprintf("fill_user_spent_%d", time.Now().Unix()/3600*3600)
		exists, err := r.Do(t.Context(), "EXISTS", key)
		if err != nil {
			t.Fatal(err)
		}
		got := spentAnswer(t, p)
		t.Logf("after the flood the spent counter exists: %v; the spent client is answered %s", exists, got)
		if want := map[bool]string{true: "OVER_LIMIT", false: "OK"}[exists == int64(1)]; got != want {
			t.Errorf("spent client with its counter exists=%v: %s, want %s", exists, got, want)
		}
	})
	t.Run("noeviction", func(t *testing.T) {
		_, p := redis(t, "noeviction")
		f := fills(t, p, "ratelimit.redis.", capBytes, 0)
		if f.exhausted == 0 || f.other != 0 {
			t.Errorf("flooding a full Redis with noeviction: %+v, want ResourceExhausted for writes that need memory and no other error", f)
		}
		// Redis refuses every increment while full, an existing key's too.
		got := spentAnswer(t, p)
		if got != "OVER_LIMIT" && got != codes.ResourceExhausted.String() {
			t.Errorf("the spent client with Redis full: %s, want OVER_LIMIT or ResourceExhausted, never OK", got)
		}
		t.Logf("flood %+v; the spent client is answered %s", f, got)
		if code := p.healthCode(); code != http.StatusOK {
			t.Errorf("/healthcheck with Redis full: %d, want 200 (an answer, not an outage)", code)
		}
		if st := p.stats(t); st["ratelimit.redis.breaker_trips"] != 0 {
			t.Errorf("breaker_trips = %d with Redis full, want 0", st["ratelimit.redis.breaker_trips"])
		}
		// The quota service's replica beat is a write too: refused, it
		// is told as a full store, not an unreachable one.
		eventually(t, "the quota service says the shared store is full", 15*time.Second, func() bool {
			return strings.Contains(p.logs(), "quota: the shared store is full")
		})
		if strings.Contains(p.logs(), "unreachable") {
			t.Errorf("the log calls a full Redis unreachable:\n%s", p.logs())
		}
	})
}

// TestMemcachedFills is TestRedisFills on a small memcached: with its
// default (evictions on) it drops items, the spent client's among them,
// and the service warns at start; with -M it refuses new items, which the
// service answers ResourceExhausted, and the spent counter stays.
func TestMemcachedFills(t *testing.T) {
	slow(t)
	busyParallel(t)
	t.Run("evictions", func(t *testing.T) {
		m := harness.StartMemcached(t, "-m", "2")
		p := start(t, map[string]string{"fill.yaml": fillRules}, memcacheEnv(m)...)
		if f := fills(t, p, "ratelimit.memcache.", 2<<20, 1); f.other != 0 || f.exhausted != 0 {
			t.Errorf("flooding: %+v, want every request decided", f)
		}
		stats, err := m.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(stats["evictions"]); n == 0 {
			t.Errorf("memcached evicted nothing: %v", stats)
		}
		t.Logf("after the flood the spent client is answered %s (memcached evicted %s items)", spentAnswer(t, p), stats["evictions"])
	})
	t.Run("no_evictions", func(t *testing.T) {
		m := harness.StartMemcached(t, "-m", "2", "-M")
		p := start(t, map[string]string{"fill.yaml": fillRules}, memcacheEnv(m)...)
		f := fills(t, p, "ratelimit.memcache.", 2<<20, 0)
		if f.exhausted == 0 || f.other != 0 {
			t.Errorf("flooding a full memcached with -M: %+v, want ResourceExhausted for new items and no other error", f)
		}
		got := spentAnswer(t, p)
		if got != "OVER_LIMIT" {
			t.Errorf("the spent client with memcached full: %s, want OVER_LIMIT (its item stays)", got)
		}
		t.Logf("flood %+v; the spent client is answered %s", f, got)
		if code := p.healthCode(); code != http.StatusOK {
			t.Errorf("/healthcheck with memcached full: %d, want 200", code)
		}
	})
}
