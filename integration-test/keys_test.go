package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// nestedRules is a rule k1 -> k2 allowing one request a year: the second
// request on a key is over the limit. (A year window changes once a year;
// a run that straddles it would see the second request admitted.)
const nestedRules = `domain: esc
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {unit: year, requests_per_unit: 1}
`

// sendPair sends (k1=x_k2_y)(k2=z), then (k1=x)(k2=y_k2_z), and returns the
// second answer: OK when the two count on keys of their own, OVER_LIMIT
// when they share one. In the anchor's format both are
// "esc_k1_x_k2_y_k2_z_<year>": a client who controls a value spends the
// budget of another.
func sendPair(t *testing.T, p *proc) rlsv3.RateLimitResponse_Code {
	t.Helper()
	c := p.client(t)
	first, err := c.ShouldRateLimit(callCtx(t), request("esc", "k1", "x_k2_y", "k2", "z"))
	if err != nil {
		t.Fatal(err)
	}
	if first.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v, want OK", first.GetOverallCode())
	}
	second, err := c.ShouldRateLimit(callCtx(t), request("esc", "k1", "x", "k2", "y_k2_z"))
	if err != nil {
		t.Fatal(err)
	}
	return second.GetOverallCode()
}

// TestKeysCannotCollide: values holding '_' never make two descriptors
// share a counter on the memory store (always escaped) and on Redis and
// Memcached with CACHE_KEY_FORMAT=escaped.
func TestKeysCannotCollide(t *testing.T) {
	tests := []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"memory_default", func(*testing.T) []string { return nil }},
		{"memory_ignores_anchor", func(*testing.T) []string { return []string{"CACHE_KEY_FORMAT=anchor"} }},
		{"redis_escaped", func(t *testing.T) []string {
			return redisEnv(harness.StartRedis(t, harness.RedisOptions{}), "CACHE_KEY_FORMAT=escaped")
		}},
		{"memcached_escaped", func(t *testing.T) []string {
			return memcacheEnv(harness.StartMemcached(t), "CACHE_KEY_FORMAT=escaped")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := start(t, map[string]string{"esc.yaml": nestedRules}, tt.env(t)...)
			if code := sendPair(t, p); code != rlsv3.RateLimitResponse_OK {
				t.Errorf("(k1=x)(k2=y_k2_z) after (k1=x_k2_y)(k2=z): %v, want OK (a counter of its own)", code)
			}
		})
	}
}

// TestRedisEscapedKeyName reads the escaped key back from Redis.
func TestRedisEscapedKeyName(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	p := start(t, map[string]string{"esc.yaml": nestedRules}, redisEnv(r, "CACHE_KEY_FORMAT=escaped", "CACHE_KEY_PREFIX=pfx_")...)
	sendPair(t, p)
	year := time.Now().Unix() / (365 * 86400) * (365 * 86400)
	for _, key := range []string{`pfx_esc_k1_x\_k2\_y_k2_z_%d`, `pfx_esc_k1_x_k2_y\_k2\_z_%d`} {
		key = fmt.Sprintf(key, year)
		if v, err := r.Do(context.Background(), "GET", key); err != nil || fmt.Sprint(v) != "1" {
			keys, _ := r.Do(context.Background(), "KEYS", "*")
			t.Errorf("GET %s = %v, %v; want 1. Keys in Redis: %v", key, v, err, keys)
		}
	}
}

// TestAnchorKeysCollide documents the anchor's behaviour, kept by default
// on Redis and Memcached so that a rolling upgrade from envoyproxy/ratelimit
// keeps counting on the same keys: the two requests share one counter.
func TestAnchorKeysCollide(t *testing.T) {
	tests := []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"redis_default", func(t *testing.T) []string { return redisEnv(harness.StartRedis(t, harness.RedisOptions{})) }},
		{"memcached_anchor", func(t *testing.T) []string {
			return memcacheEnv(harness.StartMemcached(t), "CACHE_KEY_FORMAT=anchor")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := start(t, map[string]string{"esc.yaml": nestedRules}, tt.env(t)...)
			if code := sendPair(t, p); code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("(k1=x)(k2=y_k2_z) after (k1=x_k2_y)(k2=z): %v, want OVER_LIMIT (the anchor's shared key)", code)
			}
		})
	}
}
