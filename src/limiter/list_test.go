package limiter

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// list parses one descriptor "k" with the given rate_limits items and
// returns its first limit.
func list(t testing.TB, items string) *rules.Limit {
	t.Helper()
	cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n" + items)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Match("d", []rules.Entry{{Key: "k", Value: "v"}})
	if m.Limit == nil || !m.Limit.InList() {
		t.Fatalf("no list matched: %+v", m)
	}
	return m.Limit
}

const ladder = `      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, unit_multiplier: 5}
      - {unit: hour, requests_per_unit: 100, algorithm: token_bucket, burst: 10}
`

// TestListKeys: one key per limit, none shared with each other or with a
// single rate_limit on the descriptor, all with one hash tag.
func TestListKeys(t *testing.T) {
	t.Parallel()
	lim := list(t, ladder)
	entries := []rules.Entry{{Key: "k", Value: "v"}}
	now := time.Unix(1_700_000_029, 0)
	want := []string{
		"rl_{d_k_v}_1700000029_1_second",
		"rl_{d_k_v}_1699999800_5_minute",
		"rl_{d_k_v}_1_hour_token_bucket",
	}
	var got []string
	for _, l := range lim.Limits {
		got = append(got, string(CacheKey(nil, "rl_", "d", entries, l, now)))
	}
	if !slices.Equal(got, want) {
		t.Errorf("list keys = %q, want %q", got, want)
	}
	// A shadow limit of the same window as a limit in force: a key of
	// its own.
	twin := list(t, "      - {unit: second, requests_per_unit: 2}\n      - {unit: second, requests_per_unit: 1, shadow_mode: true}\n")
	if k := string(CacheKey(nil, "rl_", "d", entries, twin.Limits[1], now)); k != "rl_{d_k_v}_1700000029_1_second_shadow" {
		t.Errorf("shadow twin's key = %q", k)
	}
	esc := string(EscapedCacheKey(nil, "rl_", "d_x", []rules.Entry{{Key: "k", Value: "a_b"}}, lim.Limits[2], now))
	if want := `rl_{d\_x_k_a\_b}_1_hour_token_bucket`; esc != want {
		t.Errorf("escaped list key = %q, want %q", esc, want)
	}
	// The same windows as single rate_limits: other keys.
	for _, l := range lim.Limits {
		single := *l
		single.Limits, single.Index, single.StatLevel = nil, 0, ""
		s := string(CacheKey(nil, "rl_", "d", entries, &single, now))
		if slices.Contains(got, s) {
			t.Errorf("single-limit key %q is a list key", s)
		}
	}
}

func TestListDecides(t *testing.T) {
	t.Parallel()
	lim := list(t, ladder)
	reset := 10 * time.Second
	tests := []struct {
		name    string
		give    []Result // per limit, in order
		want    int      // the limit that decides
		code    Code
		remains uint32
	}{
		{"least_remaining", []Result{ok(0, 1, 1, time.Second), ok(0, 1, 4, reset), ok(0, 1, 9, reset)}, 0, OK, 1},
		{"least_remaining_later", []Result{ok(0, 1, 1, time.Second), ok(4, 5, 0, reset), ok(0, 1, 9, reset)}, 1, OK, 0},
		{"tie_resets_last", []Result{ok(0, 1, 4, time.Second), ok(0, 1, 4, reset), ok(0, 1, 9, reset)}, 1, OK, 4},
		{"tie_first", []Result{ok(0, 1, 4, reset), ok(0, 1, 4, reset), ok(0, 1, 9, reset)}, 0, OK, 4},
		{"over_beats_remaining", []Result{ok(0, 1, 0, time.Second), over(5, 6, 0, reset), ok(0, 1, 9, reset)}, 1, OverLimit, 0},
		{"over_resets_last", []Result{over(2, 3, 0, time.Second), over(5, 6, 0, reset), over(10, 11, 0, time.Minute)}, 2, OverLimit, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var keys []string
			var groups []uint32
			l := New(storeFunc(func(_ context.Context, b *Batch) error {
				for _, op := range b.Ops {
					keys, groups = append(keys, op.Key), append(groups, op.Group)
				}
				copy(b.Results, tt.give)
				return nil
			}), Config{})
			each := make([]Status, 3)
			ds := []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: lim, Hits: 1, Each: each}}
			out := make([]Status, 1)
			if err := l.Check(t.Context(), "d", base, ds, out); err != nil {
				t.Fatal(err)
			}
			if len(keys) != 3 || !slices.Equal(groups, []uint32{1, 1, 1}) {
				t.Fatalf("batch keys %q groups %v, want 3 ops of group 1", keys, groups)
			}
			if out[0].Limit != lim.Limits[tt.want] || out[0].Code != tt.code || out[0].Remaining != tt.remains {
				t.Errorf("status = limit %v code %v remaining %d, want limit %d code %v remaining %d",
					out[0].Limit.StatLevel, out[0].Code, out[0].Remaining, tt.want, tt.code, tt.remains)
			}
			if out[0] != each[tt.want] {
				t.Errorf("status %+v, want Each[%d] %+v", out[0], tt.want, each[tt.want])
			}
			for i, st := range each {
				if st.Limit != lim.Limits[i] || st.Counts.TotalHits != 1 {
					t.Errorf("Each[%d] = %+v, want the status of limit %d", i, st, i)
				}
			}
		})
	}
}

// TestListSkip: a replaced limit of a list gets no op and no status.
func TestListSkip(t *testing.T) {
	t.Parallel()
	lim := list(t, ladder)
	n := 0
	l := New(storeFunc(func(_ context.Context, b *Batch) error {
		n += len(b.Ops)
		for i := range b.Results {
			b.Results[i] = ok(0, 1, 1, time.Second)
		}
		return nil
	}), Config{})
	each := make([]Status, 3)
	ds := []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: lim, Hits: 1, Skip: 1 << 1, Each: each}}
	out := make([]Status, 1)
	if err := l.Check(t.Context(), "d", base, ds, out); err != nil {
		t.Fatal(err)
	}
	if n != 2 || each[1] != (Status{}) || each[0].Limit == nil || each[2].Limit == nil {
		t.Errorf("%d ops, Each %+v; want 2 ops and no status for the skipped limit", n, each)
	}
}

func TestCheckListAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	lim := list(t, `      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5}
`)
	l := New(results(ok(0, 1, 1, time.Second), ok(0, 1, 4, time.Second)), Config{Prefix: "rl_"})
	each := make([]Status, 2)
	ds := []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: lim, Hits: 1, Each: each}}
	out := make([]Status, 1)
	ctx := t.Context()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := l.Check(ctx, "d", base, ds, out); err != nil {
			t.Fatal(err)
		}
	})
	// One: the string of both keys, which the store may keep.
	if allocs > 1 {
		t.Errorf("Check of a two-limit descriptor: %v allocs per call, want at most 1", allocs)
	}
}
