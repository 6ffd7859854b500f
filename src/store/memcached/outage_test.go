package memcached

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// hit sends one single-op batch of every algorithm and returns the first error.
func hit(ctx context.Context, s *Store, key string) error {
	for _, alg := range rules.Algorithms {
		b := &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{{
			Key: key + "_" + alg.String(), Algorithm: alg, Limit: 1 << 30, Window: time.Hour, Hits: 1,
		}}}
		if err := s.Do(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// TestOutage stops memcached and starts it again: requests fail fast with
// ErrUnavailable while it is down, health follows, requests work again once
// it is back, and Close leaves no goroutine behind. Not parallel: it
// counts goroutines.
func TestOutage(t *testing.T) {
	srv := harness.StartMemcached(t)
	const timeout = 300 * time.Millisecond
	goroutines := runtime.NumGoroutine()
	s, err := New(t.Context(), Config{Addrs: []string{srv.Addr}, Timeout: timeout, SRVRefresh: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 5*time.Second, "healthy at start", s.Healthy)
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Fill the idle pool with connections that the restart will break.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := hit(t.Context(), s, "outage_warm"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		start := time.Now()
		err := hit(t.Context(), s, "outage_down")
		if took := time.Since(start); took > 2*timeout {
			t.Errorf("request %d while down took %v, want within the %v timeout", i, took, timeout)
		}
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("request %d while down: %v, want ErrUnavailable", i, err)
		}
	}
	harness.WaitFor(t, 3*time.Second, "unhealthy while down", func() bool { return !s.Healthy() })

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 5*time.Second, "healthy once back", s.Healthy)
	if err := hit(t.Context(), s, "outage_back"); err != nil {
		t.Errorf("request once healthy again: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := hit(t.Context(), s, "outage_closed"); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do after Close: %v, want ErrUnavailable", err)
	}
	harness.CheckGoroutines(t, goroutines)
}

// TestTimeout bounds a request to a server that accepts connections but
// never answers by Config.Timeout: the first fails after about Timeout,
// and the connection is closed; the next ones fail at once while the
// redial backs off, or after about Timeout again.
func TestTimeout(t *testing.T) {
	t.Parallel()
	addr := harness.SilentServer(t)
	const timeout = 200 * time.Millisecond
	s := newStore(t, Config{Addrs: []string{addr}, Timeout: timeout})
	for i, alg := range rules.Algorithms {
		b := &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{{Key: "silent", Algorithm: alg, Limit: 5, Window: time.Minute, Hits: 1}}}
		start := time.Now()
		err := s.Do(t.Context(), b)
		took := time.Since(start)
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("%s to a silent server: %v, want ErrUnavailable", alg, err)
		}
		if i == 0 && took < timeout/2 || took > 3*timeout {
			t.Errorf("%s to a silent server failed after %v, want about the %v timeout", alg, took, timeout)
		}
	}
	if s.Healthy() {
		t.Error("Healthy with a server that never answered")
	}
}

// TestCanceled: a canceled ctx fails before any round trip.
func TestCanceled(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	b := &limiter.Batch{Ops: []limiter.Op{{Key: "k", Limit: 1, Window: time.Minute, Hits: 1}}}
	if err := s.Do(ctx, b); !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a canceled ctx = %v, want ErrUnavailable wrapping context.Canceled", err)
	}
	if rt, _ := s.Counters(); rt != 0 {
		t.Errorf("%d round trips for a canceled request", rt)
	}
}

// TestRestartBetweenProbes restarts memcached while the store holds idle
// connections to it and sends nothing: the first request finds them dead
// and fails, and the store drops them all, so the next one succeeds.
func TestRestartBetweenProbes(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	const conns = 8
	s := newStore(t, Config{Addrs: []string{srv.Addr}, MaxConns: 2 * conns})
	// Fill the idle pool: conns concurrent requests, each on a connection.
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range conns {
		wg.Go(func() {
			<-start
			if err := hit(t.Context(), s, "restart_warm"); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i := range 4 {
		err := hit(t.Context(), s, "restart_after")
		switch {
		case err == nil:
		case errors.Is(err, limiter.ErrUnavailable):
			failed++
		default:
			t.Fatalf("request %d after the restart: %v", i, err)
		}
	}
	// The prober may have found the dead connections first.
	if failed > 1 {
		t.Errorf("%d of 4 requests after the restart failed, want at most the first", failed)
	}
}

// TestCloseBounded closes a store while memcached, frozen as the calls in
// flight were taking back the hits of refused AllOrNothing batches, holds
// every one of them in a round trip, with no deadline, and while the SRV
// refresher is stuck in a lookup that does not heed its ctx (a resolver
// without a timeout of ours): Close waits for them until its bound,
// Timeout plus closeGrace, and returns then, later calls fail, and once
// everything under way has ended, no goroutine and no connection is left.
// The bound comes from the order of events, not from a margin: the lookup
// is released only once Close has returned, or releaseAfter (four times the
// bound) after Close began, so that a Close that waits for what is under
// way past its bound returns only after the release. Not parallel: it
// counts goroutines.
func TestCloseBounded(t *testing.T) {
	srv := harness.StartMemcached(t)
	const timeout, calls = 200 * time.Millisecond, 8
	const bound = timeout + closeGrace
	const releaseAfter = 4 * bound
	goroutines := runtime.NumGoroutine()
	var (
		frozen   atomic.Bool
		freezing sync.Once
	)
	// Freeze memcached at the first take-back, as all the calls are near
	// theirs. A write carries the commands of several calls, so the first
	// decr may follow other commands in it.
	conns := connCounter{onWrite: func(p []byte) {
		if strings.Contains(string(p), "decr ") {
			freezing.Do(func() {
				if err := srv.Freeze(); err != nil {
					t.Error(err)
				}
				frozen.Store(true)
			})
		}
	}}
	// The first lookup (New's) answers; the refresher's next one is stuck
	// until release is closed.
	host, port, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	var (
		lookups   atomic.Int64
		releasing sync.Once
		released  atomic.Bool
	)
	stuck, release := make(chan struct{}), make(chan struct{})
	unstick := func() {
		releasing.Do(func() {
			released.Store(true)
			close(release)
		})
	}
	t.Cleanup(unstick)
	lookup := func(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
		if lookups.Add(1) == 2 {
			close(stuck)
			<-release // not ctx
		}
		return name, []*net.SRV{{Target: host + ".", Port: uint16(p)}}, nil
	}
	s, err := newWith(t.Context(), Config{SRV: "_memcache._tcp.test.", SRVRefresh: time.Millisecond, Timeout: timeout, MaxConns: 2 * calls},
		deps{lookup: lookup, wrapDial: conns.wrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			// Four hits recorded, then one refused: four decr to take back.
			ops := make([]limiter.Op, 5)
			for i := range ops {
				ops[i] = limiter.Op{Key: uniqueKey(t, "k") + strconv.Itoa(i), Limit: 10, Window: time.Hour, Hits: 1}
			}
			ops[4].Limit = 0
			b := &limiter.Batch{Ops: ops, AllOrNothing: true}
			if err := s.Do(context.Background(), b); !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Do with memcached frozen, then closed: %v, want ErrUnavailable", err)
			}
		})
	}
	harness.WaitFor(t, 5*time.Second, "memcached frozen at a take-back", frozen.Load)
	select {
	case <-stuck:
	case <-time.After(5 * time.Second):
		t.Fatal("the refresher never looked the SRV record up again")
	}

	start := time.Now()
	later := time.AfterFunc(releaseAfter, unstick)
	err = s.Close()
	late := released.Load()
	took := time.Since(start)
	later.Stop()
	if err != nil {
		t.Errorf("Close: %v", err)
	}
	if late {
		t.Errorf("Close took %v: it waited for the stuck lookup, released %v after Close began; want it to return at its %v bound", took, releaseAfter, bound)
	}
	if took < bound {
		t.Errorf("Close took %v, want it to wait for what is under way until its %v bound", took, bound)
	}
	unstick()
	if err := hit(t.Context(), s, "closed"); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do after Close: %v, want ErrUnavailable", err)
	}
	wg.Wait()
	harness.WaitFor(t, 5*time.Second, "every connection closed", func() bool { return conns.open.Load() == 0 })
	harness.CheckGoroutines(t, goroutines)
}
