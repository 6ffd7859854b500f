package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// refundRules give the AI gateway of TestRealEnvoyRefund 100 tokens an hour.
const refundRules = `domain: ai
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// refundRoutes: /chat reserves the request's x-max-tokens and, when the
// response is done, gives back its x-unused-tokens (is_negative_hits on
// the rate limit's hits_addend, sent by Envoy 1.40); /giveback gives back
// x-refund on the request path, where Envoy acts on the answer.
const refundRoutes = `
              - match: {prefix: /chat}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    # On the request: reserve the most the answer may cost.
                    - actions: [{generic_key: {descriptor_value: tokens}}]
                      hits_addend: {format: "%REQ(x-max-tokens)%"}
                    # When the response is done: give back what it did not use.
                    - actions: [{generic_key: {descriptor_value: tokens}}]
                      hits_addend: {format: "%RESP(x-unused-tokens)%", is_negative_hits: true}
                      apply_on_stream_done: true
              - match: {prefix: /giveback}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{generic_key: {descriptor_value: tokens}}]
                      hits_addend: {format: "%REQ(x-refund)%", is_negative_hits: true}`

// TestRealEnvoyRefund: reserve-then-refund as AI gateways charge tokens,
// with Envoy 1.40 sending is_negative_hits, on Redis, with the near cache
// on. A request reserves its x-max-tokens; when its response ends, Envoy
// gives back the unused part, and the next requests see the budget that
// is really spent. A refund on the request path is answered OK while the
// key is over its limit (and known so to the near cache), reaches Redis,
// and the next reservation is decided by Redis again.
func TestRealEnvoyRefund(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	counts := newRedisCounts(t, r)
	p := start(t, map[string]string{"ai.yaml": refundRules}, redisEnv(r, "LOCAL_CACHE_SIZE_IN_BYTES=1048576")...)
	up := startUpstream(t)
	up.respond = func(req *http.Request, h http.Header) {
		reserved, _ := strconv.Atoi(req.Header.Get("x-max-tokens"))
		used, _ := strconv.Atoi(req.Header.Get("x-used-tokens"))
		h.Set("x-unused-tokens", strconv.Itoa(max(reserved-used, 0)))
	}
	e, _ := startEnvoyHTTP(t, envoyHTTP{Routes: refundRoutes, Filters: rateLimitFilter("ai", "")}, up, p)
	addr := e.listener(t, "http")
	awaitWindowRoom(t, time.Hour, time.Minute)

	const key = "ai_generic_key_tokens_"
	// calls is the number of calls the service answered; a step waits for
	// its calls, so that a refund Envoy sends after the client has its
	// answer is done before the next request is decided.
	calls := 0
	answered := func(t *testing.T) (n int) {
		for name, v := range p.stats(t) {
			if strings.HasPrefix(name, "ratelimit.service.decisions.") && strings.Contains(name, "__domain=ai") {
				n += int(v)
			}
		}
		return n
	}
	step := func(path string, h map[string]string, want, sends int, spent int64) {
		t.Helper()
		if got := httpGet(t, addr, path, h); got.code != want {
			t.Fatalf("%s %v: HTTP %d, want %d", path, h, got.code, want)
		}
		calls += sends
		eventually(t, fmt.Sprintf("%d calls answered", calls), 10*time.Second, func() bool { return answered(t) == calls })
		if got := counts.fixedWindowSum(t, key); got != spent {
			t.Fatalf("after %s %v Redis holds %d tokens spent, want %d", path, h, got, spent)
		}
	}
	chat := func(maxTokens, used int) map[string]string {
		return map[string]string{"x-max-tokens": strconv.Itoa(maxTokens), "x-used-tokens": strconv.Itoa(used)}
	}

	// Each answered /chat makes two calls: the reservation, and the
	// refund when the response is done.
	step("/chat", chat(40, 10), 200, 2, 10) // 40 reserved, 30 given back
	// Without the refund 40 + 80 would pass the 100.
	step("/chat", chat(80, 80), 200, 2, 90) // nothing to give back: a refund of 0
	// A fixed window counts the refused reservation, as the anchor does;
	// Envoy gives nothing back for its own 429, which has no x-unused-tokens.
	step("/chat", chat(20, 0), 429, 1, 110)
	step("/chat", chat(5, 0), 429, 1, 110) // from the near cache: Redis is not asked
	// A refund on the request path: Envoy acts on this answer, and it is
	// OK though the key is over its limit and in the near cache.
	step("/giveback", map[string]string{"x-refund": "30"}, 200, 1, 80)
	step("/chat", chat(20, 20), 200, 2, 100) // the refund dropped the key from the near cache
	step("/chat", chat(1, 0), 429, 1, 101)

	if n := e.counter(t, "cluster.upstream.ratelimit.error"); n != 0 {
		t.Errorf("Envoy's ratelimit.error = %d, want 0: every refund was answered", n)
	}
	name := "ratelimit.service.rate_limit.ai.generic_key_tokens.total_negative_hits"
	if got := p.stats(t)[name]; got != 30+0+30 {
		t.Errorf("%s = %d, want 60 (30 and 0 when the responses ended, 30 on the request path)", name, got)
	}
}
