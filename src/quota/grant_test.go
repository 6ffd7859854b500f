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
		burst     uint32
		want      float64
		wantFill  uint32
		wantEvery time.Duration
	}{
		{give: 100, burst: 100, want: 100, wantFill: 100, wantEvery: time.Second},
		// No fill fits in 3 tokens: the shortest that carries it.
		{give: 100, burst: 3, want: 100, wantFill: 100, wantEvery: time.Second},
		{give: 6.5, burst: 13, want: 6.5, wantFill: 13, wantEvery: 2 * time.Second},
		// A fill that fits, exact; else the shortest within a percent.
		{give: 1.9, burst: 20, want: 1.9, wantFill: 19, wantEvery: 10 * time.Second},
		{give: 1.9, burst: 10, want: 17.0 / 9, wantFill: 17, wantEvery: 9 * time.Second},
		// Within a percent: 41 every 7 s.
		{give: 5.9, burst: 2, want: 41.0 / 7, wantFill: 41, wantEvery: 7 * time.Second},
		{give: 3.78, burst: 2, want: 3.75, wantFill: 15, wantEvery: 4 * time.Second},
		{give: 1.99999, burst: 2, want: 1.98, wantFill: 99, wantEvery: 50 * time.Second},
		{give: 2.5, burst: 5, want: 2.5, wantFill: 5, wantEvery: 2 * time.Second},
		{give: 1.0 / 60, burst: 2, want: 1.0 / 60, wantFill: 1, wantEvery: time.Minute},
		{give: 0.01, burst: 2, want: 0.01, wantFill: 1, wantEvery: 100 * time.Second},
		{give: 1.0 / 3600, burst: 2, want: 1.0 / 3600, wantFill: 1, wantEvery: time.Hour},
		{give: 0.0003, burst: 2, want: 1.0 / 3334, wantFill: 1, wantEvery: 3334 * time.Second},
		{give: 1e-7, burst: 2, want: 0},
		{give: 0, burst: 2, want: 0},
		{give: -1, burst: 2, want: 0},
		{give: math.NaN(), burst: 2, want: 0},
		{give: 1e12, burst: 2, want: math.MaxUint32 / 60.0, wantFill: math.MaxUint32 / 15, wantEvery: 4 * time.Second},
	}
	for _, tt := range tests {
		got := represent(tt.give, tt.burst)
		if math.Abs(got-tt.want) > 1e-12 || got > tt.give && got != 0 {
			t.Errorf("represent(%v, %d) = %v, want %v (never more than given)", tt.give, tt.burst, got, tt.want)
		}
		if got == 0 {
			continue
		}
		if tt.give < 1e9 && got < tt.give-max(tt.give/100, 1.0/60) {
			t.Errorf("represent(%v, %d) = %v: more than a percent (or 1/60) below", tt.give, tt.burst, got)
		}
		fill, every := tokens(got, tt.burst)
		if fill != tt.wantFill || every.Truncate(time.Second) != tt.wantEvery {
			t.Errorf("tokens(%v, %d) = %d per %v, want %d per %v", got, tt.burst, fill, every, tt.wantFill, tt.wantEvery)
		}
		if g := (Grant{}).next(got, tt.burst); math.Abs(g.Rate()-got) > 1e-12 {
			t.Errorf("next(%v).Rate() = %v", got, g.Rate())
		}
	}
}

// TestGrantUsable offers each grant evenly spaced requests at its rate,
// and just above it, for a minute, to a token bucket as Envoy 1.40 reads
// it (refilled continuously) and as the proto's text does (TokensPerFill
// once every FillInterval, up to MaxTokens), and checks that it admits at
// least 95 % of its rate on Envoy 1.40, and on the proto's reading when
// a fill fits in its burst.
func TestGrantUsable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		rate  float64
		burst uint32
	}{
		{3.78, MinTokens}, {1.82, MinTokens}, {5.9, MinTokens}, {5.9, 6}, {2, 2}, {6.5, 2}, {6.5, 13}, {47.5, 5}, {47.5, 100}, {0.5, 2}, {0.05, 2},
	} {
		g := (Grant{}).next(represent(tt.rate, tt.burst), tt.burst)
		fits := g.TokensPerFill <= g.MaxTokens
		for _, offered := range []float64{g.Rate(), g.Rate() * 1.3} {
			// 200 requests' time, or four fills, after as long again
			// to reach a steady state.
			span := max(200/g.Rate(), 4*g.FillInterval.Seconds())
			continuous, discrete := admitEvenly(g, offered, span, false), admitEvenly(g, offered, span, true)
			want := 0.95 * g.Rate() * span
			if continuous < want {
				t.Errorf("%+v offered %.2f/s: Envoy 1.40 admits %.0f in %.0f s, want at least %.0f", g, offered, continuous, span, want)
			}
			if fits && discrete < want {
				t.Errorf("%+v offered %.2f/s: the proto's reading admits %.0f in %.0f s, want at least %.0f", g, offered, discrete, span, want)
			}
		}
		if tt.burst >= 13 && !fits {
			t.Errorf("%+v: a fill of %v/s does not fit in %d tokens", g, tt.rate, tt.burst)
		}
	}
}

// admitEvenly counts the requests a token bucket of grant g admits of
// requests every 1/offered s, in span seconds after as long again
// (starting full); discrete refills TokensPerFill once every
// FillInterval, as the proto's text reads it, else continuously, as
// Envoy 1.40 does.
func admitEvenly(g Grant, offered, span float64, discrete bool) float64 {
	tokens := float64(g.MaxTokens)
	every := g.FillInterval.Seconds()
	last, fills := 0.0, 0.0
	admitted := 0.0
	for i := 1; float64(i)/offered <= 2*span; i++ {
		at := float64(i) / offered
		if discrete {
			for ; (fills+1)*every <= at; fills++ {
				tokens = min(float64(g.MaxTokens), tokens+float64(g.TokensPerFill))
			}
		} else {
			tokens = min(float64(g.MaxTokens), tokens+g.Rate()*(at-last))
		}
		last = at
		if tokens >= 1-1e-9 {
			tokens--
			if at > span {
				admitted++
			}
		}
	}
	return admitted
}

func TestGrantNext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rate  float64
		burst uint32
		want  Grant
	}{
		{"per_second", 2, 5, Grant{TokensPerFill: 2, FillInterval: time.Second + 1, MaxTokens: 5}},
		{"per_minute", 1.0 / 60, 2, Grant{TokensPerFill: 1, FillInterval: time.Minute + 60, MaxTokens: 2}},
		{"fill_fits", 6.5, 13, Grant{TokensPerFill: 13, FillInterval: 2*time.Second + 2, MaxTokens: 13}},
		{"fill_does_not_fit", 6.5, 2, Grant{TokensPerFill: 13, FillInterval: 2*time.Second + 2, MaxTokens: 2}},
		{"same_tokens_other_seconds", 13.0 / 3, 2, Grant{TokensPerFill: 13, FillInterval: 3*time.Second + 3, MaxTokens: 2}},
		{"slow", 1.0 / 120, 2, Grant{TokensPerFill: 1, FillInterval: 2*time.Minute + 120, MaxTokens: 2}},
		{"deny", 0, 2, Grant{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := (Grant{Abandon: true}).next(tt.rate, tt.burst)
			if got != tt.want {
				t.Errorf("next(%v, %d) = %+v, want %+v", tt.rate, tt.burst, got, tt.want)
			}
			if math.Abs(got.Rate()-tt.rate) > 1e-12 {
				t.Errorf("Rate() = %v, want %v", got.Rate(), tt.rate)
			}
		})
	}
	// The property that matters: Envoy keeps its bucket (equal
	// TokensPerFill, MaxTokens and nanoseconds of FillInterval) exactly
	// when the grant is the same, whichever grants came between.
	for _, a := range tests {
		for _, b := range tests {
			ga, gb := (Grant{}).next(a.rate, a.burst), (Grant{}).next(b.rate, b.burst)
			envoyKeeps := !ga.Deny() && !gb.Deny() && ga.MaxTokens == gb.MaxTokens && ga.TokensPerFill == gb.TokensPerFill &&
				ga.FillInterval%time.Second == gb.FillInterval%time.Second
			if envoyKeeps != (ga == gb && !ga.Deny()) {
				t.Errorf("Envoy with %+v given %+v keeps it: %v", ga, gb, envoyKeeps)
			}
		}
	}
}
