package redis

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// rawDo sends one command to the Redis that serves key, bypassing the store.
type rawDo func(ctx context.Context, key string, args ...string) (any, error)

// deployments runs f on a single Redis and on a Cluster, whose keys spread
// over three masters.
func deployments(t *testing.T, f func(t *testing.T, cfg Config, raw rawDo)) {
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := storetest.StartRedis(t, storetest.RedisOptions{})
		f(t, Config{URL: srv.Addr}, func(ctx context.Context, _ string, args ...string) (any, error) {
			return srv.Do(ctx, args...)
		})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := storetest.StartRedisCluster(t, storetest.RedisOptions{})
		f(t, Config{Type: TypeCluster, URL: c.URL}, func(ctx context.Context, key string, args ...string) (any, error) {
			m, err := c.MasterFor(ctx, key)
			if err != nil {
				return nil, err
			}
			return m.Do(ctx, args...)
		})
	})
}

// modes are the two ways a batch is applied: INCRBY or one script per op,
// and all-or-nothing scripts.
var modes = []struct {
	name         string
	allOrNothing bool
}{{"each", false}, {"all_or_nothing", true}}

// TestSaturation: no hit, however large, wraps, resets or fails a count.
// A fixed window driven to the top of Redis's integer range stays over its
// limit without an error or a health change, and for every algorithm a hit
// of limiter.MaxHits is decided exactly as the pure function decides it.
func TestSaturation(t *testing.T) {
	t.Parallel()
	deployments(t, func(t *testing.T, cfg Config, raw rawDo) {
		cfg.ScriptClock = true
		// The probe would mark the store up again; only round trips may
		// change its health here.
		cfg.HealthCheckActiveConnection, cfg.HealthCheckInterval = true, time.Hour
		s := newStore(t, cfg)
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_700_000_000, 0)

		t.Run("fixed_window_near_max_int64", func(t *testing.T) {
			for _, m := range modes {
				key := "saturate_" + m.name
				const start = math.MaxInt64 - 7
				if _, err := raw(t.Context(), key, "SET", key, strconv.FormatInt(start, 10)); err != nil {
					t.Fatal(err)
				}
				for i, hits := range []uint64{limiter.MaxHits, 1, limiter.MaxHits, 0, 3} {
					op := limiter.Op{Key: key, Limit: 10, Window: time.Hour, Hits: hits}
					b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}, AllOrNothing: m.allOrNothing}
					if err := s.Do(t.Context(), b); err != nil {
						t.Fatalf("%s: hit %d (%d hits) on a count near 2^63: %v", m.name, i, hits, err)
					}
					if r := b.Results[0]; r.Allowed || r.After <= op.Limit || r.Before <= op.Limit || r.Remaining != 0 {
						t.Errorf("%s: hit %d (%d hits): %+v, want over the limit", m.name, i, hits, r)
					}
					if hits == limiter.MaxHits && !m.allOrNothing && b.Results[0].After != math.MaxInt64 {
						t.Errorf("%s: hit %d: After = %d, want the count saturated at %d", m.name, i, b.Results[0].After, int64(math.MaxInt64))
					}
					if !s.Healthy() {
						t.Fatalf("%s: hit %d: a saturated count marked the store unhealthy", m.name, i)
					}
				}
				v, err := raw(t.Context(), key, "GET", key)
				if n, perr := strconv.ParseInt(fmt.Sprint(v), 10, 64); err != nil || perr != nil || n < start {
					t.Errorf("%s: GET %s = %v, %v; want a count of at least %d: never wrapped or reset", m.name, key, v, err, int64(start))
				}
			}

			// decideLua records a fixed window's hits only when admitted, so
			// the store never has it INCRBY past the top; called without
			// all-or-nothing, as a fixed window counts in the anchor, it
			// saturates too.
			key := "saturate_script"
			if _, err := raw(t.Context(), key, "SET", key, strconv.FormatInt(math.MaxInt64-7, 10)); err != nil {
				t.Fatal(err)
			}
			hits := strconv.FormatUint(limiter.MaxHits, 10)
			reply, err := raw(t.Context(), key, "EVAL", decideLua, "1", key, "", "0", "0", "10", "10", "3600000000", hits, "3600")
			vals, _ := reply.([]any)
			var after int64
			if len(vals) == 1+resultsPerOp {
				after, _ = vals[3].(int64)
			}
			if err != nil || len(vals) != 1+resultsPerOp || vals[1] != int64(0) || after <= 10 {
				t.Errorf("decideLua of %s hits on a count near 2^63 = %v, %v; want recorded, over the limit", hits, reply, err)
			}
		})

		for _, alg := range rules.Algorithms {
			for _, m := range modes {
				t.Run(fmt.Sprintf("%s/%s", alg, m.name), func(t *testing.T) {
					var model pure
					do := func(op limiter.Op, at time.Time) limiter.Result {
						t.Helper()
						b := &limiter.Batch{Now: at, Ops: []limiter.Op{op}, AllOrNothing: m.allOrNothing}
						if err := s.Do(t.Context(), b); err != nil {
							t.Fatalf("%d hits: %v", op.Hits, err)
						}
						prev := model
						want := model.apply(at, op)
						if m.allOrNothing && !want.Allowed {
							model = prev // nothing recorded, fixed windows included
						}
						if b.Results[0] != want {
							t.Fatalf("%d hits: got %+v, the pure function gives %+v", op.Hits, b.Results[0], want)
						}
						return b.Results[0]
					}

					// A spent key stays spent after a hit of MaxHits.
					spent := limiter.Op{Key: fmt.Sprintf("spent_%s_%s", alg, m.name), Algorithm: alg, Limit: 5, Window: time.Hour}
					for i, hits := range []uint64{5, limiter.MaxHits, 1, limiter.MaxHits, 0, 1} {
						spent.Hits = hits
						r := do(spent, now.Add(time.Duration(i)*time.Second))
						if i > 0 && (r.Remaining != 0 || hits > 0 && r.Allowed) {
							t.Fatalf("hit %d (%d hits) on a spent key: %+v, want it still spent", i, hits, r)
						}
					}

					// A hit of MaxHits fills a key whose capacity is MaxHits.
					if alg == rules.SlidingLog {
						return // its limit is at most rules.MaxSlidingLog
					}
					model = pure{}
					full := limiter.Op{Key: fmt.Sprintf("full_%s_%s", alg, m.name), Algorithm: alg, Limit: limiter.MaxHits, Window: time.Hour}
					for i, hits := range []uint64{limiter.MaxHits, 1, 0} {
						full.Hits = hits
						if r := do(full, now); i < 2 && r.Allowed != (i == 0) {
							t.Fatalf("hit %d (%d hits) on a key of capacity MaxHits: %+v", i, hits, r)
						}
					}
					if alg != rules.TokenBucket {
						return
					}
					// A bucket of MaxHits tokens refilled one an hour: filled,
					// its TAT lies past 2^63 µs and saturates.
					model = pure{}
					huge := limiter.Op{Key: "huge_" + m.name, Algorithm: alg, Limit: 1, Burst: limiter.MaxHits, Window: time.Hour}
					for i, hits := range []uint64{limiter.MaxHits, 1, 0} {
						huge.Hits = hits
						do(huge, now.Add(time.Duration(i)*time.Second))
					}
				})
			}
		}
	})
}
