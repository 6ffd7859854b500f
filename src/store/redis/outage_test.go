package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// hitOnce sends one single-op batch on key and returns the error.
func hitOnce(ctx context.Context, s *Store, key string, alg rules.Algorithm) error {
	b := &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{{
		Key: key, Algorithm: alg, Limit: 1 << 30, Window: time.Hour, Hits: 1,
	}}}
	return s.Do(ctx, b)
}

// TestOutage stops redis-server under traffic and starts it again: requests
// fail with ErrUnavailable only while it is down, within the timeout, health
// follows (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION), every request sent after
// Redis is back succeeds, and Close leaves no goroutine behind. It runs over
// plain TCP and over TLS, whose stale connections go-redis cannot probe by
// itself.
func TestOutage(t *testing.T) {
	tests := []struct {
		name string
		opts harness.RedisOptions
	}{
		{"tcp", harness.RedisOptions{}},
		{"tls", harness.RedisOptions{TLS: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := harness.StartRedis(t, tt.opts)
			cfg := Config{
				URL:                         srv.Addr,
				Timeout:                     500 * time.Millisecond,
				PoolSize:                    4,
				HealthCheckActiveConnection: true,
				HealthCheckInterval:         50 * time.Millisecond,
			}
			if srv.TLS != nil {
				cfg.TLS = srv.TLS.ClientConfig()
			}
			goroutines := runtime.NumGoroutine()
			s, err := New(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			harness.WaitFor(t, 5*time.Second, "healthy at start", s.Healthy)

			var (
				mu       sync.Mutex
				down     bool      // the server is stopped or stopping
				upSince  time.Time // Start returned
				failures []string
				slow     atomic.Int64
				okDown   atomic.Int64 // requests that failed while down
				served   atomic.Int64 // requests answered
				stop     = make(chan struct{})
				wg       sync.WaitGroup
			)
			for g := range 8 {
				wg.Go(func() {
					algs := rules.Algorithms
					for i := 0; i < 100_000; i++ { // bounded; stopped long before
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						wasDown, since := down, upSince
						mu.Unlock()
						start := time.Now()
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						alg := algs[i%len(algs)]
						err := hitOnce(ctx, s, fmt.Sprintf("outage_%d_%s", g, alg), alg)
						cancel()
						took := time.Since(start)
						if err != nil && !errors.Is(err, limiter.ErrUnavailable) {
							mu.Lock()
							failures = append(failures, fmt.Sprintf("error not wrapping ErrUnavailable: %v", err))
							mu.Unlock()
						}
						if took > cfg.Timeout+300*time.Millisecond {
							slow.Add(1)
						}
						mu.Lock()
						nowDown := down
						switch {
						case err == nil:
							served.Add(1)
						case wasDown || nowDown:
							okDown.Add(1)
						case !since.IsZero() && start.After(since):
							failures = append(failures, fmt.Sprintf("request sent %v after Redis was back failed: %v", start.Sub(since), err))
						case since.IsZero():
							failures = append(failures, fmt.Sprintf("request failed before the outage: %v", err))
						}
						mu.Unlock()
						time.Sleep(time.Millisecond) // pacing: leave the shared cores to Redis
					}
				})
			}

			harness.WaitFor(t, 5*time.Second, "the load answered before the outage", func() bool { return served.Load() >= 100 })
			mu.Lock()
			down = true
			mu.Unlock()
			if err := srv.Stop(); err != nil {
				t.Fatal(err)
			}
			harness.WaitFor(t, 3*time.Second, "unhealthy while down", func() bool { return !s.Healthy() })
			harness.WaitFor(t, 5*time.Second, "the load met the outage", func() bool { return okDown.Load() >= 32 })
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			down, upSince = false, time.Now()
			mu.Unlock()
			harness.WaitFor(t, 3*time.Second, "healthy again", s.Healthy)
			back := served.Load()
			harness.WaitFor(t, 5*time.Second, "the load answered after the restart", func() bool { return served.Load() >= back+100 })
			close(stop)
			wg.Wait()

			mu.Lock()
			defer mu.Unlock()
			for _, f := range failures {
				t.Error(f)
			}
			if n := slow.Load(); n > 0 {
				t.Errorf("%d requests took longer than the timeout (%v)", n, cfg.Timeout)
			}

			// A quiet outage: no traffic while Redis is down, so the pool
			// still holds connections to the dead process. The first
			// request after the restart must not hit one.
			for i := range 4 {
				if err := hitOnce(t.Context(), s, fmt.Sprintf("quiet_%d", i), rules.FixedWindow); err != nil {
					t.Fatalf("before the quiet outage: %v", err)
				}
			}
			if err := srv.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				alg := rules.Algorithms[i%len(rules.Algorithms)]
				if err := hitOnce(t.Context(), s, "quiet_"+alg.String(), alg); err != nil {
					t.Fatalf("request %d after a quiet restart: %v", i, err)
				}
			}

			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := hitOnce(t.Context(), s, "closed", rules.FixedWindow); !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Do after Close = %v, want ErrUnavailable", err)
			}
			harness.CheckGoroutines(t, goroutines)
		})
	}
}

// TestStartsWithRedisDown: New succeeds with Redis unreachable, the store is
// unhealthy and fails fast, and it becomes healthy by itself once Redis
// answers; without the active check it then stays healthy through an outage.
func TestStartsWithRedisDown(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Config{
		URL:                    srv.Addr,
		Timeout:                300 * time.Millisecond,
		StartupInitialInterval: 20 * time.Millisecond,
		StartupMaxInterval:     100 * time.Millisecond,
	})
	if s.Healthy() {
		t.Error("Healthy() = true before Redis ever answered")
	}
	start := time.Now()
	err := hitOnce(t.Context(), s, "down", rules.FixedWindow)
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do with Redis down = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Do with Redis down took %v, want within the 300ms timeout", d)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	if err := s.WaitStarted(ctx); err == nil {
		t.Error("WaitStarted = nil with Redis down")
	}
	cancel()

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := s.WaitStarted(ctx); err != nil {
		t.Fatalf("WaitStarted after Redis came up: %v", err)
	}
	if !s.Healthy() {
		t.Error("Healthy() = false after Redis answered")
	}
	// Without REDIS_HEALTH_CHECK_ACTIVE_CONNECTION health stays true, as in
	// the anchor.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	_ = hitOnce(t.Context(), s, "down", rules.FixedWindow)
	if !s.Healthy() {
		t.Error("Healthy() = false during an outage without the active check")
	}
}

// TestDeadline: a caller's deadline shorter than Redis's answer returns
// ErrUnavailable at that deadline, not at the store's timeout.
func TestDeadline(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, Timeout: 5 * time.Second, PoolSize: 1})
	if err := hitOnce(t.Context(), s, "warm", rules.FixedWindow); err != nil {
		t.Fatal(err)
	}
	// Make Redis hold every command for a while.
	if _, err := srv.Do(t.Context(), "CLIENT", "PAUSE", "500", "ALL"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := hitOnce(ctx, s, "slow", rules.FixedWindow)
	if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do past its deadline = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Errorf("Do returned after %v, want about its 100ms deadline", d)
	}
}
