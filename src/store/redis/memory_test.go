package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestMemory reads the cap and policy of real servers: from CONFIG GET,
// from INFO where CONFIG is renamed away (as managed Redis services do),
// and of each master of a Cluster.
func TestMemory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		config []string
		want   Memory
		evicts bool
	}{
		{"default", nil, Memory{Server: "redis", Known: true, MaxBytes: 0, Policy: "noeviction"}, false},
		{"lru", []string{"maxmemory 3mb", "maxmemory-policy allkeys-lru"}, Memory{Server: "redis", Known: true, MaxBytes: 3 << 20, Policy: "allkeys-lru"}, true},
		{"noeviction_capped", []string{"maxmemory 3mb", "maxmemory-policy noeviction"}, Memory{Server: "redis", Known: true, MaxBytes: 3 << 20, Policy: "noeviction"}, false},
		{"volatile_without_config", []string{"maxmemory 2mb", "maxmemory-policy volatile-ttl", `rename-command CONFIG ""`},
			Memory{Server: "redis", Known: true, MaxBytes: 2 << 20, Policy: "volatile-ttl"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := harness.StartRedis(t, harness.RedisOptions{Config: tt.config})
			s := newStore(t, Config{URL: srv.Addr, Timeout: time.Second})
			if err := s.WaitStarted(t.Context()); err != nil {
				t.Fatal(err)
			}
			got := s.Memory(t.Context())
			if len(got) != 1 || got[0] != tt.want || got[0].Evicts() != tt.evicts {
				t.Errorf("Memory() = %+v, want [%+v] (evicts %v)", got, tt.want, tt.evicts)
			}
		})
	}
}

// TestMemoryClusterAndProxy: every master of a Cluster answers for itself;
// behind twemproxy, which answers neither CONFIG nor INFO, the policy is
// not known.
func TestMemoryClusterAndProxy(t *testing.T) {
	t.Parallel()
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := harness.StartRedisCluster(t, harness.RedisOptions{Config: []string{"maxmemory 5mb", "maxmemory-policy allkeys-lfu"}})
		s := newStore(t, Config{Type: TypeCluster, URL: c.URL, Timeout: time.Second})
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		got := s.Memory(t.Context())
		if len(got) != 3 {
			t.Fatalf("Memory() = %+v, want the 3 masters", got)
		}
		for _, m := range got {
			if !m.Known || m.MaxBytes != 5<<20 || m.Policy != "allkeys-lfu" || !m.Evicts() || !strings.HasPrefix(m.Server, "redis 127.0.0.1:") {
				t.Errorf("a master: %+v, want 5 MiB allkeys-lfu", m)
			}
		}
	})
	t.Run("twemproxy", func(t *testing.T) {
		t.Parallel()
		proxy := harness.StartTwemproxy(t, harness.StartRedis(t, harness.RedisOptions{}))
		s := newStore(t, Config{URL: proxy.Addr, Timeout: time.Second})
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := s.Memory(t.Context()); len(got) != 1 || got[0].Known || got[0].Evicts() {
			t.Errorf("Memory() through twemproxy = %+v, want one unknown", got)
		}
	})
}
