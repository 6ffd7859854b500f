package memory

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/storetest"
)

// serverClock makes the memory store behave as Redis does: fixed windows at
// Batch.Now (the window is in the key), the other algorithms on the
// server's own clock.
type serverClock struct{ s *Store }

func (c serverClock) Do(ctx context.Context, b *limiter.Batch) error {
	for i := range b.Ops {
		if b.Ops[i].Algorithm != rules.FixedWindow {
			b.Now = time.Now()
			break
		}
	}
	return c.s.Do(ctx, b)
}

// TestSuiteServerClock runs the suite the way the Redis store will, to keep
// its real-time mode honest. It waits for real time (about 2 s in all,
// the algorithms in parallel), so -short leaves it out.
func TestSuiteServerClock(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for real time")
	}
	t.Parallel()
	storetest.Run(t, func(t *testing.T) limiter.Store {
		return serverClock{newStore(t, Config{SweepInterval: -1})}
	}, storetest.Options{Clock: func(a rules.Algorithm) storetest.Clock {
		if a == rules.FixedWindow {
			return storetest.BatchClock
		}
		return storetest.ServerClock
	}})
}
