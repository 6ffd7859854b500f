package redis

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestRoundTripObserver: Config.RoundTrip sees every pipeline that Redis
// answered, with its commands (INCRBY and EXPIRE per fixed-window op) and
// a duration bounded by the wall time around it.
func TestRoundTripObserver(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	var (
		mu       sync.Mutex
		commands []int
		longest  time.Duration
	)
	s := newStore(t, Config{URL: srv.Addr, RoundTrip: func(d time.Duration, n int) {
		mu.Lock()
		defer mu.Unlock()
		commands = append(commands, n)
		longest = max(longest, d)
	}})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	commands, longest = nil, 0 // the probe's
	mu.Unlock()
	var ops []limiter.Op
	for i := range 3 {
		ops = append(ops, limiter.Op{Key: fmt.Sprintf("rt_observer_%d_%d", i, time.Now().UnixNano()), Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute, Hits: 1})
	}
	before, _ := s.Counters()
	start := time.Now()
	if err := s.Do(t.Context(), &limiter.Batch{Now: time.Now(), Ops: ops}); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	after, _ := s.Counters()
	mu.Lock()
	defer mu.Unlock()
	if uint64(len(commands)) != after-before {
		t.Errorf("observed %d round trips, Counters counted %d", len(commands), after-before)
	}
	total := 0
	for _, n := range commands {
		total += n
	}
	if total != 6 {
		t.Errorf("observed %v commands, want 6 in all (INCRBY and EXPIRE for 3 ops)", commands)
	}
	if longest <= 0 || longest > wall {
		t.Errorf("longest round trip %v, want within (0, %v]", longest, wall)
	}
}
