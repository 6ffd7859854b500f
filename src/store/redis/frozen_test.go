package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// fastFail is how soon a request refused without waiting must return, on a
// loaded machine.
const fastFail = time.Second

// freeze waits until s's workers are idle, so that the test can tell when
// its next requests are in flight, then stops srv with SIGSTOP and resumes
// it in t.Cleanup, if the test has not.
func freeze(t *testing.T, s *Store, srv *harness.RedisServer) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, "idle workers", func() bool {
		q, busy := queueState(s.main)
		return q == 0 && busy == 0
	})
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
}

// queueState is the backend's queue and workers, for polling.
func queueState(be *backend) (queued, busy int) {
	be.mu.Lock()
	defer be.mu.Unlock()
	return len(be.queue), be.busy - be.starting
}

// outcome is what a request of goDo got, and how long it took.
type outcome struct {
	err  error
	took time.Duration
}

// goDo runs hitOnce on key in a goroutine with a deadline of d.
func goDo(s *Store, key string, d time.Duration) <-chan outcome {
	c := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		err := hitOnce(ctx, s, key, rules.FixedWindow)
		c <- outcome{err, time.Since(start)}
	}()
	return c
}

// TestQueueBound freezes Redis under a load: the requests beyond MaxQueue
// fail at once with ErrOverloaded and are counted, the store stays
// healthy, a caller's short deadline is honoured although the store's
// timeout is long, and everything queued is answered once Redis resumes.
func TestQueueBound(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	const maxQueue = 8
	s := newStore(t, Config{
		URL: srv.Addr, PoolSize: 1, MaxQueue: maxQueue, Timeout: 30 * time.Second,
		HealthCheckActiveConnection: true, HealthCheckInterval: time.Hour,
	})
	if err := hitOnce(t.Context(), s, "warm", rules.FixedWindow); err != nil {
		t.Fatal(err)
	}
	freeze(t, s, srv)

	// The one worker takes a request into a round trip that cannot end.
	var live []<-chan outcome
	live = append(live, goDo(s, "stuck", time.Minute))
	harness.WaitFor(t, 10*time.Second, "the worker stuck in a round trip", func() bool {
		q, busy := queueState(s.main)
		return q == 0 && busy == 1
	})

	// A caller's deadline bounds its wait, not Config.Timeout, and its
	// request leaves the queue.
	o := <-goDo(s, "deadline", 50*time.Millisecond)
	if o.took > fastFail {
		t.Errorf("Do with a 50ms deadline on a frozen Redis returned after %v", o.took)
	}
	if !errors.Is(o.err, limiter.ErrUnavailable) || !errors.Is(o.err, context.DeadlineExceeded) {
		t.Errorf("Do past its deadline = %v, want ErrUnavailable and DeadlineExceeded", o.err)
	}
	if q, _ := queueState(s.main); q != 0 {
		t.Errorf("%d requests queued after the only waiting one gave up, want 0", q)
	}

	for i := range maxQueue {
		live = append(live, goDo(s, fmt.Sprint("queued_", i), time.Minute))
	}
	harness.WaitFor(t, 10*time.Second, "a full queue", func() bool {
		q, _ := queueState(s.main)
		return q == maxQueue
	})

	// Beyond it, requests fail at once. (Their deadline is short enough
	// for the test to end if they waited instead.)
	const extra = 50
	var shed []<-chan outcome
	for i := range extra {
		shed = append(shed, goDo(s, fmt.Sprint("shed_", i), 5*time.Second))
	}
	for i, c := range shed {
		o := <-c
		if !errors.Is(o.err, limiter.ErrOverloaded) || errors.Is(o.err, limiter.ErrUnavailable) {
			t.Errorf("request %d beyond a full queue: %v, want ErrOverloaded and not ErrUnavailable", i, o.err)
		}
		if o.took > fastFail {
			t.Errorf("request %d beyond a full queue failed after %v, want at once", i, o.took)
		}
	}
	if got := s.Shed(); got != extra {
		t.Errorf("Shed() = %d, want %d", got, extra)
	}
	if !s.Healthy() {
		t.Error("Healthy() = false after shedding load")
	}

	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	for i, c := range live {
		if o := <-c; o.err != nil {
			t.Errorf("queued request %d after Redis resumed: %v", i, o.err)
		}
	}
	if err := hitOnce(t.Context(), s, "after", rules.FixedWindow); err != nil {
		t.Errorf("Do after Redis resumed: %v", err)
	}
	if !s.Healthy() {
		t.Error("Healthy() = false after Redis resumed")
	}
}

// TestCloseFrozen: Close returns at once although Redis is frozen with
// round trips in flight (and the health probe in one) and the timeout is
// long: the server's 10 s drain relies on it. Every Do in flight fails
// with ErrUnavailable and no goroutine is left behind.
func TestCloseFrozen(t *testing.T) {
	srv := harness.StartRedis(t, harness.RedisOptions{})
	goroutines := runtime.NumGoroutine()
	const poolSize = 2
	s, err := New(t.Context(), Config{
		URL: srv.Addr, PoolSize: poolSize, Timeout: 30 * time.Second,
		HealthCheckActiveConnection: true, HealthCheckInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := hitOnce(t.Context(), s, "warm", rules.FixedWindow); err != nil {
		t.Fatal(err)
	}
	freeze(t, s, srv)

	var inFlight []<-chan outcome
	for i := range poolSize {
		inFlight = append(inFlight, goDo(s, fmt.Sprint("in_flight_", i), time.Minute))
		harness.WaitFor(t, 10*time.Second, "a worker stuck in a round trip", func() bool {
			q, busy := queueState(s.main)
			return q == 0 && busy == i+1
		})
	}
	for i := range 4 {
		inFlight = append(inFlight, goDo(s, fmt.Sprint("queued_", i), time.Minute))
	}

	start := time.Now()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	d := time.Since(start)
	t.Logf("Close on a frozen Redis took %v", d)
	if d > fastFail {
		t.Errorf("Close on a frozen Redis took %v, want within %v", d, fastFail)
	}
	for i, c := range inFlight {
		if o := <-c; !errors.Is(o.err, limiter.ErrUnavailable) {
			t.Errorf("Do %d in flight at Close: %v, want ErrUnavailable", i, o.err)
		}
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	harness.CheckGoroutines(t, goroutines)
}

// TestFrozenFailsFast freezes Redis, over TCP, TLS and a unix socket, with
// a store timeout (REDIS_TIMEOUT) of a minute and callers allowing 20
// times the stall bound: the round trips in flight fail, Unavailable, once
// Redis has been silent for the bound (not at the callers' deadline, nor
// at the store's timeout), the breaker opens at once on that silence, and
// the requests after it are refused at once. Once Redis resumes, requests
// are served again (issue 36: each request waited for its caller's
// deadline until REDIS_TIMEOUT had passed).
func TestFrozenFailsFast(t *testing.T) {
	tests := []struct {
		name string
		opts func(dir string) harness.RedisOptions
	}{
		{"tcp", func(string) harness.RedisOptions { return harness.RedisOptions{} }},
		{"tls", func(string) harness.RedisOptions { return harness.RedisOptions{TLS: true} }},
		{"unix", func(dir string) harness.RedisOptions {
			return harness.RedisOptions{Config: []string{"unixsocket " + dir + "/redis.sock", "unixsocketperm 700"}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			srv := harness.StartRedis(t, tt.opts(dir))
			const stall = 100 * time.Millisecond
			cfg := Config{
				URL: srv.Addr, PoolSize: 4, Timeout: time.Minute, Stall: stall,
				Breaker: breaker.Config{Failures: 5, ProbeInterval: 50 * time.Millisecond},
			}
			switch {
			case srv.TLS != nil:
				cfg.TLS = srv.TLS.ClientConfig()
			case tt.name == "unix":
				cfg.SocketType, cfg.URL = "unix", dir+"/redis.sock"
			}
			s := newStore(t, cfg)
			if err := hitOnce(t.Context(), s, "warm", rules.FixedWindow); err != nil {
				t.Fatal(err)
			}
			freeze(t, s, srv)

			const callers = 8
			var inFlight []<-chan outcome
			for i := range callers {
				inFlight = append(inFlight, goDo(s, fmt.Sprint("frozen_", i), 20*stall))
			}
			for i, c := range inFlight {
				o := <-c
				if !errors.Is(o.err, limiter.ErrUnavailable) || errors.Is(o.err, context.DeadlineExceeded) {
					t.Errorf("request %d in flight on a frozen Redis: %v after %v, want Unavailable before its deadline", i, o.err, o.took)
				}
			}
			if st := s.Breakers(); st.Open != 1 || st.Trips != 1 {
				t.Errorf("Breakers() = %+v after Redis went silent, want one open, one trip", st)
			}
			o := <-goDo(s, "after", 20*stall)
			if !errors.Is(o.err, breaker.ErrOpen) {
				t.Errorf("request after the silence: %v, want the open breaker's refusal", o.err)
			}
			if o.took > stall {
				t.Errorf("the open breaker refused after %v, want at once (< the %v bound)", o.took, stall)
			}

			if err := srv.Thaw(); err != nil {
				t.Fatal(err)
			}
			harness.WaitFor(t, 10*time.Second, "a request served after the thaw", func() bool {
				return hitOnce(t.Context(), s, "thawed", rules.FixedWindow) == nil
			})
		})
	}
}
