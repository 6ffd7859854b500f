package server

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// TestRedisStallSetting: REDIS_STALL_TIMEOUT reaches the Redis store as
// its Stall, its 0 as the store's "no bound" (the store's own zero is its
// default, 250ms).
func TestRedisStallSetting(t *testing.T) {
	tests := []struct {
		name  string
		value string // "" leaves it unset
		want  time.Duration
	}{
		{"unset", "", 250 * time.Millisecond},
		{"off", "0", -1},
		{"set", "40ms", 40 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("REDIS_STALL_TIMEOUT", tt.value)
			if tt.value == "" {
				os.Unsetenv("REDIS_STALL_TIMEOUT")
			}
			set, err := settings.Load()
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := redisConfig(set)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Stall != tt.want {
				t.Errorf("REDIS_STALL_TIMEOUT=%q: Stall = %v, want %v", tt.value, cfg.Stall, tt.want)
			}
		})
	}
}

// TestWriteBehind: with WRITE_BEHIND_INTERVAL a shared store decides from
// local counts, writes them behind (its statistics count the batches), and
// a rule of another algorithm is refused at load with the reason.
func TestWriteBehind(t *testing.T) {
	srv := harness.StartRedis(t, harness.RedisOptions{})
	for k, v := range map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr,
		"WRITE_BEHIND_INTERVAL": "10ms"} {
		t.Setenv(k, v)
	}
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	reg := stats.NewRegistry()
	b, err := newStoreHandle(t.Context(), set, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	opts := rulesFileConfig(set, b).Options
	_, err = rules.Parse([]rules.File{{Name: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n" +
		"    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: sliding_window}\n")}}, opts)
	if err == nil || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "bounds its over-admission on fixed_window only") {
		t.Errorf("a sliding_window rule with write-behind: %v, want it refused with the reason", err)
	}
	op := limiter.Op{Key: "d_k_v_0", Algorithm: rules.FixedWindow, Limit: 5, Window: time.Minute, Hits: 1}
	if err := b.store.Do(t.Context(), &limiter.Batch{Ops: []limiter.Op{op}}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "a batch written behind", func() bool {
		return reg.Snapshot()["ratelimit.write_behind.batches"] > 0
	})
	if !b.alone || b.timeout != 0 {
		t.Errorf("alone, timeout = %v, %v: want decisions without a store budget, health not following the store", b.alone, b.timeout)
	}
}
