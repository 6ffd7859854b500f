package memcached

import (
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestRoundTripObserver: Config.RoundTrip sees one round trip per command
// memcached answered, each within the wall time around the request.
func TestRoundTripObserver(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	var (
		mu      sync.Mutex
		n       int
		longest time.Duration
	)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, RoundTrip: func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		n++
		longest = max(longest, d)
	}})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t, "k")
	op := limiter.Op{Key: key, Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute, Hits: 1}
	mu.Lock()
	n, longest = 0, 0 // the probe's
	mu.Unlock()
	before, _ := s.Counters()
	start := time.Now()
	do(t, s, false, time.Now(), op)
	do(t, s, false, time.Now(), op)
	wall := time.Since(start)
	after, _ := s.Counters()
	mu.Lock()
	defer mu.Unlock()
	// The prober's ping, once a second, may fall in between: one more.
	if ops := int(after - before); n < max(ops, 2) || n > ops+1 {
		t.Errorf("observed %d round trips, Counters counted %d (want at least 2)", n, ops)
	}
	if longest <= 0 || longest > wall {
		t.Errorf("longest round trip %v, want within (0, %v]", longest, wall)
	}
}
