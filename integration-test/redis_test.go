package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

const sharedRules = `domain: shared
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 50, algorithm: token_bucket}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 50, algorithm: sliding_log}
`

func redisEnv(r *harness.RedisServer, extra ...string) []string {
	return append([]string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr}, extra...)
}

// TestInstancesShareCountsThroughRedis runs two service processes on one
// Redis and hammers one key through both: exactly the limit is admitted.
func TestInstancesShareCountsThroughRedis(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	testInstancesShareCounts(t, redisEnv(r))
}

// testInstancesShareCounts starts two instances with env and sends 200
// requests for each algorithm's key through both, 8 clients at once.
func testInstancesShareCounts(t *testing.T, env []string) {
	a := start(t, map[string]string{"shared.yaml": sharedRules}, env...)
	b := start(t, map[string]string{"shared.yaml": sharedRules}, env...)
	for _, key := range []string{"user", "tb", "log"} {
		t.Run(key, func(t *testing.T) {
			var ok, over atomic.Int64
			var wg sync.WaitGroup
			for i, p := range []*proc{a, b, a, b, a, b, a, b} {
				c := p.client(t)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 25 {
						resp, err := c.ShouldRateLimit(callCtx(t), request("shared", key, "same"))
						if err != nil {
							t.Errorf("client %d: %v", i, err)
							return
						}
						if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
							ok.Add(1)
						} else {
							over.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 50 || over.Load() != 150 {
				t.Errorf("%s: %d admitted, %d refused across two instances; want exactly 50 and 150", key, ok.Load(), over.Load())
			}
		})
	}
}

func TestRedisDownAtStartupThenUp(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	p := launch(t, map[string]string{"shared.yaml": sharedRules}, redisEnv(r, "REDIS_TIMEOUT=200ms")...)
	p.waitHealth(t, 500) // ports open, unhealthy
	c := p.client(t)
	if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "x")); status.Code(err) != codes.Unavailable {
		t.Errorf("with Redis down: %v, want Unavailable", err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	p.waitHealth(t, 200)
	if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "x")); err != nil {
		t.Errorf("after Redis came up: %v", err)
	}
}

func TestRedisOutageFailsFastAndRecovers(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	testOutageFailsFastAndRecovers(t, r.Stop, r.Start,
		redisEnv(r, "REDIS_TIMEOUT=100ms", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true"))
}

// testOutageFailsFastAndRecovers serves with env, stops the store, expects
// fast Unavailable answers and an unhealthy service, starts the store again
// and expects health and answers back.
func testOutageFailsFastAndRecovers(t *testing.T, stop, restart func() error, env []string) {
	p := start(t, map[string]string{"shared.yaml": sharedRules}, env...)
	c := p.client(t)
	// Serving before the outage. With a store timeout of 100 ms, one
	// round trip can time out on a loaded machine: the first answer is
	// awaited, not required of the first try.
	eventually(t, "a decision before the outage", 10*time.Second, func() bool {
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "o"))
		return err == nil
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		began := time.Now()
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", fmt.Sprint("o", i)))
		if status.Code(err) != codes.Unavailable {
			t.Errorf("during the outage: %v, want Unavailable", err)
		}
		// Generous against a loaded machine; the point is "not 10 s".
		if d := time.Since(began); d > 2*time.Second {
			t.Errorf("error took %v; the store timeout is under a second", d)
		}
	}
	p.waitHealth(t, 500)
	if err := restart(); err != nil {
		t.Fatal(err)
	}
	p.waitHealth(t, 200)
	for i := range 20 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", fmt.Sprint("after", i))); err != nil {
			t.Fatalf("request %d after the store returned: %v", i, err)
		}
	}
}

func TestRedisKeysAreTheAnchors(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	p := start(t, map[string]string{"shared.yaml": sharedRules}, redisEnv(r, "CACHE_KEY_PREFIX=pfx:")...)
	before := time.Now().Unix()
	if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("shared", "user", "alice")); err != nil {
		t.Fatal(err)
	}
	after := time.Now().Unix()
	// envoyproxy/ratelimit's key: prefix + domain + "_" + key_value_ + window start.
	found := false
	for ts := before / 3600 * 3600; ts <= after/3600*3600; ts += 3600 {
		v, err := r.Do(context.Background(), "GET", fmt.Sprintf("pfx:shared_user_alice_%d", ts))
		if err == nil && fmt.Sprint(v) == "1" {
			found = true
		}
	}
	if !found {
		keys, _ := r.Do(context.Background(), "KEYS", "*")
		t.Errorf("no anchor-format key with count 1; keys in Redis: %v", keys)
	}
}
