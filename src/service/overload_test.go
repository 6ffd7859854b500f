package service

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// finishAt counts n calls finished at t.
func finishAt(m *loadMeter, n int, t time.Time) {
	for range n {
		m.finished(t)
	}
}

func TestLoadMeter(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var m loadMeter
	if _, ok := m.wait(100, t0); ok {
		t.Fatal("a new meter knows a rate")
	}
	finishAt(&m, 1, t0)                            // opens the first window
	finishAt(&m, 199, t0.Add(50*time.Millisecond)) // 200 in the window
	finishAt(&m, 1, t0.Add(100*time.Millisecond))  // closes it: 201 in 100 ms
	if w, ok := m.wait(100, t0.Add(100*time.Millisecond)); !ok || w != 100*time.Second/2010 {
		t.Errorf("wait(100) after 201 calls in 100ms = %v, %v; want %v", w, ok, 100*time.Second/2010)
	}
	// A second window averages with the first.
	finishAt(&m, 1000, t0.Add(150*time.Millisecond))
	finishAt(&m, 1, t0.Add(200*time.Millisecond))
	if w, ok := m.wait(6010, t0.Add(200*time.Millisecond)); !ok || w != time.Second {
		t.Errorf("wait(6010) after 1001 more in 100ms = %v, %v; want 1s (a rate of (2010+10010)/2)", w, ok)
	}
	// Long without a call finishing: the rate is stale.
	if _, ok := m.wait(100, t0.Add(200*time.Millisecond+loadStale+time.Millisecond)); ok {
		t.Error("a rate older than loadStale is still used")
	}
	// A window with too few calls says nothing.
	finishAt(&m, loadMinFinished-2, t0.Add(250*time.Millisecond))
	finishAt(&m, 1, t0.Add(300*time.Millisecond))
	if _, ok := m.wait(100, t0.Add(300*time.Millisecond)); ok {
		t.Errorf("a rate from a window of %d calls is used", loadMinFinished-1)
	}
}

// TestOverloaded: a call is refused at admission only when its deadline
// leaves less than the wait behind the calls in flight (at least
// loadMinInFlight of them, the rate known), and then counted as load shed.
func TestOverloaded(t *testing.T) {
	now := time.Now() // overloaded compares with a real deadline
	tests := []struct {
		name     string
		inFlight int64
		rate     int // calls finished per second
		deadline time.Duration
		shed     bool
	}{
		{"few_in_flight", loadMinInFlight - 1, 100, 20 * time.Millisecond, false},
		{"no_deadline", 1000, 100, 0, false},
		{"rate_unknown", 1000, 0, 20 * time.Millisecond, false},
		{"time_for_the_wait", 1000, 100_000, 20 * time.Millisecond, false},  // 10 ms of 18
		{"wait_past_the_budget", 1000, 10_000, 20 * time.Millisecond, true}, // 100 ms of 18
		{"generous_deadline", 4096, 4_000, 2 * time.Second, false},          // 1.02 s of 1.995
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := stats.NewRegistry()
			m := memory.New(memory.Config{})
			t.Cleanup(m.Close)
			s := New(limiter.New(m, limiter.Config{}), reg, Config{MaxConcurrent: 4096})
			if tt.rate > 0 {
				// Two windows of 100 ms at the rate, the last just closed.
				start := now.Add(-200 * time.Millisecond)
				finishAt(&s.load, 1, start)
				for w := range 2 {
					end := start.Add(time.Duration(w+1) * 100 * time.Millisecond)
					finishAt(&s.load, tt.rate/10-1, end.Add(-time.Millisecond))
					finishAt(&s.load, 1, end)
				}
			}
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, now.Add(tt.deadline))
				defer cancel()
			}
			err := s.overloaded(ctx, tt.inFlight, now)
			if (err != nil) != tt.shed || err != nil && status.Code(err) != codes.ResourceExhausted {
				t.Errorf("overloaded = %v, want shed %v (ResourceExhausted)", err, tt.shed)
			}
			if got, want := reg.Snapshot()["ratelimit.service.call.should_rate_limit.load_shed"], map[bool]uint64{true: 1}[tt.shed]; got != want {
				t.Errorf("load_shed = %d, want %d", got, want)
			}
		})
	}
}
