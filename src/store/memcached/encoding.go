package memcached

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ratelimitd/ratelimit/src/limiter"
)

// The states of the continuous algorithms as bytes: memcached keeps them
// as opaque values. Each encoding is one tag byte, then
// varints (encoding/binary): compact, and a value of another algorithm or a
// damaged one is refused instead of read as a wrong state.
//
//	sliding_window  'w' varint(Start) uvarint(Prev) uvarint(Curr)
//	sliding_log     'l' uvarint(n) [varint(oldest) uvarint(gap to the previous) × (n-1)]
//	token_bucket    't' varint(TAT)
//
// A sliding log is stored oldest first with the gaps between neighbours, so
// hits logged at the same instant (hits_addend > 1, or one busy
// microsecond) take one byte each.

// errCorruptState is wrapped by the errors of the parse functions: the
// bytes are not a state of that algorithm (the store reports it wrapped
// in limiter.ErrData).
var errCorruptState = errors.New("memcached: corrupt state")

// State tags, the first byte of each encoding.
const (
	tagSlidingWindow = 'w'
	tagSlidingLog    = 'l'
	tagTokenBucket   = 't'
)

// appendSlidingWindowState appends the encoding of s to dst and returns the
// extended slice (at most 31 bytes).
func appendSlidingWindowState(dst []byte, s limiter.SlidingWindowState) []byte {
	dst = append(dst, tagSlidingWindow)
	dst = binary.AppendVarint(dst, s.Start)
	dst = binary.AppendUvarint(dst, s.Prev)
	return binary.AppendUvarint(dst, s.Curr)
}

// parseSlidingWindowState decodes what appendSlidingWindowState wrote.
func parseSlidingWindowState(data []byte) (limiter.SlidingWindowState, error) {
	d := decoder{data: data, what: "sliding window"}
	d.tag(tagSlidingWindow)
	s := limiter.SlidingWindowState{Start: d.varint(), Prev: d.uvarint(), Curr: d.uvarint()}
	if err := d.done(); err != nil {
		return limiter.SlidingWindowState{}, err
	}
	return s, nil
}

// appendTokenBucketState appends the encoding of s to dst and returns the
// extended slice (at most 11 bytes).
func appendTokenBucketState(dst []byte, s limiter.TokenBucketState) []byte {
	dst = append(dst, tagTokenBucket)
	return binary.AppendVarint(dst, s.TAT)
}

// parseTokenBucketState decodes what appendTokenBucketState wrote.
func parseTokenBucketState(data []byte) (limiter.TokenBucketState, error) {
	d := decoder{data: data, what: "token bucket"}
	d.tag(tagTokenBucket)
	s := limiter.TokenBucketState{TAT: d.varint()}
	if err := d.done(); err != nil {
		return limiter.TokenBucketState{}, err
	}
	return s, nil
}

// appendSlidingLogState appends the encoding of s to dst and returns the
// extended slice: a few bytes plus one to ten per logged hit, every hit
// included (also those that left the window since the last op).
func appendSlidingLogState(dst []byte, s limiter.SlidingLogState) []byte {
	dst = append(dst, tagSlidingLog)
	dst = binary.AppendUvarint(dst, uint64(s.Len()))
	var prev int64
	for i := range s.Len() {
		t := s.At(i)
		if i == 0 {
			dst = binary.AppendVarint(dst, t)
		} else {
			// The log is sorted (SlidingLog keeps it so), so gaps are >= 0.
			dst = binary.AppendUvarint(dst, uint64(t-prev))
		}
		prev = t
	}
	return dst
}

// parseSlidingLogState decodes what appendSlidingLogState wrote. The state
// it returns has a ring of its own, exactly as long as the log; SlidingLog
// grows it when it needs to.
func parseSlidingLogState(data []byte) (limiter.SlidingLogState, error) {
	d := decoder{data: data, what: "sliding log"}
	d.tag(tagSlidingLog)
	n := d.uvarint()
	// Every hit takes at least one byte: refuse a count the data cannot
	// hold before allocating for it.
	if d.err == nil && n > uint64(len(d.data)) {
		d.fail("%d hits in %d bytes", n, len(d.data))
	}
	if d.err != nil {
		return limiter.SlidingLogState{}, d.err
	}
	var times []int64
	if n > 0 {
		times = make([]int64, n)
	}
	for i := range times {
		if i == 0 {
			times[0] = d.varint()
			continue
		}
		gap, prev := d.uvarint(), times[i-1]
		// The room above prev is MaxInt64 - prev, computed modulo 2^64:
		// up to 2^64-1 for prev = MinInt64.
		if d.err == nil && gap > uint64(math.MaxInt64)-uint64(prev) {
			d.fail("hit %d: time overflows", i)
		}
		if d.err != nil {
			break
		}
		times[i] = int64(uint64(prev) + gap)
	}
	if err := d.done(); err != nil {
		return limiter.SlidingLogState{}, err
	}
	return limiter.SlidingLogStateOf(times), nil
}

// decoder reads one encoded state, keeping the first error.
type decoder struct {
	data []byte
	what string
	err  error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", errCorruptState, d.what, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) tag(want byte) {
	switch {
	case len(d.data) == 0:
		d.fail("empty")
	case d.data[0] != want:
		d.fail("tag %q, want %q", d.data[0], want)
	default:
		d.data = d.data[1:]
	}
}

func (d *decoder) varint() int64   { return readVarint(d, shortestVarint) }
func (d *decoder) uvarint() uint64 { return readVarint(d, shortestUvarint) }

// shortestUvarint and shortestVarint are binary.Uvarint and Varint that
// take only the shortest form, the one binary.AppendUvarint writes: a
// longer one (a last byte of 0, such as 0x80 0x00 for 0) is not what this
// service wrote, and would give one state two encodings. n <= 0 when the
// bytes are no such varint.
func shortestUvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 1 && b[n-1] == 0 {
		return 0, 0
	}
	return v, n
}

func shortestVarint(b []byte) (int64, int) {
	v, n := binary.Varint(b)
	if n > 1 && b[n-1] == 0 {
		return 0, 0
	}
	return v, n
}

// readVarint takes one varint off d with read (shortestVarint or
// shortestUvarint).
func readVarint[T int64 | uint64](d *decoder, read func([]byte) (T, int)) T {
	if d.err != nil {
		return 0
	}
	v, n := read(d.data)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.data = d.data[n:]
	return v
}

// done returns the first error, or one when bytes are left over.
func (d *decoder) done() error {
	if d.err == nil && len(d.data) > 0 {
		d.fail("%d bytes left over", len(d.data))
	}
	return d.err
}
