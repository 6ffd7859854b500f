package live

import (
	"context"
	"errors"
	"math/bits"
	"sync/atomic"
	"time"
)

// latencySample: one store round trip in latencySample is timed. Two
// clock reads on every decision would cost more than the rest of this
// package together; one in 16 still gives some 3,700 samples a minute at
// a thousand decisions a second.
const latencySample = 16

// latencyWindow is the span, in ticks (seconds), of the percentiles.
const latencyWindow = 60

// The latency histogram: latencySub buckets per power of two of
// microseconds, from 1 µs (everything below shares the first buckets) to
// 2^(latencyPowers+1) µs, about 2 min (everything above shares the last). A
// bucket's width is a quarter of its lower bound: percentiles are read
// at the bucket's upper bound, within 25 % of the truth, which is what an
// operator needs to tell 1 ms from 10 ms.
const (
	latencySubBits = 2
	latencySub     = 1 << latencySubBits
	latencyPowers  = 26
	latencyBuckets = latencyPowers*latencySub + 1
)

// storeLatency counts the store's timed round trips in cumulative
// buckets, and keeps a snapshot of them at each of the last
// latencyWindow ticks so that the percentiles cover a sliding minute.
type storeLatency struct {
	buckets [latencyBuckets]atomic.Uint64
	errors  atomic.Uint64

	// Guarded by Recorder.mu.
	snaps    [latencyWindow + 1][latencyBuckets]uint64
	ticks    int
	errsSeen uint64
}

// latencyBucket returns the bucket of d.
func latencyBucket(d time.Duration) int {
	us := uint64(max(d, 0) / time.Microsecond)
	if us < latencySub {
		return int(us)
	}
	p := bits.Len64(us) - 1 // us in [2^p, 2^(p+1))
	if p > latencyPowers {
		return latencyBuckets - 1
	}
	sub := int(us>>(p-latencySubBits)) & (latencySub - 1)
	return (p-latencySubBits+1)*latencySub + sub
}

// latencyUpper returns the upper bound of bucket i.
func latencyUpper(i int) time.Duration {
	if i < latencySub {
		return time.Duration(i+1) * time.Microsecond
	}
	if i >= latencyBuckets-1 {
		return time.Duration(1<<(latencyPowers+1)) * time.Microsecond
	}
	p := i/latencySub + 1
	sub := i % latencySub
	return time.Duration(uint64(latencySub+sub+1)<<(p-latencySubBits)) * time.Microsecond
}

// tick snapshots the histogram and returns the errors since the last tick.
func (s *storeLatency) tick() uint64 {
	snap := &s.snaps[s.ticks%len(s.snaps)]
	for i := range s.buckets {
		snap[i] = s.buckets[i].Load()
	}
	s.ticks++
	e := s.errors.Load()
	d := e - s.errsSeen
	s.errsSeen = e
	return d
}

// StoreStart returns the time to pass to StoreDone: now, the time the
// caller read just before the round trip, for the round trips that are
// timed, and zero for the others. Which ones are timed follows bits of
// now's microseconds, which cost nothing to read, unlike a random number.
func (r *Recorder) StoreStart(now time.Time) time.Time {
	if r == nil || (now.UnixNano()>>10)%latencySample != 0 {
		return time.Time{}
	}
	return now
}

// StoreDone records the end of a store round trip begun at start (from
// StoreStart, on the clock time.Since reads) that returned err. Every error but the caller's
// cancellation is counted.
func (r *Recorder) StoreDone(start time.Time, err error) {
	if r == nil {
		return
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		r.store.errors.Add(1)
	}
	if !start.IsZero() {
		r.store.buckets[latencyBucket(time.Since(start))].Add(1)
	}
}

// Latency is the store's round-trip latency over the last minute.
type Latency struct {
	// Samples is the number of round trips timed (one in 16).
	Samples uint64
	// P50, P90, P99 and Max are bucket upper bounds: within 25 % above
	// the true value. Zero without samples.
	P50, P90, P99, Max time.Duration
	// Window is the span the figures cover: a minute, less just after
	// the start.
	Window time.Duration
}

// StoreLatency returns the store's latency over the last minute (up to
// the last tick) and the store errors in that minute.
func (r *Recorder) StoreLatency() (Latency, uint64) {
	if r == nil {
		return Latency{}, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.store
	if s.ticks == 0 {
		return Latency{}, 0
	}
	cur := &s.snaps[(s.ticks-1)%len(s.snaps)]
	var base [latencyBuckets]uint64
	span := s.ticks - 1
	if s.ticks > latencyWindow {
		base = s.snaps[(s.ticks-1-latencyWindow)%len(s.snaps)]
		span = latencyWindow
	}
	var diff [latencyBuckets]uint64
	var n uint64
	for i := range diff {
		diff[i] = cur[i] - base[i]
		n += diff[i]
	}
	l := Latency{Samples: n, Window: time.Duration(span) * time.Second}
	var errs uint64
	for k := range int64(latencyWindow) {
		errs += uint64(r.totals.ring[ringStoreErrors][ringSlot(r.last-k)])
	}
	if n == 0 {
		return l, errs
	}
	quantile := func(q float64) time.Duration {
		rank := uint64(q*float64(n-1)) + 1
		var c uint64
		for i, v := range diff {
			c += v
			if c >= rank {
				return latencyUpper(i)
			}
		}
		return latencyUpper(latencyBuckets - 1)
	}
	l.P50, l.P90, l.P99, l.Max = quantile(0.50), quantile(0.90), quantile(0.99), quantile(1)
	return l, errs
}
