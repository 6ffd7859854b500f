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
// dropped; under one second it divides by zero), and starts it with
// MaxTokens tokens, or, when it replaces a bucket it had, with the same
// fraction of MaxTokens that bucket had left. It keeps the bucket it has
// when MaxTokens, TokensPerFill and the nanoseconds of FillInterval are
// unchanged, whatever the seconds. Grants are built to fit: the seconds
// of FillInterval are whole and at least one; a grant whose rate changes
// changes TokensPerFill or MaxTokens, or else the nanoseconds of
// FillInterval (0 or 1 ns, which Envoy's rate ignores).
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

// fillSeconds is the fill interval of a grant of one request a second or
// more: rates are then multiples of one request a minute.
const fillSeconds = 60

// maxFillSeconds bounds the fill interval of the slowest grants (one
// token every maxFillSeconds, about 11.6 days); a share below that is a
// deny.
const maxFillSeconds = 1_000_000

// represent returns the largest rate at most rate that a grant can carry:
// a multiple of 1/60 from 1/60 up, 1/n for a whole n below, 0 below
// 1/maxFillSeconds.
func represent(rate float64) float64 {
	switch {
	case !(rate > 0):
		return 0
	case rate*fillSeconds >= 1:
		k := math.Floor(math.Min(rate*fillSeconds, math.MaxUint32))
		return k / fillSeconds
	}
	n := math.Ceil(1 / rate)
	if n > maxFillSeconds {
		return 0
	}
	return 1 / n
}

// tokens returns TokensPerFill and FillInterval of a rate represent gave.
func tokens(rate float64) (uint32, time.Duration) {
	if rate*fillSeconds >= 1-1e-9 {
		return uint32(math.Round(rate * fillSeconds)), fillSeconds * time.Second
	}
	return 1, time.Duration(math.Round(1/rate)) * time.Second
}

// next returns the grant of rate r (from represent) and burst b that
// follows g: g itself when nothing changes, and a FillInterval whose
// nanoseconds differ from g's when only its seconds do.
func (g Grant) next(r float64, b uint32) Grant {
	if r == 0 {
		return Grant{}
	}
	k, f := tokens(r)
	n := Grant{TokensPerFill: k, FillInterval: f, MaxTokens: b}
	old := g.FillInterval.Truncate(time.Second)
	switch {
	case g.Abandon || g.Deny():
	case g.TokensPerFill == k && g.MaxTokens == b && old == f:
		return g
	case g.TokensPerFill == k && g.MaxTokens == b:
		// Envoy would keep the old bucket, and its old rate.
		if g.FillInterval == old {
			n.FillInterval += time.Nanosecond
		}
	}
	return n
}
