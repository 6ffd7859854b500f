package limiter_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// burstAndSustained is 2 a second and 5 a minute on one key.
const burstAndSustained = `domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, name: sustained}
`

// TestListBurstAndSustained: the third hit in a second is refused by the
// per-second limit, the sixth in a minute by the per-minute one, across
// second boundaries; with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT a
// refused hit is recorded in neither. The store has one shard, so that a
// new key's expiry samples (memory.Store) see the keys of the seconds
// before: a read back in time would find them gone.
func TestListBurstAndSustained(t *testing.T) {
	t.Parallel()
	cfg, err := rules.Parse([]rules.File{{Name: "d.yaml", Data: []byte(burstAndSustained)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	entries := []rules.Entry{{Key: "user", Value: "alice"}}
	lim := cfg.Match("d", entries).Limit
	start := time.Unix(1_699_920_010, 0) // 10 s into a minute
	type hit struct {
		at      time.Duration
		code    limiter.Code
		decider string // StatLevel of the deciding limit
		// read makes it a read (no hits) that checks what each limit
		// has left, instead of the code.
		read bool
		left [2]uint32
	}
	tests := []struct {
		name string
		stop bool
		hits []hit
	}{
		{"every_hit_counts", false, []hit{
			{at: 0, code: limiter.OK, decider: "second"},
			{at: 100 * time.Millisecond, code: limiter.OK, decider: "second"},
			{at: 200 * time.Millisecond, code: limiter.OverLimit, decider: "second"}, // 3 in the second
			{at: time.Second, code: limiter.OK, decider: "sustained"},                // minute: 4; 1 left in both: the later reset
			{at: 1100 * time.Millisecond, code: limiter.OK, decider: "sustained"},    // both 0 left: the later reset
			{at: 2 * time.Second, code: limiter.OverLimit, decider: "sustained"},     // minute: 6
			{at: 50 * time.Second, code: limiter.OK, decider: "second"},              // the next minute
		}},
		{"stop_increment", true, []hit{
			{at: 0, code: limiter.OK, decider: "second"},
			{at: 100 * time.Millisecond, code: limiter.OK, decider: "second"},
			{at: 200 * time.Millisecond, code: limiter.OverLimit, decider: "second"}, // recorded nowhere
			{at: time.Second, code: limiter.OK, decider: "second"},                   // minute: 3
			{at: 1100 * time.Millisecond, code: limiter.OK, decider: "second"},       // minute: 4, second: 2
			{at: 2 * time.Second, code: limiter.OK, decider: "sustained"},            // minute: 5
			{at: 2100 * time.Millisecond, code: limiter.OverLimit, decider: "sustained"},
			// Recorded in neither: the second holds the hit at +2 s only.
			{at: 2200 * time.Millisecond, read: true, left: [2]uint32{1, 0}},
			{at: 3 * time.Second, code: limiter.OverLimit, decider: "sustained"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mem := memory.New(memory.Config{Shards: 1})
			t.Cleanup(mem.Close)
			l := limiter.New(mem, limiter.Config{StopIncrementWhenOverLimit: tt.stop})
			for i, h := range tt.hits {
				each := make([]limiter.Status, 2)
				out := make([]limiter.Status, 1)
				ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1, Each: each}}
				if h.read {
					ds[0].Hits = 0
				}
				if err := l.Check(t.Context(), "d", start.Add(h.at), ds, out); err != nil {
					t.Fatal(err)
				}
				if h.read {
					if left := [2]uint32{each[0].Remaining, each[1].Remaining}; left != h.left {
						t.Errorf("read at +%v: %v left, want %v", h.at, left, h.left)
					}
					continue
				}
				if out[0].Code != h.code || out[0].Limit.StatLevel != h.decider {
					t.Errorf("hit %d at +%v: %v decided by %q, want %v by %q (each: %+v)",
						i+1, h.at, out[0].Code, out[0].Limit.StatLevel, h.code, h.decider, each)
				}
			}
		})
	}
}

// TestListMixedAlgorithms: a token bucket for bursts and a sliding window
// for the sustained rate, on one key.
func TestListMixedAlgorithms(t *testing.T) {
	t.Parallel()
	cfg, err := rules.Parse([]rules.File{{Name: "d.yaml", Data: []byte(`domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
      - {unit: minute, requests_per_unit: 6, algorithm: sliding_window}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	entries := []rules.Entry{{Key: "user", Value: "bob"}}
	lim := cfg.Match("d", entries).Limit
	mem := memory.New(memory.Config{})
	t.Cleanup(mem.Close)
	l := limiter.New(mem, limiter.Config{})
	start := time.Unix(1_699_920_000, 0)
	check := func(at time.Duration) limiter.Status {
		t.Helper()
		out := make([]limiter.Status, 1)
		if err := l.Check(t.Context(), "d", start.Add(at), []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// A burst of 3, then the bucket refuses the 4th.
	for i := range 3 {
		if st := check(0); st.Code != limiter.OK {
			t.Fatalf("burst hit %d: %+v, want OK", i+1, st)
		}
	}
	if st := check(0); st.Code != limiter.OverLimit || st.Limit != lim.Limits[0] {
		t.Errorf("4th hit at once: %+v, want refused by the token bucket", st)
	}
	// One token a second. Every limit applies to every hit as if alone,
	// so the sliding window counted the 4th hit, which it admitted: two
	// more fit, then its 6 are spent.
	for i := range 2 {
		if st := check(time.Duration(i+1) * time.Second); st.Code != limiter.OK {
			t.Fatalf("hit at +%ds: %+v, want OK", i+1, st)
		}
	}
	if st := check(3 * time.Second); st.Code != limiter.OverLimit || st.Limit != lim.Limits[1] {
		t.Errorf("7th hit in the minute: %+v, want refused by the sliding window", st)
	}
}
