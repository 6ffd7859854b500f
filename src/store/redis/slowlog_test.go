package redis

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestSlidingLogExpiryIsBounded fills a sliding log with rules.MaxSlidingLog
// entries, lets some or all of them expire, and measures in Redis's SLOWLOG
// how long the next op runs inside Redis: Redis is single-threaded, so a
// script that loops over the expired entries stalls every client. Each
// decision is also held to the pure function.
func TestSlidingLogExpiryIsBounded(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, scriptClock: true})

	const (
		limit = rules.MaxSlidingLog
		fills = 200 // ops of limit/fills hits, fillGap apart
		// maxRedisTime is the budget of one op in Redis. The loop that
		// dropped expired entries of a list one LINDEX at a time took
		// 16-18 ms here; the packed log takes 130-390 µs on 10,000 entries.
		maxRedisTime = time.Millisecond
	)
	tests := []struct {
		name    string
		window  time.Duration
		fillGap time.Duration
		after   time.Duration // from the first fill to the measured op
		want    uint64        // entries left in the window before that op
	}{
		// Every entry has expired: the whole list goes.
		{name: "all_expired", window: time.Minute, fillGap: time.Millisecond, after: 2 * time.Minute, want: 0},
		// The oldest half has expired: a prefix is trimmed.
		{name: "half_expired", window: 10 * time.Second, fillGap: 10 * time.Millisecond, after: 11*time.Second - 5*time.Millisecond, want: limit / 2},
		// One entry is left: the search must stop at the last one.
		{name: "newest_left", window: 10 * time.Second, fillGap: 10 * time.Millisecond, after: 10*time.Second + (fills-2)*10*time.Millisecond, want: limit / fills},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The machine is shared: take the best of three runs. Without
			// a bounded expiry every run takes many times the budget.
			best := time.Duration(1<<63 - 1)
			for run := range 3 {
				key := fmt.Sprintf("slowlog_%s_%d", tt.name, run)
				op := limiter.Op{Key: key, Algorithm: rules.SlidingLog, Limit: limit, Window: tt.window, Hits: limit / fills}
				start := time.Unix(1_700_000_000, 0)
				var model pure
				do := func(now time.Time, op limiter.Op) limiter.Result {
					t.Helper()
					b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}}
					if err := s.Do(t.Context(), b); err != nil {
						t.Fatal(err)
					}
					if want := model.apply(now, op); b.Results[0] != want {
						t.Fatalf("at %v: got %+v, the pure function gives %+v", now.Sub(start), b.Results[0], want)
					}
					return b.Results[0]
				}
				for i := range fills {
					if r := do(start.Add(time.Duration(i)*tt.fillGap), op); !r.Allowed {
						t.Fatalf("fill %d refused: %+v", i, r)
					}
				}
				if n, err := srv.Do(t.Context(), "STRLEN", stateKey(&op)); err != nil || n != int64(8*limit) {
					t.Fatalf("STRLEN %s = %v, %v; want %d: 8 bytes per entry", key, n, err, 8*limit)
				}

				op.Hits = 1
				d := redisTime(t, srv, func() {
					if r := do(start.Add(tt.after), op); r.Before != tt.want {
						t.Fatalf("entries in the window: %d, want %d", r.Before, tt.want)
					}
				})
				t.Logf("run %d: one op on %d entries, %d of them expired: %v in Redis", run, limit, limit-tt.want, d)
				best = min(best, d)
				if n, err := srv.Do(t.Context(), "STRLEN", stateKey(&op)); err != nil || n != int64(8*(tt.want+1)) {
					t.Errorf("STRLEN %s = %v, %v after the op; want %d (expired entries trimmed)", key, n, err, 8*(tt.want+1))
				}
			}
			if best >= maxRedisTime {
				t.Errorf("one sliding_log op took %v of Redis time at best, want < %v", best, maxRedisTime)
			}
		})
	}
}

// redisTime runs f, which sends one script call to srv, and returns the time
// that call took inside Redis, from SLOWLOG. srv must serve only this test.
func redisTime(t *testing.T, srv *harness.RedisServer, f func()) time.Duration {
	t.Helper()
	for _, cmd := range [][]string{
		{"CONFIG", "SET", "slowlog-log-slower-than", "0"},
		{"CONFIG", "SET", "slowlog-max-len", "1024"},
		{"SLOWLOG", "RESET"},
	} {
		if _, err := srv.Do(t.Context(), cmd...); err != nil {
			t.Fatal(err)
		}
	}
	f()
	reply, err := srv.Do(t.Context(), "SLOWLOG", "GET", "1024")
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := reply.([]any)
	var found []time.Duration
	for _, e := range entries {
		// id, timestamp, duration in µs, arguments, client, client name
		f, _ := e.([]any)
		if len(f) < 4 {
			continue
		}
		us, _ := f[2].(int64)
		args, _ := f[3].([]any)
		if len(args) == 0 {
			continue
		}
		if name, _ := args[0].(string); strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval") {
			found = append(found, time.Duration(us)*time.Microsecond)
		}
	}
	if len(found) != 1 {
		t.Fatalf("SLOWLOG holds %d script calls, want 1: %v", len(found), entries)
	}
	return found[0]
}
