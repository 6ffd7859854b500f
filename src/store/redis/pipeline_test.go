package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// hammer sends goroutines × requests single-op batches over keys distinct
// keys and fails the test on any error.
func hammer(t *testing.T, s *Store, goroutines, requests, keys int, alg rules.Algorithm) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			b := &limiter.Batch{Now: time.Now(), Ops: make([]limiter.Op, 1)}
			for i := range requests {
				b.Ops[0] = limiter.Op{
					Key:       fmt.Sprintf("hammer_%s_%d", alg, (g*requests+i)%keys),
					Algorithm: alg, Limit: 1 << 20, Window: time.Hour, Hits: 1,
				}
				if err := s.Do(context.Background(), b); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Do: %v", err)
	}
}

// TestPipelining: concurrent requests share round trips, and no request
// takes more than one.
func TestPipelining(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})

	t.Run("coalesces_under_concurrency", func(t *testing.T) {
		s := newStore(t, Config{URL: srv.Addr, PoolSize: 4})
		hammer(t, s, 64, 100, 1000, rules.FixedWindow)
		rt, ops := s.Counters()
		if ops != 6400 {
			t.Errorf("ops = %d, want 6400", ops)
		}
		ratio := float64(ops) / float64(rt)
		t.Logf("%d ops in %d round trips: %.1f ops per round trip", ops, rt, ratio)
		if ratio < 2 {
			t.Errorf("%.2f ops per round trip with 64 concurrent clients and 4 connections, want >= 2", ratio)
		}
	})

	t.Run("deep_by_default", func(t *testing.T) {
		s := newStore(t, Config{URL: srv.Addr})
		hammer(t, s, 64, 100, 1000, rules.FixedWindow)
		rt, ops := s.Counters()
		ratio := float64(ops) / float64(rt)
		t.Logf("%d ops in %d round trips: %.1f ops per round trip", ops, rt, ratio)
		if ratio < 4 {
			t.Errorf("%.2f ops per round trip with 64 concurrent clients and the default pool, want >= 4", ratio)
		}
	})

	t.Run("one_round_trip_per_request", func(t *testing.T) {
		s := newStore(t, Config{URL: srv.Addr})
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		var ops []limiter.Op
		for _, a := range rules.Algorithms {
			for i := range 5 {
				ops = append(ops, limiter.Op{Key: fmt.Sprintf("one_rt_%s_%d", a, i), Algorithm: a, Limit: 10, Window: time.Minute, Hits: 1})
			}
		}
		for _, aon := range []bool{false, true, false, true} {
			before, _ := s.Counters()
			b := &limiter.Batch{Now: time.Now(), Ops: ops, AllOrNothing: aon}
			if err := s.Do(t.Context(), b); err != nil {
				t.Fatal(err)
			}
			after, _ := s.Counters()
			// The scripts were loaded before WaitStarted returned.
			if got := after - before; got != 1 {
				t.Errorf("AllOrNothing=%v: a lone request of %d ops took %d round trips, want 1", aon, len(ops), got)
			}
		}
	})

	t.Run("window_and_limit", func(t *testing.T) {
		// A pipeline window holds a lone request for the window; the limit
		// sends as soon as it is reached (INCRBY and EXPIRE: 2 commands an op).
		s := newStore(t, Config{URL: srv.Addr, PoolSize: 1, PipelineWindow: 500 * time.Millisecond, PipelineLimit: 8})
		start := time.Now()
		if err := hitOnce(t.Context(), s, "window_lone", rules.FixedWindow); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 450*time.Millisecond {
			t.Errorf("a lone request with a 500ms window returned after %v", d)
		}
		var wg sync.WaitGroup
		start = time.Now()
		for i := range 4 {
			wg.Go(func() {
				if err := hitOnce(t.Context(), s, fmt.Sprintf("window_%d", i), rules.FixedWindow); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Errorf("4 requests (8 commands, the limit) took %v, want them sent at the limit, not after the window", d)
		}
	})

	t.Run("scripts_after_script_flush", func(t *testing.T) {
		s := newStore(t, Config{URL: srv.Addr})
		if err := hitOnce(t.Context(), s, "flush_tb", rules.TokenBucket); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Do(t.Context(), "SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := hitOnce(t.Context(), s, "flush_tb", rules.TokenBucket); err != nil {
				t.Fatalf("request %d after SCRIPT FLUSH: %v", i, err)
			}
		}
	})
}

// TestPerSecond: ops of per-second rules go to the per-second Redis, the
// others to the main one, in one Do.
func TestPerSecond(t *testing.T) {
	t.Parallel()
	main := harness.StartRedis(t, harness.RedisOptions{})
	second := harness.StartRedis(t, harness.RedisOptions{Password: "ps"})
	s := newStore(t, Config{URL: main.Addr, PerSecond: &Config{URL: second.Addr, Auth: "ps"}})
	b := &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{
		{Key: "ps_minute", Limit: 20, Window: time.Minute, Hits: 3},
		{Key: "ps_second", Limit: 20, Window: time.Second, Hits: 4, PerSecond: true},
		// Routing follows PerSecond alone; an hour keeps the bucket from
		// refilling between the two calls.
		{Key: "ps_second_tb", Algorithm: rules.TokenBucket, Limit: 20, Window: time.Hour, Hits: 5, PerSecond: true},
		{Key: "ps_minute_sl", Algorithm: rules.SlidingLog, Limit: 20, Window: time.Minute, Hits: 6},
	}}
	for _, aon := range []bool{false, true} {
		b.AllOrNothing = aon
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	want := []uint64{6, 8, 10, 12}
	for i, r := range b.Results {
		if r.After != want[i] || !r.Allowed {
			t.Errorf("op %d: %+v, want admitted with After %d", i, r, want[i])
		}
	}
	where := []struct {
		key    string
		onMain bool
	}{
		{"ps_minute", true}, {"ps_second", false}, {"ps_second_tb" + stateSuffix, false}, {"ps_minute_sl" + stateSuffix, true},
	}
	for _, w := range where {
		for _, srv := range []*harness.RedisServer{main, second} {
			n, err := srv.Do(t.Context(), "EXISTS", w.key)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(0); (srv == main) == w.onMain {
				want = 1
				if n != want {
					t.Errorf("%s: EXISTS on %s = %v, want %d", w.key, srv.Addr, n, want)
				}
			} else if n != want {
				t.Errorf("%s: EXISTS on %s = %v, want %d", w.key, srv.Addr, n, want)
			}
		}
	}
	if !s.Healthy() {
		t.Error("Healthy() = false with both Redis up")
	}

	// All or nothing across the two Redis: the per-second op is refused, so
	// the main one is taken back.
	b = &limiter.Batch{Now: time.Now(), AllOrNothing: true, Ops: []limiter.Op{
		{Key: "ps_aon_minute", Limit: 20, Window: time.Minute, Hits: 3},
		{Key: "ps_aon_second", Algorithm: rules.SlidingLog, Limit: 2, Window: time.Hour, Hits: 3, PerSecond: true},
	}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if !b.Results[0].Allowed || b.Results[1].Allowed || b.Results[0].Remaining != 20 {
		t.Errorf("all or nothing across Redis: %+v, want the first allowed with 20 remaining (taken back), the second refused", b.Results)
	}
	if v, err := main.Do(t.Context(), "GET", "ps_aon_minute"); err != nil || v != "0" {
		t.Errorf("GET ps_aon_minute on main = %v, %v; want 0", v, err)
	}
}

// TestDispatch: the adaptive policy of backend.dispatchLocked and take, on
// a backend without Redis, on synctest's clock. A lone request wakes a
// worker; while one is busy, more requests wake nobody until deepQueue work
// waits, or until the oldest has waited maxQueueWait; a worker back from
// Redis leaves a shallow queue to another one in flight, and goes idle when
// the queue is empty.
func TestDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &backend{limit: maxPipelineCommands, deep: deepQueue, maxQueue: defaultMaxQueue}
		be.initQueue(3)
		defer be.stop()
		woken := func() (ws []*worker) {
			for _, w := range be.workers {
				select {
				case <-w.wake:
					ws = append(ws, w)
				default:
				}
			}
			return ws
		}
		// Fixed-window ops: two commands each.
		enqueue := func(n int) {
			for range n {
				be.enqueue(&request{ncmds: 2, work: 2})
			}
		}
		take := func(w *worker, woken bool, want int) {
			t.Helper()
			if got := be.take(t.Context(), w, woken); len(got) != want {
				t.Fatalf("take = %d requests, want %d", len(got), want)
			}
		}

		enqueue(1)
		ws := woken()
		if len(ws) != 1 {
			t.Fatalf("a lone request woke %d workers, want 1", len(ws))
		}
		first := ws[0]
		enqueue(1)
		if ws := woken(); len(ws) != 0 {
			t.Fatalf("a request queued before the woken worker took the queue woke %d workers, want 0", len(ws))
		}
		take(first, true, 2)

		// first is in flight: requests wait for it until deepQueue work
		// is queued, then another worker sends them.
		enqueue(deepQueue/2 - 1)
		if ws := woken(); len(ws) != 0 {
			t.Fatalf("%d commands queued behind a pipeline in flight woke %d workers, want 0", deepQueue-2, len(ws))
		}
		enqueue(1)
		ws = woken()
		if len(ws) != 1 || ws[0] == first {
			t.Fatalf("%d commands queued woke %d workers, want another one", deepQueue, len(ws))
		}
		second := ws[0]
		take(second, true, deepQueue/2)

		// first comes back while second is in flight: a shallow queue is
		// left to second, which takes it when it comes back.
		enqueue(1)
		take(first, false, 0)
		take(second, false, 1)
		take(second, false, 0)
		if be.busy != 0 || be.starting != 0 || len(be.idle) != 3 || be.queued != 0 || be.queuedWork != 0 {
			t.Errorf("after the queue emptied: busy %d, starting %d, idle %d, queued %d, work %d; want 0, 0, 3, 0, 0",
				be.busy, be.starting, len(be.idle), be.queued, be.queuedWork)
		}

		// A request behind a pipeline that does not come back waits
		// maxQueueWait, then goes on another connection.
		enqueue(1)
		ws = woken()
		if len(ws) != 1 {
			t.Fatalf("a request to an idle backend woke %d workers, want 1", len(ws))
		}
		stuck := ws[0]
		take(stuck, true, 1)
		enqueue(1)
		time.Sleep(maxQueueWait - time.Microsecond)
		synctest.Wait()
		if ws := woken(); len(ws) != 0 {
			t.Fatalf("a request behind a pipeline in flight woke %d workers before maxQueueWait, want 0", len(ws))
		}
		time.Sleep(time.Microsecond)
		synctest.Wait()
		ws = woken()
		if len(ws) != 1 || ws[0] == stuck {
			t.Fatalf("a request that waited maxQueueWait woke %d workers, want another one", len(ws))
		}
		take(ws[0], true, 1)
	})
}

// TestDispatchPipelineLimit: with REDIS_PIPELINE_LIMIT, a queue that holds
// a full pipeline is sent at once on another connection, and a worker takes
// at most the limit.
func TestDispatchPipelineLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &backend{limit: 8, deep: deepQueue, maxQueue: defaultMaxQueue}
		be.initQueue(2)
		defer be.stop()
		wake := func() int {
			n := 0
			for _, w := range be.workers {
				select {
				case <-w.wake:
					n++
				default:
				}
			}
			return n
		}
		be.enqueue(&request{ncmds: 2, work: 2})
		if n := wake(); n != 1 {
			t.Fatalf("a lone request woke %d workers, want 1", n)
		}
		first := be.workers[len(be.workers)-1] // the last idle is woken first
		if got := be.take(t.Context(), first, true); len(got) != 1 {
			t.Fatalf("take = %d requests, want 1", len(got))
		}
		for range 3 {
			be.enqueue(&request{ncmds: 2, work: 2})
		}
		if n := wake(); n != 0 {
			t.Fatalf("6 commands queued with a limit of 8 woke %d workers, want 0", n)
		}
		for range 2 {
			be.enqueue(&request{ncmds: 2, work: 2})
		}
		if n := wake(); n != 1 {
			t.Fatalf("10 commands queued with a limit of 8 woke %d workers, want 1", n)
		}
		if got := be.take(t.Context(), be.workers[0], true); len(got) != 4 {
			t.Fatalf("take = %d requests, want the 4 of the limit", len(got))
		}
	})
}

// TestDrain: at Close, the requests left in the queue fail with the
// closed error, which their callers wait for (they watch nothing else),
// and a request queued afterwards fails at once without counting as shed.
func TestDrain(t *testing.T) {
	var shed atomic.Uint64
	be := &backend{limit: maxPipelineCommands, deep: deepQueue, maxQueue: defaultMaxQueue,
		shed: &shed, closed: errors.New("closed")}
	be.initQueue(0)
	var queued []*request
	for range 3 {
		r := &request{ctx: t.Context(), ncmds: 2, work: 2, done: make(chan struct{}, 1)}
		if err := be.enqueue(r); err != nil {
			t.Fatal(err)
		}
		queued = append(queued, r)
	}
	be.drain()
	for i, r := range queued {
		if recycle, err := be.wait(t.Context(), r); !recycle || err != be.closed {
			t.Errorf("request %d queued at Close: recycle %v, %v; want true, the closed error", i, recycle, err)
		}
	}
	if q, _ := queueState(be); q != 0 {
		t.Errorf("%d requests queued after drain, want 0", q)
	}
	late := &request{ctx: t.Context(), ncmds: 2, work: 2, done: make(chan struct{}, 1)}
	if err := be.enqueue(late); err != be.closed {
		t.Errorf("enqueue after Close = %v, want the closed error", err)
	}
	if n := shed.Load(); n != 0 {
		t.Errorf("shed = %d after Close, want 0", n)
	}
}
