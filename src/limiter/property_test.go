package limiter

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// The reference models below restate each algorithm as plainly as possible,
// from the whole history of admitted hits, with none of the pure functions'
// state tricks (no rolled counters, no ring, no GCRA). TestAgainstReference
// holds the pure functions to them on random traffic; storetest holds every
// store to the pure functions.

type hit struct {
	at int64 // µs
	n  uint64
}

type reference struct {
	op      Op
	history []hit // admitted hits (every hit for fixed windows)
	// token bucket as a level of credit in µs, refilled by elapsed time
	level, last int64
	started     bool
}

func (m *reference) apply(now time.Time, hits uint64) Result {
	switch m.op.Algorithm {
	case rules.FixedWindow:
		return m.fixed(now, hits)
	case rules.SlidingWindow:
		return m.slidingWindow(now.UnixMicro(), hits)
	case rules.SlidingLog:
		return m.slidingLog(now.UnixMicro(), hits)
	default:
		return m.tokenBucket(now.UnixMicro(), hits)
	}
}

func (m *reference) fixed(now time.Time, hits uint64) Result {
	w := int64(m.op.Window / time.Second)
	start := now.Unix() / w * w
	var count uint64
	for _, h := range m.history {
		if h.at/1e6/w*w == start {
			count += h.n
		}
	}
	m.history = append(m.history, hit{now.UnixMicro(), hits})
	r := Result{Before: count, After: count + hits, Allowed: count+hits <= m.op.Limit}
	if r.Allowed {
		r.Remaining = m.op.Limit - r.After
	}
	r.ResetAfter = time.Duration(start+w-now.Unix()) * time.Second
	return r
}

// estimate is the sliding window estimate at t, computed with big integers.
func (m *reference) estimate(t int64) uint64 {
	w := m.op.Window.Microseconds()
	cur := t / w
	var prev, curr uint64
	for _, h := range m.history {
		switch h.at / w {
		case cur:
			curr += h.n
		case cur - 1:
			prev += h.n
		}
	}
	rem := (cur+1)*w - t
	weight := ceilRat(big.NewRat(rem*1e6, w))
	weighted := ceilRat(new(big.Rat).SetFrac(new(big.Int).Mul(new(big.Int).SetUint64(prev), weight), big.NewInt(1e6)))
	return curr + weighted.Uint64()
}

func ceilRat(r *big.Rat) *big.Int {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

func (m *reference) slidingWindow(t int64, hits uint64) Result {
	used := m.estimate(t)
	r := Result{Before: used, After: used + hits}
	if r.After <= m.op.Limit {
		r.Allowed = true
		m.history = append(m.history, hit{t, hits})
		used = r.After
	}
	if used < m.op.Limit {
		r.Remaining = m.op.Limit - used
	}
	// The estimate never grows without hits, so the first time one more
	// fits is found by bisection over the next two windows.
	w := m.op.Window.Microseconds()
	switch {
	case m.op.Limit == 0:
		r.ResetAfter = m.op.Window
	case m.estimate(t)+1 <= m.op.Limit:
	default:
		lo, hi := int64(0), 2*w // estimate(t+lo)+1 > limit >= estimate(t+hi)+1
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if m.estimate(t+mid)+1 <= m.op.Limit {
				hi = mid
			} else {
				lo = mid
			}
		}
		r.ResetAfter = time.Duration(hi) * time.Microsecond
	}
	return r
}

func (m *reference) slidingLog(t int64, hits uint64) Result {
	w := m.op.Window.Microseconds()
	var used uint64
	oldest := int64(-1)
	for _, h := range m.history {
		if h.at > t-w {
			used += h.n
			if oldest < 0 {
				oldest = h.at
			}
		}
	}
	r := Result{Before: used, After: used + hits}
	if r.After <= m.op.Limit {
		r.Allowed = true
		if hits > 0 {
			m.history = append(m.history, hit{t, hits})
			if oldest < 0 {
				oldest = t
			}
		}
		used = r.After
	}
	if used < m.op.Limit {
		r.Remaining = m.op.Limit - used
	}
	switch {
	case m.op.Limit == 0:
		r.ResetAfter = m.op.Window
	case oldest >= 0:
		r.ResetAfter = time.Duration(oldest+w-t) * time.Microsecond
	}
	return r
}

// tokenBucket keeps the credit in the bucket as µs of refill: full is
// capacity × T; each hit takes T.
func (m *reference) tokenBucket(t int64, hits uint64) Result {
	capacity := m.op.Capacity()
	if capacity == 0 {
		return Result{After: hits, Allowed: hits == 0}
	}
	T := (m.op.Window.Microseconds() + int64(m.op.Limit) - 1) / int64(m.op.Limit)
	full := int64(capacity) * T
	if !m.started {
		m.level, m.last, m.started = full, t, true
	}
	m.level = min(full, m.level+(t-m.last))
	m.last = t
	used := capacity - uint64(m.level/T)
	r := Result{Before: used, After: used + hits}
	if r.After <= capacity {
		r.Allowed = true
		m.level -= int64(hits) * T
		used = r.After
	}
	r.Remaining = capacity - used
	r.ResetAfter = time.Duration(full-m.level) * time.Microsecond
	return r
}

// TestAgainstReference drives random traffic through each pure function and
// its reference model and requires identical results, field by field.
func TestAgainstReference(t *testing.T) {
	t.Parallel()
	windows := []time.Duration{time.Second, 7 * time.Second, time.Minute, time.Hour}
	for _, a := range rules.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(1, uint64(a)))
			for seq := range 300 {
				op := Op{
					Algorithm: a,
					Limit:     uint64(rng.IntN(20)),
					Window:    windows[rng.IntN(len(windows))],
				}
				if rng.IntN(3) == 0 {
					op.Burst = uint64(rng.IntN(30))
				}
				ref := &reference{op: op}
				var m machine
				now := base.Add(time.Duration(rng.Int64N(int64(op.Window))))
				for i := range 60 {
					// Bursts at one instant, small steps, and long gaps.
					switch rng.IntN(4) {
					case 0:
					case 1, 2:
						now = now.Add(time.Duration(rng.Int64N(int64(op.Window) / 5)))
					default:
						now = now.Add(time.Duration(rng.Int64N(int64(op.Window) * 2)))
					}
					now = now.Truncate(time.Microsecond)
					op.Hits = uint64(rng.IntN(4))
					want := ref.apply(now, op.Hits)
					if got := m.apply(now, op); got != want {
						t.Fatalf("seq %d step %d (%+v at +%v): got %+v, reference %+v",
							seq, i, op, now.Sub(base), got, want)
					}
				}
			}
		})
	}
}
