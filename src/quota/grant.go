package quota

import (
	"math"
	"time"
)

// Grant is what a subscriber is told to enforce: a token bucket, a deny
// (a share of zero) or an abandon. The zero Grant is a deny.
//
// Envoy 1.40 reads a token bucket as TokensPerFill / FillInterval requests
// a second, with FillInterval in whole seconds (a fraction of a second is
// dropped; under one second it divides by zero), refilled continuously,
// and starts it with MaxTokens tokens, or, when it replaces a bucket it
// had, with the same fraction of MaxTokens that bucket had left. It keeps
// the bucket it has when MaxTokens, TokensPerFill and the nanoseconds of
// FillInterval are unchanged, whatever the seconds (see tokens). The
// proto's text (envoy.type.v3.TokenBucket) reads it otherwise:
// TokensPerFill are added once every FillInterval, never above MaxTokens.
// Grants are built for both: FillInterval is whole seconds, 1 to 60,
// carrying the rate within a percent (or a request a minute): the
// closest whose TokensPerFill fits in MaxTokens, so that a client of the
// proto's reading gets the whole rate too, or else the fewest seconds. A rate
// one fill of which does not fit in the subscriber's burst is exact for
// Envoy 1.40 and gives a client of the proto's reading MaxTokens per
// FillInterval only: it would need a fill interval under a second, which
// Envoy 1.40 cannot read, or a burst above the rule's.
type Grant struct {
	// Abandon tells Envoy to drop the bucket; it subscribes again at its
	// next request.
	Abandon bool
	// TokensPerFill tokens every FillInterval, up to MaxTokens; no token
	// (0) is a deny.
	TokensPerFill uint32
	FillInterval  time.Duration
	MaxTokens     uint32
}

// Deny reports whether the grant denies every request.
func (g Grant) Deny() bool { return !g.Abandon && g.TokensPerFill == 0 }

// Rate is the grant's requests per second, as Envoy computes it.
func (g Grant) Rate() float64 {
	secs := int64(g.FillInterval / time.Second)
	if g.Abandon || g.TokensPerFill == 0 || secs == 0 {
		return 0
	}
	return float64(g.TokensPerFill) / float64(secs)
}

// maxExactFill is the longest fill interval, in seconds, of a grant of
// one request a minute or more: such rates are carried within a request
// a minute.
const maxExactFill = 60

// maxFillSeconds bounds the fill interval of the slowest grants (one
// token every maxFillSeconds, about 11.6 days); a share below that is a
// deny.
const maxFillSeconds = 1_000_000

// MinTokens is the fewest tokens a subscriber's token bucket holds: with
// one, a token that refills while no request is there waits for the next
// one, and evenly spaced requests above the rate get as little as half of
// it (docs/RLQS.md, the bound's N).
const MinTokens = 2

// represent returns the largest rate at most rate, within a percent of it
// (or a request a minute), that a grant of burst tokens carries: k/n for
// whole n up to maxExactFill seconds, the closest whose k fits in burst
// if one is close enough, else the shortest n; 1/n for a whole n below a
// request a minute; 0 below 1/maxFillSeconds.
func represent(rate float64, burst uint32) float64 {
	switch {
	case !(rate > 0):
		return 0
	case rate*maxExactFill >= 1:
		k, n := fill(rate, burst, max(rate/100, 1.0/maxExactFill))
		return float64(k) / float64(n)
	}
	// A rate a rounding error below 1/n is 1/n: sums of the same shares
	// in another order must give the same grant.
	n := math.Ceil(1 / rate * (1 - 1e-12))
	if n > maxFillSeconds {
		return 0
	}
	return 1 / n
}

// fill returns the tokens per fill and fill interval (seconds) of the
// largest rate at most rate, and within tolerance of it, that a grant of
// a request a minute or more carries, with n from 1 to maxExactFill and
// k = ⌊rate·n⌋: the closest whose k fits in burst, if that is close
// enough, else the first n close enough (n = 60 always is, for a
// tolerance of 1/60).
func fill(rate float64, burst uint32, tolerance float64) (k uint32, n int64) {
	var bestK, firstK uint32
	var bestN, firstN int64
	best := math.Inf(1)
	for n := int64(1); n <= maxExactFill; n++ {
		k := math.Floor(min(rate*float64(n)+1e-9, math.MaxUint32))
		if k < 1 {
			continue
		}
		loss := rate - k/float64(n)
		fits := k <= float64(burst)
		if fits && loss < best-1e-12 {
			bestK, bestN, best = uint32(k), n, loss
		}
		if loss <= tolerance && firstN == 0 {
			firstK, firstN = uint32(k), n
		}
		if !fits && firstN != 0 {
			// k only grows with n: nothing further fits.
			break
		}
	}
	switch {
	case bestN != 0 && best <= tolerance:
		return bestK, bestN
	case firstN != 0:
		return firstK, firstN
	}
	return uint32(math.Floor(math.Min(rate*maxExactFill+1e-9, math.MaxUint32))), maxExactFill
}

// tokens returns TokensPerFill and FillInterval of a rate represent gave
// for burst: the same rate. FillInterval is n seconds and n nanoseconds:
// Envoy 1.40 keeps its bucket when TokensPerFill, MaxTokens and the
// nanoseconds are unchanged, which then means the whole grant is; its
// rate ignores the nanoseconds, and a client of the proto's reading fills
// a billionth slower.
func tokens(rate float64, burst uint32) (uint32, time.Duration) {
	var k uint32
	var n int64
	if rate*maxExactFill < 1-1e-9 {
		k, n = 1, int64(math.Round(1/rate))
	} else {
		k, n = fill(rate, burst, 1e-9*rate)
	}
	return k, time.Duration(n)*time.Second + time.Duration(n)
}

// next returns the grant of rate r (from represent) and burst b.
func (g Grant) next(r float64, b uint32) Grant {
	if r == 0 {
		return Grant{}
	}
	k, f := tokens(r, b)
	return Grant{TokensPerFill: k, FillInterval: f, MaxTokens: b}
}
