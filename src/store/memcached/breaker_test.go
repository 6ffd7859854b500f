package memcached

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// The bounds of the breaker tests, generous for a loaded machine running
// -race (the tests log what they measured).
const (
	breakerTimeout  = 200 * time.Millisecond // the store's round-trip bound
	breakerDeadline = time.Second            // each request's budget
	breakerFast     = 50 * time.Millisecond  // an open breaker's refusal, at most
	breakerRecover  = 2 * time.Second        // from the server's return to requests served
	breakerProbe    = 100 * time.Millisecond
)

// timedHit sends one op of alg on key and reports how long it took and
// the error.
func timedHit(s *Store, key string, alg rules.Algorithm) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), breakerDeadline)
	defer cancel()
	b := &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{{
		Key: key, Algorithm: alg, Limit: 1 << 30, Window: time.Hour, Hits: 1,
	}}}
	start := time.Now()
	err := s.Do(ctx, b)
	return time.Since(start), err
}

// TestBreakerOneOfTwoServers stops or freezes one of two memcached servers:
// after Failures failed round trips to it in a row its keys fail at once,
// not after the round-trip timeout, while the other server's keys are
// served throughout, for every algorithm; once it is back its keys are
// served within breakerRecover.
func TestBreakerOneOfTwoServers(t *testing.T) {
	tests := []struct {
		name          string
		down, return_ func(*harness.MemcachedServer) error
	}{
		{"stopped", (*harness.MemcachedServer).Stop, (*harness.MemcachedServer).Start},
		{"frozen", (*harness.MemcachedServer).Freeze, (*harness.MemcachedServer).Thaw},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := harness.StartMemcached(t), harness.StartMemcached(t)
			const failures = 3
			s := newStore(t, Config{
				Addrs: []string{a.Addr, b.Addr}, Timeout: breakerTimeout,
				Breaker: breaker.Config{Failures: failures, ProbeInterval: breakerProbe},
			})
			// The prober dials every connection; a request meanwhile
			// could fail on a dial slowed by a loaded machine.
			harness.WaitFor(t, 5*time.Second, "healthy at start", s.Healthy)
			// A key on server addr for alg, as the client shards them.
			keyOn := func(addr string, alg rules.Algorithm) string {
				for i := range 1000 {
					key := fmt.Sprintf("k%d_%s", i, alg)
					if a, err := s.client.AddrOf(key); err == nil && a == addr {
						return key
					}
				}
				t.Fatalf("no key on %s", addr)
				return ""
			}
			downKey, upKey := keyOn(a.Addr, rules.FixedWindow), keyOn(b.Addr, rules.FixedWindow)
			for _, key := range []string{downKey, upKey} {
				if _, err := timedHit(s, key, rules.FixedWindow); err != nil {
					t.Fatalf("%s before the outage: %v", key, err)
				}
			}
			if err := tt.down(a); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Thaw() })

			for i := 0; ; i++ {
				took, err := timedHit(s, downKey, rules.FixedWindow)
				if errors.Is(err, breaker.ErrOpen) {
					if i != failures {
						t.Fatalf("breaker open after %d failures, want %d", i, failures)
					}
					break
				}
				if !errors.Is(err, limiter.ErrUnavailable) {
					t.Fatalf("request %d to the server down: %v, want ErrUnavailable", i, err)
				}
				if i >= failures {
					t.Fatalf("breaker still closed after %d failures, want open after %d", i+1, failures)
				}
				t.Logf("failure %d took %v", i+1, took)
			}
			var took []time.Duration
			for i := range 40 {
				alg := rules.Algorithms[i%len(rules.Algorithms)]
				d, err := timedHit(s, keyOn(a.Addr, alg), alg)
				if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, limiter.ErrUnavailable) {
					t.Fatalf("%s with the breaker open: %v, want ErrOpen and ErrUnavailable", alg, err)
				}
				took = append(took, d)
				if _, err := timedHit(s, keyOn(b.Addr, alg), alg); err != nil {
					t.Fatalf("%s on the server still up: %v", alg, err)
				}
			}
			slices.Sort(took)
			t.Logf("refusals by the open breaker: median %v, slowest %v (round-trip timeout %v)", took[len(took)/2], took[len(took)-1], breakerTimeout)
			if took[len(took)/2] > breakerFast {
				t.Errorf("median refusal %v, want at once (< %v)", took[len(took)/2], breakerFast)
			}
			if st := s.Breakers(); st.Open != 1 || st.Trips != 1 || st.Rejections < 40 {
				t.Errorf("Breakers() = %+v, want 1 open, 1 trip, at least 40 rejections", st)
			}
			if s.Healthy() {
				t.Error("Healthy() = true with a breaker open")
			}

			if err := tt.return_(a); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			harness.WaitForNil(t, breakerRecover, "served after the server returned", func() error {
				_, err := timedHit(s, downKey, rules.FixedWindow)
				return err
			})
			t.Logf("served again %v after the server returned", time.Since(start))
			if st := s.Breakers(); st.Open != 0 || st.Trips != 1 {
				t.Errorf("Breakers() = %+v after recovery, want none open, 1 trip", st)
			}
		})
	}
}

// TestBreakerClosedIsTold: Healthy counts open breakers, so a breaker that
// closes is told through Config.Answered before a request admitted after
// it is answered; the first answer may have come while it was open (a
// service started with its memcached down), and health would otherwise lag
// the requests served until its next poll.
func TestBreakerClosedIsTold(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	var told harness.HealthTold
	s := newStore(t, Config{
		Addrs:    []string{srv.Addr},
		Breaker:  breaker.Config{Failures: 1, ProbeInterval: time.Hour},
		Answered: told.Answered,
	})
	told.Watch(s.Healthy)
	harness.WaitFor(t, 5*time.Second, "healthy at start", s.Healthy)
	b := s.breakers.Server(s.client.Addrs()[0])
	b.Failure()
	if s.Healthy() {
		t.Fatal("Healthy() = true with the breaker open")
	}
	mark := told.Mark()
	b.Reset() // as the probe does when the server answers
	if _, err := timedHit(s, "told", rules.FixedWindow); err != nil {
		t.Fatal(err)
	}
	if after := told.Since(mark); !slices.Contains(after, true) {
		t.Errorf("Answered told Healthy %v since the breaker closed, want true before the request's answer", after)
	}
}

// TestBreakerIgnoresDataErrors: an item memcached cannot incr fails its
// requests with ErrData any number of times without opening the breaker.
func TestBreakerIgnoresDataErrors(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, Breaker: breaker.Config{Failures: 2, ProbeInterval: breakerProbe}})
	now := time.Now()
	key := fmt.Sprintf("poisoned_%d", now.Unix()/3600*3600)
	if err := s.client.Add(t.Context(), key, []byte("abc"), 60); err != nil {
		t.Fatal(err)
	}
	// As if this instance had written the key in this window: each
	// request is then one round trip, incr, answered with the data error
	// (otherwise add's "not stored" answer would clear the run each time).
	s.written.add(key, now.Unix()+3600, now.Unix())
	b := &limiter.Batch{Now: now, Ops: []limiter.Op{{Key: key, Algorithm: rules.FixedWindow, Limit: 10, Window: time.Hour, Hits: 1}}}
	for i := range 10 {
		if err := s.Do(t.Context(), b); !errors.Is(err, limiter.ErrData) || errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("request %d on a non-numeric item: %v, want ErrData only", i, err)
		}
	}
	if st := s.Breakers(); st.Open != 0 || st.Trips != 0 {
		t.Errorf("Breakers() = %+v after data errors, want none open", st)
	}
}

// TestBreakerFollowsTheStoreTimeout puts memcached behind a proxy that
// delays its answers. Slower than the requests' deadline but within the
// store's own timeout, memcached answers: every request fails at its own
// deadline, and the breaker never opens however many do (under load, this
// process may be what is late). Slower than the store's timeout, the
// connections break on their missing answers and the breaker opens,
// although every caller gave up at its own deadline before.
func TestBreakerFollowsTheStoreTimeout(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	px := harness.StartProxy(t, srv.Addr)
	const failures = 3
	s := newStore(t, Config{
		Addrs: []string{px.Addr}, Timeout: breakerTimeout,
		Breaker: breaker.Config{Failures: failures, ProbeInterval: breakerProbe},
	})
	harness.WaitFor(t, 5*time.Second, "healthy at start", s.Healthy)
	const deadline = breakerTimeout / 8
	hit := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		return s.Do(ctx, &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{{
			Key: "slow", Algorithm: rules.FixedWindow, Limit: 1 << 30, Window: time.Hour, Hits: 1,
		}}})
	}

	px.SetLatency(breakerTimeout / 2)
	for i := range 4 * failures {
		if err := hit(); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("request %d on a memcached answering after its deadline: %v, want DeadlineExceeded", i, err)
		}
	}
	if st := s.Breakers(); st.Trips != 0 || st.Open != 0 {
		t.Fatalf("Breakers() = %+v after requests that missed their own deadline, want no trip", st)
	}

	px.SetLatency(4 * breakerTimeout)
	harness.WaitForNil(t, 10*time.Second, "breaker open on a memcached slower than its timeout", func() error {
		if err := hit(); !errors.Is(err, breaker.ErrOpen) {
			return fmt.Errorf("still closed: %v", err)
		}
		return nil
	})
}
