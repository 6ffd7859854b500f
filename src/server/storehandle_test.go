package server

import (
	"os"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/settings"
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
