package integration

import (
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/harness"
)

const writeBehindRules = `domain: wb
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 20}
`

// TestWriteBehindOverTheWire: two instances writing behind to one Redis
// every 20 ms, offered 5 hits each in turn on a limit of 20 an hour (each
// burst flushed and folded before the next), admit at least 20 and at most
// 25, the bound (2 − 1) × 5 over the limit; Redis holds every hit. Then,
// with Redis stopped, an instance decides alone, counts those decisions,
// stays healthy, and merges their hits into Redis once it is back.
func TestWriteBehindOverTheWire(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	env := redisEnv(r, "WRITE_BEHIND_INTERVAL=20ms", "STORE_BREAKER_FAILURES=3", "STORE_BREAKER_PROBE_INTERVAL=100ms")
	rules := map[string]string{"wb.yaml": writeBehindRules}
	fleet := []*proc{start(t, rules, env...), start(t, rules, env...)}
	rc := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	defer rc.Close()
	// stored is the user's count in Redis, -1 when it cannot be read.
	stored := func(user string) int64 {
		keys, err := rc.Keys(t.Context(), "wb_user_"+user+"_*").Result()
		if err != nil || len(keys) != 1 {
			return -1
		}
		n, err := rc.Get(t.Context(), keys[0]).Int64()
		if err != nil {
			return -1
		}
		return n
	}
	// The counts are of one hour window (a few seconds here, up to a
	// minute on a busy machine).
	clearOfHourEnd(t, time.Minute)
	admitted, offered := 0, 0
	for range 4 {
		for _, p := range fleet {
			c := p.client(t)
			for range 5 {
				resp, err := c.ShouldRateLimit(callCtx(t), request("wb", "user", "alice"))
				if err != nil {
					t.Fatal(err)
				}
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					admitted++
				}
			}
			offered += 5
			eventually(t, "every hit in Redis", 10*time.Second, func() bool { return stored("alice") == int64(offered) })
			// A check-only read: the instance's count is the fleet's.
			read := request("wb", "user", "alice")
			read.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
			eventually(t, "the fleet's count folded in", 10*time.Second, func() bool {
				resp, err := c.ShouldRateLimit(callCtx(t), read)
				return err == nil && int(resp.GetStatuses()[0].GetLimitRemaining()) == max(0, 20-offered)
			})
		}
	}
	if admitted < 20 || admitted > 25 {
		t.Errorf("admitted %d of %d, want 20..25", admitted, offered)
	}

	p := fleet[0]
	c := p.client(t)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	sent := 0
	eventually(t, "a decision counted as local-only", 10*time.Second, func() bool {
		if _, err := c.ShouldRateLimit(callCtx(t), request("wb", "user", "bob")); err != nil {
			t.Fatalf("with Redis stopped: %v, want a local decision", err)
		}
		sent++
		return p.stats(t)["ratelimit.write_behind.local_decisions"] > 0
	})
	if code := p.healthCode(); code != http.StatusOK {
		t.Errorf("/healthcheck %d with Redis stopped, want 200", code)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the outage's hits merged into Redis", 10*time.Second, func() bool { return stored("bob") == int64(sent) })
}
