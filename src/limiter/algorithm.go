package limiter

import (
	"math"
	"math/bits"
	"time"
)

// The algorithms' math, one pure function each, in the AllowN(t, n) style of
// golang.org/x/time/rate: (state, now, op) -> (new state, Result). The memory
// store calls them under its shard lock; the Redis Lua scripts mirror them
// line for line, so they use integer arithmetic only. Times are Unix
// microseconds (Redis TIME's resolution; 2^53 µs is the year 2255, so Lua's
// doubles hold them exactly) and counts are unsigned integers.
//
// What each algorithm reports (docs/RULES.md copies this table; W is the
// window, T = ceil(W / limit) the token bucket's refill interval):
//
//	| algorithm      | state per key                        | admitted when            | Before / After measure                 | Remaining                      | ResetAfter                                         |
//	|----------------|--------------------------------------|--------------------------|----------------------------------------|--------------------------------|----------------------------------------------------|
//	| fixed_window   | count of the key's window            | count + hits <= limit    | window count (hits recorded even over) | limit - count (0 when over)    | until the window ends, whole seconds as the anchor |
//	| sliding_window | window start, prev and curr counts   | estimate + hits <= limit | estimate = curr + ceil(prev × weight)  | limit - estimate               | until one more hit fits (0 when one fits now)      |
//	| sliding_log    | the last <= limit hit times (a ring) | logged + hits <= limit   | hits logged in the last W              | limit - logged (exact)         | until the oldest logged hit leaves (0 when none)   |
//	| token_bucket   | TAT, one timestamp (GCRA)            | used + hits <= capacity  | used = ceil(max(0, TAT - now) / T)     | capacity - used (whole tokens) | until the bucket is full: TAT - now                |
//
// For the three continuous algorithms a refused op changes nothing. Hits 0
// reads the state without recording. A refund (Op.Refund) gives hits back
// instead (see Refunds below). A limit of 0 refuses every hit; then
// ResetAfter is one window for sliding_window and sliding_log (nothing will
// ever fit: a hint for clients, not a promise) and 0 for token_bucket (a
// bucket of capacity 0 is always full).

// Refunds. An op with Refund set gives back up to Hits of the hits the key
// holds now (envoyproxy/ratelimit's is_negative_hits), newest first, and
// never takes a key below the zero state, so that a refund of more than
// was spent frees at most the whole limit:
//
//	| algorithm      | a refund of h                                                        |
//	|----------------|----------------------------------------------------------------------|
//	| fixed_window   | count - min(count, h), in the current window's key                   |
//	| sliding_window | Curr first, then Prev (the previous window's count), each down to 0  |
//	| sliding_log    | the min(logged, h) newest hits of the last window leave the log      |
//	| token_bucket   | TAT - min(TAT - now, h × T): h tokens back, never past a full bucket |
//
// A refund is never refused: its Result is that of a read (Hits 0) of the
// state after it, with Allowed set, so Before = After, the units in use
// after the refund, and Remaining and ResetAfter are a read's. (A fixed
// window still over its limit after a refund reports Remaining 0.) A
// refund of 0 hits is a read.

// weightScale is the resolution of the sliding window weight: millionths.
// prev × weight stays below 2^53 for any uint32 limit, so Lua computes it
// exactly.
const weightScale = 1_000_000

// FixedWindowState is the state of one fixed-window key: the number of hits
// recorded in the key's window. The window itself is in the key (see
// CacheKey), so a new window starts from the zero state.
type FixedWindowState struct {
	Count uint64
}

// FixedWindow records op.Hits in the window and reports whether the count is
// still within op.Limit. As in envoyproxy/ratelimit (INCRBY, then compare),
// hits are recorded even when they go over the limit, so a client that keeps
// sending stays over until the window ends.
//
// Remaining is op.Limit minus the count (0 when over); ResetAfter is the time
// to the end of the window, counted in whole seconds from now.Unix() exactly
// as the anchor's DurationUntilReset (so it is never 0: at 12:00:59.9 a
// minute window resets after 1 s).
func FixedWindow(s FixedWindowState, now time.Time, op Op) (FixedWindowState, Result) {
	if op.Refund {
		s.Count -= min(s.Count, op.Hits)
		return refunded(FixedWindow(s, now, op.read()))
	}
	before := s.Count
	s.Count = satAdd(before, op.Hits)
	r := Result{
		Before:     before,
		After:      s.Count,
		Allowed:    s.Count <= op.Limit,
		ResetAfter: FixedWindowEnd(now, op.Window).Sub(time.Unix(now.Unix(), 0)),
	}
	if r.Allowed {
		r.Remaining = op.Limit - s.Count
	}
	return s, r
}

// FixedWindowEnd is when the fixed window of length window that holds now
// ends: WindowStart plus the window.
func FixedWindowEnd(now time.Time, window time.Duration) time.Time {
	w := int64(window / time.Second)
	if w < 1 {
		w = 1
	}
	return time.Unix(WindowStart(now, w)+w, 0)
}

// SlidingWindowState is the state of one sliding-window key: the counts of
// the current and the previous window, and where the current one starts.
// Windows are aligned to the epoch as fixed windows are. The zero value is
// a key never hit.
type SlidingWindowState struct {
	// Start is the start of the current window in Unix microseconds.
	Start int64
	// Prev and Curr are the hits recorded in the previous and the current window.
	Prev, Curr uint64
}

// SlidingWindow admits op.Hits when the estimated number of hits in the last
// window, plus op.Hits, is within op.Limit, and then records them in the
// current window.
//
// With W the window and rem = Start + W - now (1..W µs, the part of the
// previous window still inside the sliding one), the estimate is
//
//	weight   = ceil(rem × 1e6 / W)              // millionths, 1..1e6
//	estimate = Curr + ceil(Prev × weight / 1e6)
//
// Both roundings are up, so the estimate never undercounts. (For Lua:
// rem × 1e6 exceeds 2^53 for windows over 104 days; compute it in two steps
// of 1e3.) Remaining is op.Limit minus the estimate after the op; ResetAfter
// is the time until one more hit would fit, 0 when one fits now.
func SlidingWindow(s SlidingWindowState, now time.Time, op Op) (SlidingWindowState, Result) {
	w := windowMicros(op.Window)
	t := now.UnixMicro()
	s = s.roll(t, w)
	if op.Refund {
		k := min(s.Curr, op.Hits)
		s.Curr -= k
		s.Prev -= min(s.Prev, op.Hits-k)
		return refunded(SlidingWindow(s, now, op.read()))
	}
	if t < s.Start { // the clock went back: count as the window's start
		t = s.Start
	}
	rem := uint64(s.Start + w - t)
	used := satAdd(s.Curr, weigh(s.Prev, rem, uint64(w)))
	r := Result{Before: used, After: satAdd(used, op.Hits)}
	if r.After <= op.Limit {
		r.Allowed = true
		s.Curr += op.Hits
		used = r.After
	}
	if used < op.Limit {
		r.Remaining = op.Limit - used
	}
	r.ResetAfter = micros(s.untilFits(rem, uint64(w), op.Limit))
	return s, r
}

// roll moves s to the window that holds t: the current window becomes the
// previous one when t is in the next window, and both are forgotten when t
// is later still.
func (s SlidingWindowState) roll(t, w int64) SlidingWindowState {
	start := floorDiv(t, w) * w
	switch {
	case start <= s.Start: // same window (or the clock went back)
		return s
	case start-w == s.Start:
		return SlidingWindowState{Start: start, Prev: s.Curr}
	default:
		return SlidingWindowState{Start: start}
	}
}

// weigh is ceil(prev × ceil(rem × 1e6 / w) / 1e6).
func weigh(prev, rem, w uint64) uint64 {
	if prev == 0 {
		return 0
	}
	return mulDivCeil(prev, mulDivCeil(rem, weightScale, w), weightScale)
}

// untilFits is how long, in µs, until the estimate plus one hit is within
// limit, with rem µs of the current window left.
func (s SlidingWindowState) untilFits(rem, w, limit uint64) uint64 {
	if limit == 0 {
		return w
	}
	if s.Curr < limit {
		// Within this window: the weighted Prev must drop to limit-1-Curr.
		// ceil(Prev×wt/1e6) <= k  <=>  wt <= floor(k×1e6/Prev), and
		// ceil(r×1e6/w) <= wmax    <=>  r <= floor(wmax×w/1e6).
		if s.Prev == 0 {
			return 0
		}
		wmax := mulDiv(limit-1-s.Curr, weightScale, s.Prev)
		rmax := mulDiv(wmax, w, weightScale)
		if rmax >= rem {
			return 0
		}
		return rem - rmax
	}
	// Only in the next window, where Curr becomes Prev and Curr is 0. There
	// wmax < 1e6 because Curr >= limit, so it fits before that window ends.
	wmax := mulDiv(limit-1, weightScale, s.Curr)
	rmax := mulDiv(wmax, w, weightScale)
	return rem + w - rmax
}

// IdleAt is when, in Unix microseconds, s becomes the same as the zero
// state: two windows after Start, both counts have left. A store may forget
// the key from then on.
func (s SlidingWindowState) IdleAt(window time.Duration) int64 {
	return satAddInt(s.Start, 2*windowMicros(window))
}

// SlidingLogState is the state of one sliding-log key: the times of the
// hits of the last window, oldest first, in a ring that grows up to the
// limit. The zero value is an empty log.
//
// SlidingLog updates the ring in place: the state it returns shares memory
// with the one it was given, which must not be used again. A full log takes
// 8 bytes per unit of the limit, so sliding_log suits small limits (a few
// thousand a window); sliding_window counts large ones in 24 bytes.
type SlidingLogState struct {
	ring []int64 // capacity; the log is ring[head], ring[head+1], ... (mod len), n of them
	head int
	n    int
}

// SlidingLog admits op.Hits when the hits logged in the last window plus
// op.Hits are within op.Limit, and then logs op.Hits copies of now. A hit
// logged at time ts counts while now < ts + W.
//
// Remaining is exact: op.Limit minus the hits logged after the op.
// ResetAfter is the time until the oldest logged hit leaves the window (0
// when the log is empty); when the log is full that is when one more hit fits.
func SlidingLog(s SlidingLogState, now time.Time, op Op) (SlidingLogState, Result) {
	if op.Refund {
		s, _ = SlidingLog(s, now, op.read()) // drops the hits that left the window
		s.Forget(int(min(op.Hits, uint64(s.n))))
		return refunded(SlidingLog(s, now, op.read()))
	}
	w := windowMicros(op.Window)
	t := now.UnixMicro()
	if s.n > 0 {
		t = max(t, s.at(s.n-1)) // keep the log sorted if the clock went back
	}
	for s.n > 0 && s.at(0) <= t-w {
		s.head++
		if s.head == len(s.ring) {
			s.head = 0
		}
		s.n--
	}
	used := uint64(s.n)
	r := Result{Before: used, After: satAdd(used, op.Hits)}
	if r.After <= op.Limit {
		r.Allowed = true
		s.push(t, int(op.Hits), op.Limit)
		used = r.After
	}
	if used < op.Limit {
		r.Remaining = op.Limit - used
	}
	if op.Limit == 0 {
		r.ResetAfter = micros(uint64(w))
	} else if s.n > 0 {
		r.ResetAfter = micros(uint64(s.at(0) + w - t))
	}
	return s, r
}

// at is the i-th logged time, oldest first.
func (s *SlidingLogState) at(i int) int64 {
	i += s.head
	if i >= len(s.ring) {
		i -= len(s.ring)
	}
	return s.ring[i]
}

// push logs k copies of t, growing the ring by doubling up to limit.
func (s *SlidingLogState) push(t int64, k int, limit uint64) {
	if need := s.n + k; need > len(s.ring) {
		c := max(2*len(s.ring), 4)
		if uint64(c) > limit {
			c = int(limit)
		}
		c = max(c, need)
		ring := make([]int64, c)
		for i := range s.n {
			ring[i] = s.at(i)
		}
		s.ring, s.head = ring, 0
	}
	for range k {
		i := s.head + s.n
		if i >= len(s.ring) {
			i -= len(s.ring)
		}
		s.ring[i] = t
		s.n++
	}
}

// Len is the number of hits in the log, including any that have left the
// window since the last op.
func (s SlidingLogState) Len() int { return s.n }

// At returns the time, in Unix microseconds, of the i-th logged hit, oldest
// first, for 0 <= i < Len (a store that encodes the log reads it so).
func (s SlidingLogState) At(i int) int64 { return s.at(i) }

// SlidingLogStateOf returns the log of the hits at times (Unix µs), which
// must be sorted, oldest first; the state takes times as its ring (a store
// that decodes a log builds it so).
func SlidingLogStateOf(times []int64) SlidingLogState {
	return SlidingLogState{ring: times, n: len(times)}
}

// Cap is the capacity of the log's ring: how many hit times it holds
// before it grows, 8 bytes each. A store that bounds its memory accounts
// the ring with it; the ring never shrinks.
func (s SlidingLogState) Cap() int { return len(s.ring) }

// Forget removes the k newest hits from the log. A store uses it to undo an
// op of an AllOrNothing batch; k is the op's Hits.
func (s *SlidingLogState) Forget(k int) {
	s.n -= min(k, s.n)
}

// IdleAt is when, in Unix microseconds, every logged hit has left the
// window; a store may forget the key from then on.
func (s SlidingLogState) IdleAt(window time.Duration) int64 {
	if s.n == 0 {
		return math.MinInt64
	}
	return satAddInt(s.at(s.n-1), windowMicros(window))
}

// TokenBucketState is the state of one token-bucket key in the GCRA form:
// the theoretical arrival time (TAT) in Unix microseconds, the time from
// which the bucket is full again. The zero value is a full bucket.
type TokenBucketState struct {
	TAT int64
}

// TokenBucket admits op.Hits when the bucket holds that many whole tokens and
// then takes them. The bucket holds op.Capacity() tokens and refills op.Limit
// tokens per op.Window, one every T = ceil(W / Limit) µs (rounded up, so a
// rate above one per microsecond is slowed to that). With x = max(0, TAT-now)
// the tokens in use are ceil(x / T), and an admitted op moves TAT to
// max(TAT, now) + Hits × T. A Capacity of 1 spaces hits evenly.
//
// Remaining is the whole tokens left after the op; ResetAfter is the time
// until the bucket is full again, TAT - now.
func TokenBucket(s TokenBucketState, now time.Time, op Op) (TokenBucketState, Result) {
	if op.Refund {
		if t := now.UnixMicro(); op.Capacity() > 0 && s.TAT > t {
			T := ceilDiv(uint64(windowMicros(op.Window)), op.Limit)
			s.TAT -= int64(min(uint64(s.TAT-t), satMul(op.Hits, T)))
		}
		return refunded(TokenBucket(s, now, op.read()))
	}
	capacity := op.Capacity()
	if capacity == 0 {
		return s, Result{After: op.Hits, Allowed: op.Hits == 0}
	}
	T := ceilDiv(uint64(windowMicros(op.Window)), op.Limit)
	t := now.UnixMicro()
	var x uint64
	if s.TAT > t {
		x = uint64(s.TAT - t)
	}
	used := ceilDiv(x, T)
	r := Result{Before: used, After: satAdd(used, op.Hits)}
	if r.After <= capacity {
		r.Allowed = true
		x = min(satAdd(x, satMul(op.Hits, T)), math.MaxInt64)
		s.TAT = satAddInt(t, int64(x)) // saturates only with absurd limits
		x = uint64(s.TAT - t)
		used = r.After
	}
	if used < capacity {
		r.Remaining = capacity - used
	}
	r.ResetAfter = micros(x)
	return s, r
}

// IdleAt is when, in Unix microseconds, the bucket is full again; a store may
// forget the key from then on.
func (s TokenBucketState) IdleAt() int64 { return s.TAT }

// read is op as a read: no hits, no refund.
func (op Op) read() Op {
	op.Hits, op.Refund = 0, false
	return op
}

// refunded is the Result of a refund: the read r of the state after it
// (see Refunds), never refused.
func refunded[S any](s S, r Result) (S, Result) {
	r.Allowed = true
	return s, r
}

// windowMicros is w in whole microseconds, at least 1.
func windowMicros(w time.Duration) int64 {
	if m := int64(w / time.Microsecond); m > 0 {
		return m
	}
	return 1
}

// micros converts µs to a Duration, saturating.
func micros(us uint64) time.Duration {
	if us > math.MaxInt64/uint64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b uint64) uint64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

func satAddInt(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

// mulDiv is floor(a × b / c) computed exactly in 128 bits, saturating at
// MaxUint64. c must not be 0.
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

// mulDivCeil is ceil(a × b / c), like mulDiv.
func mulDivCeil(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, c)
	if r != 0 {
		q++
	}
	return q
}

// Newest returns the time, in Unix microseconds, of the newest hit in the
// log and true, or false when the log is empty. After SlidingLog admitted
// hits it is the time they were logged at.
func (s SlidingLogState) Newest() (int64, bool) {
	if s.n == 0 {
		return 0, false
	}
	return s.at(s.n - 1), true
}
