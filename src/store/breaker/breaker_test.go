package breaker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
)

func TestOpensAfterFailuresInARow(t *testing.T) {
	g := NewGroup("redis", Config{Failures: 3})
	b := g.Server("10.0.0.1:6379")
	for i := range 2 {
		b.Failure()
		if err := b.Allow(); err != nil {
			t.Fatalf("after %d failures: Allow = %v, want nil", i+1, err)
		}
	}
	b.Success() // the run starts again
	b.Failure()
	b.Failure()
	if b.IsOpen() {
		t.Fatal("open after 2 failures since a success, want closed")
	}
	b.Failure()
	err := b.Allow()
	if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, ErrOpen) {
		t.Fatalf("Allow when open = %v, want ErrUnavailable and ErrOpen", err)
	}
	if got, want := err.Error(), "redis 10.0.0.1:6379: store unavailable: circuit breaker open after 3 failures in a row; probing at most 500ms apart"; got != want {
		t.Errorf("Allow when open = %q, want %q", got, want)
	}
	b.Success() // a late answer does not close it
	if !b.IsOpen() {
		t.Error("closed by a success, want open until Reset")
	}
	_ = b.Allow()
	if got, want := g.Stats(), (Stats{Open: 1, Trips: 1, Rejections: 2}); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	b.Reset()
	if err := b.Allow(); err != nil {
		t.Errorf("Allow after Reset = %v, want nil", err)
	}
	if got, want := g.Stats(), (Stats{Open: 0, Trips: 1, Rejections: 2}); got != want {
		t.Errorf("Stats after Reset = %+v, want %+v", got, want)
	}
	// One more failure does not open it again: the run restarted.
	b.Failure()
	if b.IsOpen() {
		t.Error("open after one failure following Reset")
	}
}

// TestTripOpensAtOnce: a server gone silent opens its breaker without a
// run of failures, says so in its refusals, and closes only at Reset, after
// which a run of failures is needed again and the refusals say so.
func TestTripOpensAtOnce(t *testing.T) {
	g := NewGroup("redis", Config{Failures: 5})
	b := g.Server("10.0.0.1:6379")
	b.Trip()
	err := b.Allow()
	if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, ErrOpen) {
		t.Fatalf("Allow after Trip = %v, want ErrUnavailable and ErrOpen", err)
	}
	if got, want := err.Error(), "redis 10.0.0.1:6379: store unavailable: circuit breaker open: the server went silent; probing at most 500ms apart"; got != want {
		t.Errorf("Allow after Trip = %q, want %q", got, want)
	}
	b.Trip() // once open, a second trip counts nothing
	if got, want := g.Stats(), (Stats{Open: 1, Trips: 1, Rejections: 1}); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	select {
	case <-g.opened:
	default:
		t.Error("Trip did not wake the probe")
	}
	b.Success()
	if !b.IsOpen() {
		t.Error("closed by a success after Trip, want open until Reset")
	}
	b.Reset()
	if err := b.Allow(); err != nil {
		t.Fatalf("Allow after Reset = %v, want nil", err)
	}
	for range 5 {
		b.Failure()
	}
	if err := b.Allow(); err == nil || !strings.Contains(err.Error(), "after 5 failures in a row") {
		t.Errorf("Allow after 5 failures following a Trip and Reset = %v, want the failures' refusal", err)
	}
	var nilBreaker *Breaker
	nilBreaker.Trip()
	if nilBreaker.IsOpen() {
		t.Error("a nil breaker opened")
	}
}

func TestOff(t *testing.T) {
	for _, n := range []int{0, -1} {
		g := NewGroup("memcached", Config{Failures: n})
		if g != nil {
			t.Fatalf("NewGroup(Failures: %d) = %v, want nil", n, g)
		}
		b := g.Server("a:1")
		for range 100 {
			b.Failure()
		}
		if err := b.Allow(); err != nil || b.IsOpen() || g.AnyOpen() || g.OpenServers() != nil {
			t.Errorf("Failures %d: Allow = %v, IsOpen %v; want a breaker that never opens", n, err, b.IsOpen())
		}
		b.Success()
		b.Reset()
		if g.Stats() != (Stats{}) {
			t.Errorf("Stats of a nil group = %+v", g.Stats())
		}
		g.Run(t.Context(), func(context.Context) { t.Error("probe called on a nil group") })
	}
}

func TestServersAreBounded(t *testing.T) {
	g := NewGroup("redis", Config{Failures: 1})
	for i := range MaxServers {
		if g.Server(fmt.Sprint("10.0.0.1:", i)) == nil {
			t.Fatalf("server %d has no breaker", i)
		}
	}
	if b := g.Server("10.0.0.2:1"); b != nil {
		t.Errorf("server beyond MaxServers got a breaker")
	}
	if g.Server("10.0.0.1:7") != g.Lookup("10.0.0.1:7") || g.Lookup("10.0.0.2:1") != nil {
		t.Error("Lookup does not agree with Server")
	}
}

// TestRunProbesWhileOpen: Run probes while a breaker is open, FirstProbe
// after it opened and then at doubling intervals up to ProbeInterval, not
// before one opens nor after the last closes; a breaker that opens again
// soon after the last close goes on from the wait reached, one that opens
// much later starts over.
func TestRunProbesWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGroup("redis", Config{Failures: 2, ProbeInterval: time.Second})
		a, b := g.Server("a"), g.Server("b")
		var (
			mu      sync.Mutex
			probes  []time.Duration
			answers = map[string]int{"a": 2, "b": 4} // failed probes before it answers
		)
		start := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Run(ctx, func(context.Context) {
				mu.Lock()
				defer mu.Unlock()
				probes = append(probes, time.Since(start))
				for _, br := range g.OpenServers() {
					if answers[br.Addr()]--; answers[br.Addr()] < 0 {
						br.Reset()
					}
				}
			})
		}()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if len(probes) != 0 {
			t.Fatalf("probes before any breaker opened: %v", probes)
		}
		start = time.Now()
		a.Failure()
		a.Failure()
		b.Failure()
		b.Failure()
		time.Sleep(400 * time.Millisecond) // b answers the probe at 310 ms
		synctest.Wait()
		mu.Lock()
		ms := time.Millisecond
		want := []time.Duration{10 * ms, 30 * ms, 70 * ms, 150 * ms, 310 * ms}
		if fmt.Sprint(probes) != fmt.Sprint(want) {
			t.Errorf("probes at %v, want %v (a answers the 3rd, b the 5th)", probes, want)
		}
		mu.Unlock()
		probeAfterOpening := func(pause time.Duration, answersAfter int) []time.Duration {
			t.Helper()
			time.Sleep(pause)
			mu.Lock()
			probes, answers["a"], start = nil, answersAfter, time.Now()
			mu.Unlock()
			a.Failure()
			a.Failure()
			time.Sleep(time.Minute)
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(probes)
		}
		// Flapping: open again 90 ms after the close, the wait goes on
		// doubling from where it was (320 ms, then 640 ms).
		if got, want := probeAfterOpening(0, 1), []time.Duration{320 * ms, 960 * ms}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("reopened soon after the close: probes at %v, want %v", got, want)
		}
		if got, want := probeAfterOpening(2*time.Second, 0), []time.Duration{10 * ms}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("reopened long after the close: probes at %v, want %v", got, want)
		}
		if g.AnyOpen() || a.IsOpen() || b.IsOpen() {
			t.Error("breakers still open after their servers answered")
		}
		if s := g.Stats(); s.Trips != 4 || s.Open != 0 {
			t.Errorf("Stats = %+v, want 4 trips and none open", s)
		}
		cancel()
		<-done
	})
}

func TestConcurrentUse(t *testing.T) {
	g := NewGroup("memcached", Config{Failures: 5})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				b := g.Server(fmt.Sprint("s", (i+j)%4))
				switch j % 3 {
				case 0:
					b.Failure()
				case 1:
					_ = b.Allow()
				default:
					b.Reset()
				}
			}
		})
	}
	wg.Wait()
	var open int64
	for _, b := range g.OpenServers() {
		if b.IsOpen() {
			open++
		}
	}
	if got := g.Stats().Open; got != open {
		t.Errorf("Stats().Open = %d, but %d breakers are open", got, open)
	}
}

// BenchmarkClosed is the cost a closed breaker adds to every request of a
// store: Allow before, Success after, from every core on one server.
func BenchmarkClosed(b *testing.B) {
	g := NewGroup("redis", Config{Failures: 5})
	br := g.Server("10.0.0.1:6379")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Allow() != nil {
				b.Fatal("open")
			}
			br.Success()
		}
	})
}

// BenchmarkServerLookup is the lookup of a server's breaker by address,
// as the Memcached store does per round trip.
func BenchmarkServerLookup(b *testing.B) {
	g := NewGroup("memcached", Config{Failures: 5})
	addrs := make([]string, 8)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:11211", i)
		g.Server(addrs[i])
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			g.Server(addrs[i%len(addrs)]).Success()
			i++
		}
	})
}

// TestClosedSince: a caller hears of each breaker closing once, of none
// before the first, and a Reset of a closed breaker is no closing.
func TestClosedSince(t *testing.T) {
	g := NewGroup("memcached", Config{Failures: 1})
	b := g.Server("10.0.0.1:11211")
	var seen atomic.Uint64
	if g.ClosedSince(&seen) {
		t.Error("ClosedSince = true before any breaker closed")
	}
	b.Reset() // closed already
	if g.ClosedSince(&seen) {
		t.Error("ClosedSince = true after a Reset of a closed breaker")
	}
	b.Failure()
	b.Reset()
	if !g.ClosedSince(&seen) {
		t.Error("ClosedSince = false after a breaker closed")
	}
	if g.ClosedSince(&seen) {
		t.Error("ClosedSince = true twice for one closing")
	}
	var nilGroup *Group
	if nilGroup.ClosedSince(&seen) {
		t.Error("ClosedSince = true on a nil Group")
	}
}
