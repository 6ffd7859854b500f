package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// The bounds of the breaker tests, generous for a loaded machine running
// -race: a refusal by an open breaker takes microseconds (the tests log
// what they measured), and the store's return is noticed within the probe
// interval.
const (
	breakerDeadline = 300 * time.Millisecond // each request's budget
	breakerTimeout  = 200 * time.Millisecond // the store's own (REDIS_TIMEOUT), where a frozen server must trip
	breakerFast     = 50 * time.Millisecond  // an open breaker's refusal, at most
	breakerRecover  = 2 * time.Second        // from the server's return to requests served
	breakerProbe    = 100 * time.Millisecond
)

// timedHit sends one fixed-window op on key with a deadline of
// breakerDeadline and reports how long it took and the error.
func timedHit(s *Store, key string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), breakerDeadline)
	defer cancel()
	start := time.Now()
	err := hitOnce(ctx, s, key, rules.FixedWindow)
	return time.Since(start), err
}

// openBreaker sends requests on key until one is refused by an open
// breaker, checking that those before it failed as an outage and that
// about failures of them were needed.
func openBreaker(t *testing.T, s *Store, key string, failures int) {
	t.Helper()
	for i := 0; ; i++ {
		took, err := timedHit(s, key)
		if errors.Is(err, breaker.ErrOpen) {
			// The request that makes the last failure may see the breaker
			// open: go-redis's cluster client retries a failed dial.
			if i < failures-1 {
				t.Fatalf("breaker open after %d failures, want %d", i, failures)
			}
			return
		}
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("request %d with the server down: %v (after %v), want ErrUnavailable", i, err, took)
		}
		if i >= failures+2 { // +2: a request may end just before the failure that opens it is counted
			t.Fatalf("breaker still closed after %d failures, want open after %d", i+1, failures)
		}
	}
}

// checkFastRefusals sends 50 requests on key and checks that an open
// breaker refuses each at once, without waiting for the deadline; it logs
// the median and the slowest.
func checkFastRefusals(t *testing.T, s *Store, key string) {
	t.Helper()
	var took []time.Duration
	for range 50 {
		d, err := timedHit(s, key)
		if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("request with the breaker open: %v, want ErrOpen and ErrUnavailable", err)
		}
		took = append(took, d)
	}
	slices.Sort(took)
	t.Logf("refusals by the open breaker: median %v, slowest %v (deadline %v)", took[len(took)/2], took[len(took)-1], breakerDeadline)
	if took[len(took)/2] > breakerFast {
		t.Errorf("median refusal %v, want at once (< %v), not after the %v deadline", took[len(took)/2], breakerFast, breakerDeadline)
	}
}

// waitServed polls requests on key until one succeeds, failing t after
// breakerRecover, and returns how long that took.
func waitServed(t *testing.T, s *Store, key string) time.Duration {
	t.Helper()
	start := time.Now()
	harness.WaitForNil(t, breakerRecover, "served after the server returned", func() error {
		_, err := timedHit(s, key)
		return err
	})
	return time.Since(start)
}

// TestBreakerSingle stops or freezes a single Redis: after Failures
// failures in a row (refused connections, or round trips past the store's
// own timeout) requests fail at once, not after their deadline, the
// breaker shows in Breakers and health, and once Redis is back requests
// are served within breakerRecover.
func TestBreakerSingle(t *testing.T) {
	tests := []struct {
		name          string
		down, return_ func(*harness.RedisServer) error
	}{
		{"stopped", (*harness.RedisServer).Stop, (*harness.RedisServer).Start},
		{"frozen", (*harness.RedisServer).Freeze, (*harness.RedisServer).Thaw},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := harness.StartRedis(t, harness.RedisOptions{})
			const failures = 3
			s := newStore(t, Config{
				URL: srv.Addr, Timeout: breakerTimeout,
				HealthCheckActiveConnection: true, HealthCheckInterval: time.Hour,
				Breaker: breaker.Config{Failures: failures, ProbeInterval: breakerProbe},
			})
			if _, err := timedHit(s, "warm"); err != nil {
				t.Fatal(err)
			}
			if err := tt.down(srv); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Thaw() })
			openBreaker(t, s, "down", failures)
			checkFastRefusals(t, s, "down")
			if st := s.Breakers(); st.Open != 1 || st.Trips != 1 || st.Rejections < 50 {
				t.Errorf("Breakers() = %+v, want 1 open, 1 trip, at least 50 rejections", st)
			}
			if s.Healthy() {
				t.Error("Healthy() = true with the breaker open (HealthCheckActiveConnection)")
			}

			if err := tt.return_(srv); err != nil {
				t.Fatal(err)
			}
			t.Logf("served again %v after Redis returned", waitServed(t, s, "back"))
			if st := s.Breakers(); st.Open != 0 || st.Trips != 1 {
				t.Errorf("Breakers() = %+v after recovery, want none open, 1 trip", st)
			}
			harness.WaitFor(t, breakerRecover, "healthy again", s.Healthy)
		})
	}
}

// TestBreakerClosedIsTold: with HealthCheckActiveConnection Healthy
// counts open breakers, so a breaker that closes is told through
// Config.Answered before a request answered after it is; the first answer
// may have come while it was open (a service started with its Redis
// down), and health would otherwise lag the requests served until its
// next poll.
func TestBreakerClosedIsTold(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	var told harness.HealthTold
	s := newStore(t, Config{
		URL: srv.Addr, HealthCheckActiveConnection: true, HealthCheckInterval: time.Hour,
		Breaker:  breaker.Config{Failures: 1, ProbeInterval: time.Hour},
		Answered: told.Answered,
	})
	told.Watch(s.Healthy)
	if _, err := timedHit(s, "warm"); err != nil {
		t.Fatal(err)
	}
	b := s.backends()[0].server
	b.Failure()
	if s.Healthy() {
		t.Fatal("Healthy() = true with the breaker open")
	}
	mark := told.Mark()
	b.Reset() // as the probe does when the server answers
	if _, err := timedHit(s, "told"); err != nil {
		t.Fatal(err)
	}
	if after := told.Since(mark); !slices.Contains(after, true) {
		t.Errorf("Answered told Healthy %v since the breaker closed, want true before the request's answer", after)
	}
}

// TestBreakerOff: with the breaker off, every request on a frozen Redis
// waits for its deadline, as before the breaker existed.
func TestBreakerOff(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, Timeout: 30 * time.Second})
	if _, err := timedHit(s, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	for i := range 6 {
		took, err := timedHit(s, "off")
		if !errors.Is(err, limiter.ErrUnavailable) || errors.Is(err, breaker.ErrOpen) {
			t.Errorf("request %d: %v, want ErrUnavailable from the deadline", i, err)
		}
		if took < breakerDeadline*9/10 {
			t.Errorf("request %d failed after %v, before its %v deadline", i, took, breakerDeadline)
		}
	}
	if st := s.Breakers(); st != (breaker.Stats{}) {
		t.Errorf("Breakers() = %+v with the breaker off", st)
	}
}

// TestBreakerIgnoresDataErrors: a key holding another type fails its
// requests with ErrData any number of times without opening the breaker:
// Redis answered.
func TestBreakerIgnoresDataErrors(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, Breaker: breaker.Config{Failures: 2, ProbeInterval: breakerProbe}})
	window := time.Now().Unix() / 3600 * 3600
	key := fmt.Sprintf("typed_%d", window)
	if _, err := srv.Do(t.Context(), "HSET", key, "f", "v"); err != nil {
		t.Fatal(err)
	}
	b := &limiter.Batch{Now: time.Unix(window, 0), Ops: []limiter.Op{{
		Key: key, Algorithm: rules.FixedWindow, Limit: 10, Window: time.Hour, Hits: 1,
	}}}
	for i := range 10 {
		if err := s.Do(t.Context(), b); !errors.Is(err, limiter.ErrData) || errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("request %d on a hash: %v, want ErrData only", i, err)
		}
	}
	if st := s.Breakers(); st.Open != 0 || st.Trips != 0 {
		t.Errorf("Breakers() = %+v after data errors, want none open", st)
	}
	if _, err := timedHit(s, "other"); err != nil {
		t.Errorf("another key after the data errors: %v", err)
	}
}

// TestBreakerCluster stops or freezes one master of a three-master
// cluster: only the requests for its slots fail, at once once its breaker
// is open; the other masters' keys are served throughout; the master's
// return closes its breaker within breakerRecover. The cluster keeps
// serving the slots it still covers (cluster-require-full-coverage no):
// by default Redis Cluster refuses every write once a master fails, and
// the other masters' CLUSTERDOWN answers would open their breakers too.
func TestBreakerCluster(t *testing.T) {
	tests := []struct {
		name          string
		down, return_ func(*harness.RedisServer) error
	}{
		{"stopped", (*harness.RedisServer).Stop, (*harness.RedisServer).Start},
		{"frozen", (*harness.RedisServer).Freeze, (*harness.RedisServer).Thaw},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := harness.StartRedisCluster(t, harness.RedisOptions{Config: []string{"cluster-require-full-coverage no"}})
			const failures = 3
			s := newStore(t, Config{
				Type: TypeCluster, URL: c.URL, Timeout: breakerTimeout,
				Breaker: breaker.Config{Failures: failures, ProbeInterval: breakerProbe},
			})
			// A key on the master that goes down, and one on each other.
			down := c.Masters[0]
			keys := map[*harness.RedisServer]string{}
			for i := 0; len(keys) < len(c.Masters) && i < 1000; i++ {
				key := fmt.Sprint("k", i)
				m, err := c.MasterFor(t.Context(), key)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := keys[m]; !ok {
					keys[m] = key
				}
			}
			for _, key := range keys {
				if _, err := timedHit(s, key); err != nil {
					t.Fatalf("%s before the outage: %v", key, err)
				}
			}
			if err := tt.down(down); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = down.Thaw() })
			openBreaker(t, s, keys[down], failures)
			checkFastRefusals(t, s, keys[down])
			for _, m := range c.Masters[1:] {
				for i := range 20 {
					if took, err := timedHit(s, keys[m]); err != nil {
						t.Fatalf("%s on a master still up, request %d: %v after %v", keys[m], i, err, took)
					}
				}
			}
			if st := s.Breakers(); st.Open != 1 || st.Trips != 1 {
				t.Errorf("Breakers() = %+v, want the one master's breaker open", st)
			}

			if err := tt.return_(down); err != nil {
				t.Fatal(err)
			}
			// A master restarted answers CLUSTERDOWN for its slots until it
			// has rejoined the cluster (about cluster-node-timeout): the
			// master is back when it serves them.
			harness.WaitFor(t, 20*time.Second, "the master serving its slots", func() bool {
				_, err := down.Do(t.Context(), "GET", keys[down])
				return err == nil
			})
			t.Logf("served again %v after the master returned", waitServed(t, s, keys[down]))
			for _, key := range keys {
				if _, err := timedHit(s, key); err != nil {
					t.Errorf("%s after the master returned: %v", key, err)
				}
			}
			if st := s.Breakers(); st.Open != 0 {
				t.Errorf("Breakers() = %+v after recovery, want none open", st)
			}
		})
	}
}

// TestBreakerSentinel: the breaker of a Sentinel group is the group's,
// whichever server is master. With the master down it opens, and once the
// sentinels have promoted the replica the probe finds the new master and
// closes it.
func TestBreakerSentinel(t *testing.T) {
	t.Parallel()
	g := harness.StartRedisSentinel(t, harness.RedisSentinelOptions{})
	const failures = 3
	s := newStore(t, Config{
		Type: TypeSentinel, URL: g.URL, Timeout: 30 * time.Second,
		Breaker: breaker.Config{Failures: failures, ProbeInterval: breakerProbe},
	})
	if _, err := timedHit(s, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := g.Master.Stop(); err != nil {
		t.Fatal(err)
	}
	openBreaker(t, s, "down", failures)
	checkFastRefusals(t, s, "down")
	if err := g.Failover(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("served again %v after the replica was promoted", waitServed(t, s, "promoted"))
	if st := s.Breakers(); st.Open != 0 || st.Trips != 1 {
		t.Errorf("Breakers() = %+v after the failover, want none open, 1 trip", st)
	}
}

// TestBreakerFollowsTheStoreTimeout puts Redis behind a proxy that delays
// its replies. Slower than the requests' deadline but within the store's
// own timeout (REDIS_TIMEOUT), Redis answers: every request fails at its
// own deadline, and the breaker never opens however many do, since a
// request's deadline says nothing of Redis (under load, this process may
// be what is late). Slower than the store's timeout, the round trips
// fail: the breaker opens, and stays open for as long as Redis is slow
// (each probe's ping times out); once Redis is fast again, requests are
// served within breakerRecover. (The bound of a server's silence, Stall,
// is off: with it, a Redis slower than it opens its breaker at once, as a
// frozen one does: see TestFrozenFailsFast.)
func TestBreakerFollowsTheStoreTimeout(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	px := harness.StartProxy(t, srv.Addr)
	const failures = 3
	const timeout = 4 * breakerDeadline
	s := newStore(t, Config{
		URL: px.Addr, Timeout: timeout, Stall: -1,
		Breaker: breaker.Config{Failures: failures, ProbeInterval: breakerProbe},
	})
	if _, err := timedHit(s, "warm"); err != nil {
		t.Fatal(err)
	}

	// Requests at once, so that many miss their deadline in a row
	// before any answer comes.
	px.SetLatency(2 * breakerDeadline)
	var wg sync.WaitGroup
	errs := make([]error, 4*failures)
	for i := range errs {
		wg.Go(func() { _, errs[i] = timedHit(s, fmt.Sprint("slow", i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("request %d on a Redis answering after its deadline: %v, want DeadlineExceeded", i, err)
		}
	}
	if st := s.Breakers(); st.Trips != 0 || st.Open != 0 {
		t.Fatalf("Breakers() = %+v after requests that missed their own deadline, want no trip", st)
	}

	// Slower than the store's timeout: the requests still end at their
	// deadline, and the round trips they started fail at the timeout.
	px.SetLatency(2 * timeout)
	for i := 0; ; i++ {
		_, err := timedHit(s, "slower")
		if errors.Is(err, breaker.ErrOpen) {
			break
		}
		if i == 100 {
			t.Fatalf("breaker still closed after %d requests on a Redis slower than its timeout: %v", i, err)
		}
	}
	// Several probes' time, watched: each probe's ping times out, and
	// nothing counts the probes to wait for instead.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if st := s.Breakers(); st.Open != 1 || st.Trips != 1 {
			t.Fatalf("Breakers() = %+v with Redis slower than its timeout, want it open since its one trip", st)
		}
	}
	px.Heal()
	t.Logf("served again %v after Redis was fast again", waitServed(t, s, "back"))
}
