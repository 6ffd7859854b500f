package memory

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

func TestLimiterOnMemory(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{SweepInterval: -1})
	l := limiter.New(s, limiter.Config{Prefix: "rl_", NearLimitRatio: 0.8})
	lim := &rules.Limit{RequestsPerUnit: 3, Unit: rules.Minute, UnitMultiplier: 1}
	ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: "alice"}}, Limit: lim, Hits: 1}}
	now := base.Add(10 * time.Second)
	reset := 50 * time.Second
	// Near threshold floor(3 × 0.8) = 2.
	want := []limiter.Status{
		{Code: limiter.OK, Remaining: 2, ResetAfter: reset, Counts: limiter.Counts{TotalHits: 1, WithinLimit: 1}},
		{Code: limiter.OK, Remaining: 1, ResetAfter: reset, Counts: limiter.Counts{TotalHits: 1, WithinLimit: 1}},
		{Code: limiter.OK, Remaining: 0, ResetAfter: reset, Counts: limiter.Counts{TotalHits: 1, WithinLimit: 1, NearLimit: 1}},
		{Code: limiter.OverLimit, ResetAfter: reset, Counts: limiter.Counts{TotalHits: 1, OverLimit: 1}},
	}
	out := make([]limiter.Status, 1)
	for i, w := range want {
		w.Limit = lim
		if err := l.Check(t.Context(), "api", now, ds, out); err != nil {
			t.Fatal(err)
		}
		if out[0] != w {
			t.Errorf("request %d: %+v, want %+v", i, out[0], w)
		}
	}
	// The key is the anchor's.
	rs, _ := do(t, s, now, limiter.Op{Key: "rl_api_user_alice_1699920000", Limit: 3, Window: time.Minute})
	if rs[0].Before != 4 {
		t.Errorf("anchor key rl_api_user_alice_1699920000 holds %d hits, want 4", rs[0].Before)
	}
}

func TestLimiterStopIncrementOnMemory(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{SweepInterval: -1})
	l := limiter.New(s, limiter.Config{StopIncrementWhenOverLimit: true})
	wide := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: rules.SlidingLog}
	narrow := &rules.Limit{RequestsPerUnit: 1, Unit: rules.Minute, UnitMultiplier: 1}
	ds := []limiter.Descriptor{
		{Entries: []rules.Entry{{Key: "ip", Value: "1"}}, Limit: wide, Hits: 1},
		{Entries: []rules.Entry{{Key: "user", Value: "bob"}}, Limit: narrow, Hits: 1},
	}
	out := make([]limiter.Status, 2)
	for i, want := range []limiter.Code{limiter.OK, limiter.OverLimit, limiter.OverLimit} {
		if err := l.Check(t.Context(), "d", base, ds, out); err != nil {
			t.Fatal(err)
		}
		if out[1].Code != want || out[0].Code != limiter.OK {
			t.Errorf("request %d: codes %v, %v; want OK, %v", i, out[0].Code, out[1].Code, want)
		}
		// Only the first request counted: the wide limit has 9 left.
		if out[0].Remaining != 9 {
			t.Errorf("request %d: wide limit Remaining %d, want 9", i, out[0].Remaining)
		}
	}
}

func TestLimiterCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	s := newStore(t, Config{SweepInterval: -1})
	for _, a := range rules.Algorithms {
		l := limiter.New(s, limiter.Config{Prefix: "rl_"})
		lim := &rules.Limit{RequestsPerUnit: 1 << 30, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: a}
		ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: "10.1.2.3"}}, Limit: lim, Hits: 1}}
		out := make([]limiter.Status, 1)
		ctx := t.Context()
		now := base
		allocs := testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Microsecond)
			if err := l.Check(ctx, "d", now, ds, out); err != nil {
				t.Fatal(err)
			}
		})
		// The key string, plus amortised growth of a sliding log's ring.
		if allocs > 3 {
			t.Errorf("%s: Limiter.Check on memory: %v allocs per decision, want at most 3", a, allocs)
		}
	}
}

func TestAllOrNothingAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	s := newStore(t, Config{SweepInterval: -1})
	b := &limiter.Batch{Now: base, AllOrNothing: true, Ops: []limiter.Op{
		op(rules.FixedWindow, "a", 1<<30, time.Minute, 1),
		op(rules.TokenBucket, "b", 1<<30, time.Minute, 1),
		op(rules.SlidingWindow, "c", 1, time.Minute, 1), // refused after the first run
	}, Results: make([]limiter.Result, 3)}
	ctx := t.Context()
	allocs := testing.AllocsPerRun(100, func() {
		if err := s.Do(ctx, b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("AllOrNothing batch on existing keys: %v allocs, want 0", allocs)
	}
}

// TestListCheckAllocs: a decision on a descriptor with two limits, applied
// as one group, costs its two key strings.
func TestListCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(`domain: d
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	entries := []rules.Entry{{Key: "remote_address", Value: "10.1.2.3"}}
	lim := cfg.Match("d", entries).Limit
	s := newStore(t, Config{SweepInterval: -1})
	l := limiter.New(s, limiter.Config{Prefix: "rl_"})
	ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1, Each: make([]limiter.Status, 2)}}
	out := make([]limiter.Status, 1)
	ctx := t.Context()
	now := base
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Microsecond)
		if err := l.Check(ctx, "d", now, ds, out); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("Limiter.Check of a two-limit descriptor on memory: %v allocs per decision, want at most 2 (the keys)", allocs)
	}
}
