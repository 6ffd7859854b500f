package quota

import (
	"math"
	"testing"
	"time"
)

func TestRepresent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		give      float64
		want      float64
		wantFill  uint32
		wantEvery time.Duration
	}{
		{give: 100, want: 100, wantFill: 6000, wantEvery: time.Minute},
		{give: 1.9, want: 1.9, wantFill: 114, wantEvery: time.Minute},
		{give: 1.99999, want: 119.0 / 60, wantFill: 119, wantEvery: time.Minute},
		{give: 1.0 / 60, want: 1.0 / 60, wantFill: 1, wantEvery: time.Minute},
		{give: 0.01, want: 0.01, wantFill: 1, wantEvery: 100 * time.Second},
		{give: 1.0 / 3600, want: 1.0 / 3600, wantFill: 1, wantEvery: time.Hour},
		{give: 0.0003, want: 1.0 / 3334, wantFill: 1, wantEvery: 3334 * time.Second},
		{give: 1e-7, want: 0},
		{give: 0, want: 0},
		{give: -1, want: 0},
		{give: math.NaN(), want: 0},
		{give: 1e12, want: math.MaxUint32 / 60.0, wantFill: math.MaxUint32, wantEvery: time.Minute},
	}
	for _, tt := range tests {
		got := represent(tt.give)
		if math.Abs(got-tt.want) > 1e-12 || got > tt.give && got != 0 {
			t.Errorf("represent(%v) = %v, want %v (never more than given)", tt.give, got, tt.want)
		}
		if got == 0 {
			continue
		}
		fill, every := tokens(got)
		if fill != tt.wantFill || every != tt.wantEvery {
			t.Errorf("tokens(%v) = %d per %v, want %d per %v", got, fill, every, tt.wantFill, tt.wantEvery)
		}
		if g := (Grant{}).next(got, 3); math.Abs(g.Rate()-got) > 1e-12 {
			t.Errorf("next(%v).Rate() = %v", got, g.Rate())
		}
	}
}

func TestGrantNext(t *testing.T) {
	t.Parallel()
	perMinute := Grant{TokensPerFill: 1, FillInterval: time.Minute, MaxTokens: 2}
	tests := []struct {
		name  string
		from  Grant
		rate  float64
		burst uint32
		want  Grant
	}{
		{"from_deny", Grant{}, 2, 5, Grant{TokensPerFill: 120, FillInterval: time.Minute, MaxTokens: 5}},
		{"same", perMinute, 1.0 / 60, 2, perMinute},
		{"rate_changes_tokens", perMinute, 2.0 / 60, 2, Grant{TokensPerFill: 2, FillInterval: time.Minute, MaxTokens: 2}},
		{"burst_changes", perMinute, 1.0 / 60, 3, Grant{TokensPerFill: 1, FillInterval: time.Minute, MaxTokens: 3}},
		{
			// Envoy compares only the nanoseconds of fill_interval: one
			// token a minute to one every two would be ignored.
			"only_seconds_change_toggle_nanos", perMinute, 1.0 / 120, 2,
			Grant{TokensPerFill: 1, FillInterval: 2*time.Minute + time.Nanosecond, MaxTokens: 2},
		},
		{
			"toggle_back", Grant{TokensPerFill: 1, FillInterval: 2*time.Minute + time.Nanosecond, MaxTokens: 2}, 1.0 / 60, 2,
			perMinute,
		},
		{
			"same_rate_keeps_its_nanos", Grant{TokensPerFill: 1, FillInterval: 2*time.Minute + time.Nanosecond, MaxTokens: 2}, 1.0 / 120, 2,
			Grant{TokensPerFill: 1, FillInterval: 2*time.Minute + time.Nanosecond, MaxTokens: 2},
		},
		{"to_deny", perMinute, 0, 2, Grant{}},
		{"after_abandon", Grant{Abandon: true}, 1.0 / 60, 2, perMinute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.from.next(tt.rate, tt.burst)
			if got != tt.want {
				t.Errorf("%+v.next(%v, %d) = %+v, want %+v", tt.from, tt.rate, tt.burst, got, tt.want)
			}
			if math.Abs(got.Rate()-tt.rate) > 1e-12 {
				t.Errorf("Rate() = %v, want %v", got.Rate(), tt.rate)
			}
			// The property that matters: Envoy replaces its bucket
			// exactly when the rate or the burst changes.
			envoyKeeps := got.MaxTokens == tt.from.MaxTokens && got.TokensPerFill == tt.from.TokensPerFill &&
				got.FillInterval%time.Second == tt.from.FillInterval%time.Second && !tt.from.Deny() && !tt.from.Abandon
			changed := got.Rate() != tt.from.Rate() || got.MaxTokens != tt.from.MaxTokens
			if envoyKeeps && changed && !got.Deny() {
				t.Errorf("Envoy would keep %+v for %+v", tt.from, got)
			}
		})
	}
}
