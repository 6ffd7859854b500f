package redis

import (
	"testing"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/storetest"
)

// newStore returns a Store on cfg, closed in t.Cleanup.
func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// serverClock is the production clock: Redis TIME for every algorithm but
// fixed windows, whose window is in the key.
func serverClock(a rules.Algorithm) storetest.Clock {
	if a == rules.FixedWindow {
		return storetest.BatchClock
	}
	return storetest.ServerClock
}

func TestStore(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	t.Run("knows_one_server", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, Config{URL: srv.Addr})
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !s.main.oneServer.Load() {
			t.Error("a plain redis-server was not recognised: all-or-nothing batches would take one script per key")
		}
	})
	t.Run("script_clock", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) limiter.Store {
			return newStore(t, Config{URL: srv.Addr, scriptClock: true})
		}, storetest.Options{})
	})
	t.Run("redis_time", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) limiter.Store {
			return newStore(t, Config{URL: srv.Addr})
		}, storetest.Options{Clock: serverClock})
	})
}
