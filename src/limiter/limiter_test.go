package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// storeFunc is a function-field fake: enough to see the batches Check sends
// and to inject one result or failure. Behaviour against real stores is
// storetest's job.
type storeFunc func(ctx context.Context, b *Batch) error

func (f storeFunc) Do(ctx context.Context, b *Batch) error { return f(ctx, b) }

// results answers every op with the given results, in order.
func results(rs ...Result) storeFunc {
	return func(_ context.Context, b *Batch) error {
		copy(b.Results, rs)
		return nil
	}
}

func TestCheckBuildsOneBatch(t *testing.T) {
	t.Parallel()
	perMinute := &rules.Limit{FullKey: "api.k", RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	// A limit the descriptor carries itself (an override) has no FullKey:
	// its ops name the domain.
	bucket := &rules.Limit{RequestsPerUnit: 5, Unit: rules.Second, UnitMultiplier: 2, Algorithm: rules.TokenBucket, Burst: 7}
	ds := []Descriptor{
		{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: perMinute, Hits: 1},
		{Entries: []rules.Entry{{Key: "none", Value: "x"}}, Hits: 1},
		{Entries: []rules.Entry{{Key: "u", Value: "alice"}}, Limit: bucket, Hits: 3},
		{Entries: []rules.Entry{{Key: "free", Value: "x"}}, Limit: &rules.Limit{Unlimited: true}, Hits: 1},
	}
	now := time.Unix(1_700_000_029, 5)
	calls := 0
	var got Batch
	l := New(storeFunc(func(_ context.Context, b *Batch) error {
		calls++
		got = Batch{Now: b.Now, Ops: append([]Op(nil), b.Ops...), AllOrNothing: b.AllOrNothing}
		if len(b.Results) != len(b.Ops) {
			t.Errorf("len(Results) = %d, want len(Ops) = %d", len(b.Results), len(b.Ops))
		}
		return nil
	}), Config{Prefix: "rl_", StopIncrementWhenOverLimit: true})
	out := make([]Status, len(ds))
	if err := l.Check(t.Context(), "api", now, ds, out); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if calls != 1 {
		t.Fatalf("store called %d times, want 1", calls)
	}
	want := []Op{
		{Key: "rl_api_k_v_1699999980", Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute, Hits: 1, Rule: "api.k"},
		{Key: "rl_api_u_alice_2_token_bucket", Algorithm: rules.TokenBucket, Limit: 5, Burst: 7, Window: 2 * time.Second, Hits: 3, PerSecond: true, Rule: "api"},
	}
	if len(got.Ops) != len(want) {
		t.Fatalf("Ops = %+v, want %+v", got.Ops, want)
	}
	for i := range want {
		if got.Ops[i] != want[i] {
			t.Errorf("Ops[%d] = %+v, want %+v", i, got.Ops[i], want[i])
		}
	}
	if !got.Now.Equal(now) || !got.AllOrNothing {
		t.Errorf("Batch Now %v AllOrNothing %v, want %v and true", got.Now, got.AllOrNothing, now)
	}
	if out[1] != (Status{}) || out[3] != (Status{}) {
		t.Errorf("unlimited descriptors: %+v %+v, want OK with nothing counted", out[1], out[3])
	}

	// No limited descriptor: no round trip.
	calls = 0
	if err := l.Check(t.Context(), "api", now, ds[1:2], out); err != nil || calls != 0 {
		t.Errorf("Check without limits: err %v, %d store calls; want nil, 0", err, calls)
	}
	// A reused batch carries nothing over.
	if err := l.Check(t.Context(), "api", now, ds[:1], out); err != nil || len(got.Ops) != 1 {
		t.Errorf("second Check: err %v, %d ops; want nil, 1", err, len(got.Ops))
	}
}

func TestCheckStatus(t *testing.T) {
	t.Parallel()
	ten := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	shadow := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1, ShadowMode: true}
	bucket := &rules.Limit{RequestsPerUnit: 1, Unit: rules.Second, UnitMultiplier: 1, Algorithm: rules.TokenBucket, Burst: 10}
	reset := 42 * time.Second
	// Near threshold: floor(10 × 0.8) = 8.
	tests := []struct {
		name  string
		limit *rules.Limit
		hits  uint64
		give  Result
		want  Status
	}{
		{"within", ten, 1, ok(3, 4, 6, reset),
			Status{Code: OK, Remaining: 6, ResetAfter: reset, Counts: Counts{TotalHits: 1, WithinLimit: 1}}},
		{"within_crossing_near", ten, 2, ok(7, 9, 1, reset),
			Status{Code: OK, Remaining: 1, ResetAfter: reset, Counts: Counts{TotalHits: 2, WithinLimit: 2, NearLimit: 1}}},
		{"within_all_near", ten, 2, ok(8, 10, 0, reset),
			Status{Code: OK, Remaining: 0, ResetAfter: reset, Counts: Counts{TotalHits: 2, WithinLimit: 2, NearLimit: 2}}},
		{"read_only", ten, 0, ok(9, 9, 1, reset),
			Status{Code: OK, Remaining: 1, ResetAfter: reset, Counts: Counts{}}},
		{"over_crossing", ten, 3, over(9, 12, 0, reset),
			Status{Code: OverLimit, ResetAfter: reset, Counts: Counts{TotalHits: 3, OverLimit: 2, NearLimit: 1}}},
		{"over_from_below_near", ten, 8, over(5, 13, 0, reset),
			Status{Code: OverLimit, ResetAfter: reset, Counts: Counts{TotalHits: 8, OverLimit: 3, NearLimit: 2}}},
		{"over_already", ten, 1, over(10, 11, 0, reset),
			Status{Code: OverLimit, ResetAfter: reset, Counts: Counts{TotalHits: 1, OverLimit: 1}}},
		{"over_remaining_ignored", ten, 5, over(7, 12, 3, reset),
			Status{Code: OverLimit, ResetAfter: reset, Counts: Counts{TotalHits: 5, OverLimit: 2, NearLimit: 2}}},
		{"shadow_over_crossing", shadow, 3, over(9, 12, 0, reset),
			Status{Code: OK, ResetAfter: reset, Counts: Counts{TotalHits: 3, OverLimit: 2, NearLimit: 1, ShadowMode: 2}}},
		{"shadow_over_already", shadow, 2, over(11, 13, 0, reset),
			Status{Code: OK, ResetAfter: reset, Counts: Counts{TotalHits: 2, OverLimit: 2, ShadowMode: 2}}},
		{"shadow_within", shadow, 1, ok(0, 1, 9, reset),
			Status{Code: OK, Remaining: 9, ResetAfter: reset, Counts: Counts{TotalHits: 1, WithinLimit: 1}}},
		{"token_bucket_threshold_is_burst", bucket, 4, over(8, 12, 0, reset),
			Status{Code: OverLimit, ResetAfter: reset, Counts: Counts{TotalHits: 4, OverLimit: 2, NearLimit: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := New(results(tt.give), Config{NearLimitRatio: 0.8})
			out := make([]Status, 1)
			ds := []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Limit: tt.limit, Hits: tt.hits}}
			if err := l.Check(t.Context(), "d", base, ds, out); err != nil {
				t.Fatalf("Check: %v", err)
			}
			tt.want.Limit = tt.limit
			if out[0] != tt.want {
				t.Errorf("Check() = %+v, want %+v", out[0], tt.want)
			}
		})
	}
}

func TestCheckNearLimitRatioIsFloat32(t *testing.T) {
	t.Parallel()
	// The anchor computes floor(float32(limit) × float32(ratio)); with
	// limit 90 and ratio 0.7 that is 63 in float32, where float64 gives
	// floor(62.99999999999999) = 62.
	lim := &rules.Limit{RequestsPerUnit: 90, Unit: rules.Minute, UnitMultiplier: 1}
	l := New(results(ok(62, 63, 27, 0)), Config{NearLimitRatio: 0.7})
	out := make([]Status, 1)
	if err := l.Check(t.Context(), "d", base, []Descriptor{{Limit: lim, Hits: 1}}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Counts.NearLimit != 0 {
		t.Errorf("NearLimit = %d, want 0 (threshold 63 as in the anchor)", out[0].Counts.NearLimit)
	}
}

func TestCheckErrors(t *testing.T) {
	t.Parallel()
	lim := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	ds := []Descriptor{{Limit: lim, Hits: 1}}
	down := New(storeFunc(func(context.Context, *Batch) error {
		return fmt.Errorf("redis: dial tcp 127.0.0.1:6379: %w", ErrUnavailable)
	}), Config{})
	err := down.Check(t.Context(), "d", base, ds, make([]Status, 1))
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Check with the store down = %v, want an error wrapping ErrUnavailable", err)
	}
	var zero Limiter
	if err := zero.Check(t.Context(), "d", base, ds, make([]Status, 1)); err == nil {
		t.Error("Check on a zero Limiter succeeded, want an error")
	}
	err = down.Check(t.Context(), "d", base, ds, nil)
	if err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("Check with a short out = %v, want a usage error", err)
	}
}

func TestCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	lim := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	l := New(results(ok(0, 1, 9, time.Second)), Config{Prefix: "rl_"})
	ds := []Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: "10.1.2.3"}}, Limit: lim, Hits: 1}}
	out := make([]Status, 1)
	ctx := t.Context()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := l.Check(ctx, "d", base, ds, out); err != nil {
			t.Fatal(err)
		}
	})
	// One: the key string the store may keep.
	if allocs > 1 {
		t.Errorf("Check: %v allocs per call, want at most 1", allocs)
	}
}

// TestCheckKeyFormat: Config.KeyFormat picks the key the store sees.
func TestCheckKeyFormat(t *testing.T) {
	t.Parallel()
	lim := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	ds := []Descriptor{{Entries: []rules.Entry{{Key: "k1", Value: "x_k2_y"}, {Key: "k2", Value: "z"}}, Limit: lim, Hits: 1}}
	now := time.Unix(1_700_000_029, 0)
	tests := []struct {
		name   string
		format KeyFormat
		want   string
	}{
		{"anchor_default", AnchorKeys, "rl_api_k1_x_k2_y_k2_z_1699999980"},
		{"escaped", EscapedKeys, `rl_api_k1_x\_k2\_y_k2_z_1699999980`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got string
			l := New(storeFunc(func(_ context.Context, b *Batch) error {
				got = b.Ops[0].Key
				return nil
			}), Config{Prefix: "rl_", KeyFormat: tt.format})
			if err := l.Check(t.Context(), "api", now, ds, make([]Status, 1)); err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}
