package redis

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// pure is one key's state under the limiter's pure functions.
type pure struct {
	fw limiter.FixedWindowState
	sw limiter.SlidingWindowState
	sl limiter.SlidingLogState
	tb limiter.TokenBucketState
}

func (p *pure) apply(now time.Time, op limiter.Op) limiter.Result {
	var r limiter.Result
	switch op.Algorithm {
	case rules.SlidingWindow:
		p.sw, r = limiter.SlidingWindow(p.sw, now, op)
	case rules.SlidingLog:
		p.sl, r = limiter.SlidingLog(p.sl, now, op)
	case rules.TokenBucket:
		p.tb, r = limiter.TokenBucket(p.tb, now, op)
	default:
		p.fw, r = limiter.FixedWindow(p.fw, now, op)
	}
	return r
}

// TestScriptLargeValues holds the Lua script to the pure functions where
// doubles could betray it: windows from an hour to ten years, limits up to
// 2^32-1, hits in the thousands, times at microsecond resolution. (The
// storetest suite covers small windows and every decision path.)
func TestScriptLargeValues(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, scriptClock: true})
	rng := rand.New(rand.NewPCG(1, 2))
	windows := []time.Duration{
		time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
		30 * 24 * time.Hour, 365 * 24 * time.Hour, 10 * 365 * 24 * time.Hour,
	}
	limits := []uint64{1, 7, 1000, 999_983, 1 << 31, 1<<32 - 1}
	for _, alg := range []rules.Algorithm{rules.SlidingWindow, rules.TokenBucket, rules.SlidingLog} {
		for seq := range 12 {
			w := windows[rng.IntN(len(windows))]
			limit := limits[rng.IntN(len(limits))]
			if alg == rules.SlidingLog {
				limit = min(limit, 5000) // the log holds one entry per hit
			}
			op := limiter.Op{
				Key:       fmt.Sprintf("large_%s_%d", alg, seq),
				Algorithm: alg, Limit: limit, Window: w,
			}
			if alg == rules.TokenBucket && rng.IntN(2) == 0 {
				op.Burst = limits[rng.IntN(len(limits))]
			}
			now := time.Unix(1_700_000_000+rng.Int64N(1e8), rng.Int64N(1e9)).Truncate(time.Microsecond)
			var model pure
			for step := range 30 {
				now = now.Add(time.Duration(rng.Int64N(int64(w) / 3))).Truncate(time.Microsecond)
				op.Hits = uint64(rng.IntN(3)) * max(1, limit/uint64(1+rng.IntN(20)))
				if alg == rules.SlidingLog {
					op.Hits = min(op.Hits, 500)
				}
				b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}}
				if err := s.Do(t.Context(), b); err != nil {
					t.Fatal(err)
				}
				if want := model.apply(now, op); b.Results[0] != want {
					t.Fatalf("%s seq %d step %d (limit %d, burst %d, window %v, hits %d): got %+v, the pure function gives %+v",
						alg, seq, step, op.Limit, op.Burst, w, op.Hits, b.Results[0], want)
				}
			}
		}
	}
}
