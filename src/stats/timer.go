package stats

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// A Timer counts durations in log-linear buckets: values below 16 ns
// exactly, then 16 buckets for each power of two, so that a bucket's
// midpoint is within 1/32 (3.1 %) of any duration in it. Durations from
// 2^40 ns (about 18 minutes) up share the last bucket.
//
// The buckets are what keeps recording cheap and the export bounded:
// Record is one atomic add whatever the traffic, and a flush sends at most
// one line per bucket in use rather than one line per request (gostats,
// which the anchor uses, sends every duration as a line of its own).
//
// A Timer is safe for concurrent use; the zero value is an empty timer.
type Timer struct {
	buckets [timerBuckets]atomic.Uint64
}

const (
	// timerSubBits is log2 of the buckets per power of two.
	timerSubBits = 4
	timerSub     = 1 << timerSubBits
	// timerMaxBits bounds the durations told apart: 2^40 ns.
	timerMaxBits = 40
	// timerBuckets is bucketOf(2^timerMaxBits - 1) + 1.
	timerBuckets = (timerMaxBits-timerSubBits)<<timerSubBits + timerSub
)

// Record adds one duration. A negative duration counts as 0.
func (t *Timer) Record(d time.Duration) { t.RecordN(d, 1) }

// RecordN adds n durations of d, for a caller that times one event in n.
func (t *Timer) RecordN(d time.Duration, n uint64) {
	if d < 0 {
		d = 0
	}
	t.buckets[bucketOf(uint64(d))].Add(n)
}

// Count returns the durations recorded and not yet sent to statsd.
func (t *Timer) Count() uint64 {
	var n uint64
	for i := range t.buckets {
		n += t.buckets[i].Load()
	}
	return n
}

// bucketOf is the bucket of a duration of v nanoseconds.
func bucketOf(v uint64) int {
	if v < timerSub {
		return int(v)
	}
	if v >= 1<<timerMaxBits {
		v = 1<<timerMaxBits - 1
	}
	shift := bits.Len64(v) - 1 - timerSubBits
	return (shift+1)<<timerSubBits + int(v>>shift) - timerSub
}

// bucketMid is the midpoint, in nanoseconds, of the durations of bucket i
// (the value itself below 32 ns, where buckets are one nanosecond wide).
func bucketMid(i int) uint64 {
	if i < 2*timerSub {
		return uint64(i)
	}
	shift := i>>timerSubBits - 1
	low := uint64(i&(timerSub-1)+timerSub) << shift
	return low + 1<<shift/2
}

// drain calls f with the midpoint and the count of every bucket that
// counted something since the last drain, and empties it. Durations
// recorded meanwhile are counted by this drain or the next, never lost.
func (t *Timer) drain(f func(midNanos, count uint64)) {
	for i := range t.buckets {
		if t.buckets[i].Load() == 0 {
			continue
		}
		if n := t.buckets[i].Swap(0); n > 0 {
			f(bucketMid(i), n)
		}
	}
}
