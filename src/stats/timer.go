package stats

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// A Histogram counts values in log-linear buckets: values below 16
// exactly, then 16 buckets for each power of two, so that a bucket's
// midpoint is within 1/32 (3.1 %) of any value in it. Values from 2^40 up
// share the last bucket. It also keeps the exact sum of the values.
//
// The buckets are what keeps recording cheap and the export bounded:
// Observe is two atomic adds whatever the traffic; statsd gets one line
// per bucket that moved since the last flush rather than one line per
// event (gostats, which the anchor uses, sends every duration as a line of
// its own), and Prometheus gets the buckets regrouped into its own bounds.
//
// Counts are cumulative: every sink reads them and keeps what it needs
// (the statsd sink, the counts it sent last). The sum wraps at 2^64, which
// Prometheus reads as a counter reset, rather than stopping, which would
// freeze the mean.
//
// A Histogram is safe for concurrent use; the zero value is empty.
type Histogram struct {
	buckets [timerBuckets]atomic.Uint64
	sum     atomic.Uint64
}

const (
	// timerSubBits is log2 of the buckets per power of two.
	timerSubBits = 4
	timerSub     = 1 << timerSubBits
	// timerMaxBits bounds the values told apart: 2^40 (for durations in
	// nanoseconds, about 18 minutes).
	timerMaxBits = 40
	// timerBuckets is bucketOf(2^timerMaxBits - 1) + 1.
	timerBuckets = (timerMaxBits-timerSubBits)<<timerSubBits + timerSub
)

// Observe adds one value.
func (h *Histogram) Observe(v uint64) { h.ObserveN(v, 1) }

// ObserveN adds n values of v, for a caller that samples one event in n.
func (h *Histogram) ObserveN(v, n uint64) {
	h.buckets[bucketOf(v)].Add(n)
	h.sum.Add(v * n)
}

// Count returns the number of values observed.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.buckets {
		n += h.buckets[i].Load()
	}
	return n
}

// Sum returns the sum of the values observed, modulo 2^64.
func (h *Histogram) Sum() uint64 { return h.sum.Load() }

// snapshot copies the bucket counts into b. A value observed meanwhile may
// be in the copy or not; its bucket and the sum are read separately, so a
// reader may see one without the other for that instant.
func (h *Histogram) snapshot(b *[timerBuckets]uint64) {
	for i := range h.buckets {
		b[i] = h.buckets[i].Load()
	}
}

// A Timer is a Histogram of durations, in nanoseconds. It is safe for
// concurrent use; the zero value is an empty timer.
type Timer struct {
	h Histogram
}

// Record adds one duration. A negative duration counts as 0.
func (t *Timer) Record(d time.Duration) { t.RecordN(d, 1) }

// RecordN adds n durations of d, for a caller that times one event in n.
func (t *Timer) RecordN(d time.Duration, n uint64) { t.h.ObserveN(uint64(max(d, 0)), n) }

// Count returns the number of durations recorded.
func (t *Timer) Count() uint64 { return t.h.Count() }

// bucketOf is the bucket of the value v.
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

// bucketLow is the smallest value of bucket i.
func bucketLow(i int) uint64 {
	if i < 2*timerSub {
		return uint64(i)
	}
	shift := i>>timerSubBits - 1
	return uint64(i&(timerSub-1)+timerSub) << shift
}

// bucketHigh is the largest value of bucket i (the last bucket also holds
// everything above it).
func bucketHigh(i int) uint64 {
	if i < 2*timerSub {
		return uint64(i)
	}
	shift := i>>timerSubBits - 1
	return bucketLow(i) + 1<<shift - 1
}

// bucketMid is the midpoint of the values of bucket i (the value itself
// below 32, where buckets hold one value).
func bucketMid(i int) uint64 {
	if i < 2*timerSub {
		return uint64(i)
	}
	shift := i>>timerSubBits - 1
	return bucketLow(i) + 1<<shift/2
}
