package limiter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The states of the continuous algorithms as bytes, for stores that keep
// them as opaque values (Memcached). Each encoding is one tag byte, then
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

// ErrCorruptState is wrapped by the errors of the Parse functions: the
// bytes are not a state of that algorithm.
var ErrCorruptState = errors.New("limiter: corrupt state")

// State tags, the first byte of each encoding.
const (
	tagSlidingWindow = 'w'
	tagSlidingLog    = 'l'
	tagTokenBucket   = 't'
)

// AppendSlidingWindowState appends the encoding of s to dst and returns the
// extended slice (at most 31 bytes).
func AppendSlidingWindowState(dst []byte, s SlidingWindowState) []byte {
	dst = append(dst, tagSlidingWindow)
	dst = binary.AppendVarint(dst, s.Start)
	dst = binary.AppendUvarint(dst, s.Prev)
	return binary.AppendUvarint(dst, s.Curr)
}

// ParseSlidingWindowState decodes what AppendSlidingWindowState wrote.
func ParseSlidingWindowState(data []byte) (SlidingWindowState, error) {
	d := decoder{data: data, what: "sliding window"}
	d.tag(tagSlidingWindow)
	s := SlidingWindowState{Start: d.varint(), Prev: d.uvarint(), Curr: d.uvarint()}
	if err := d.done(); err != nil {
		return SlidingWindowState{}, err
	}
	return s, nil
}

// AppendTokenBucketState appends the encoding of s to dst and returns the
// extended slice (at most 11 bytes).
func AppendTokenBucketState(dst []byte, s TokenBucketState) []byte {
	dst = append(dst, tagTokenBucket)
	return binary.AppendVarint(dst, s.TAT)
}

// ParseTokenBucketState decodes what AppendTokenBucketState wrote.
func ParseTokenBucketState(data []byte) (TokenBucketState, error) {
	d := decoder{data: data, what: "token bucket"}
	d.tag(tagTokenBucket)
	s := TokenBucketState{TAT: d.varint()}
	if err := d.done(); err != nil {
		return TokenBucketState{}, err
	}
	return s, nil
}

// AppendSlidingLogState appends the encoding of s to dst and returns the
// extended slice: a few bytes plus one to ten per logged hit, every hit
// included (also those that left the window since the last op).
func AppendSlidingLogState(dst []byte, s SlidingLogState) []byte {
	dst = append(dst, tagSlidingLog)
	dst = binary.AppendUvarint(dst, uint64(s.n))
	var prev int64
	for i := range s.n {
		t := s.at(i)
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

// ParseSlidingLogState decodes what AppendSlidingLogState wrote. The state
// it returns has a ring of its own, exactly as long as the log; SlidingLog
// grows it when it needs to.
func ParseSlidingLogState(data []byte) (SlidingLogState, error) {
	d := decoder{data: data, what: "sliding log"}
	d.tag(tagSlidingLog)
	n := d.uvarint()
	// Every hit takes at least one byte: refuse a count the data cannot
	// hold before allocating for it.
	if d.err == nil && n > uint64(len(d.data)) {
		d.fail("%d hits in %d bytes", n, len(d.data))
	}
	if d.err != nil {
		return SlidingLogState{}, d.err
	}
	var s SlidingLogState
	if n > 0 {
		s.ring = make([]int64, n)
		s.n = int(n)
	}
	for i := range s.ring {
		if i == 0 {
			s.ring[0] = d.varint()
			continue
		}
		gap, prev := d.uvarint(), s.ring[i-1]
		// The room above prev is MaxInt64 - prev, computed modulo 2^64:
		// up to 2^64-1 for prev = MinInt64.
		if d.err == nil && gap > uint64(math.MaxInt64)-uint64(prev) {
			d.fail("hit %d: time overflows", i)
		}
		if d.err != nil {
			break
		}
		s.ring[i] = int64(uint64(prev) + gap)
	}
	if err := d.done(); err != nil {
		return SlidingLogState{}, err
	}
	return s, nil
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

// ForgetAt removes up to k hits logged at time t (Unix µs), the newest such
// hits first, and returns how many it removed; later hits stay. A store
// whose ops are not serialised uses it to take back an op of an
// AllOrNothing batch when other hits may have been logged since (Forget
// would remove those instead); t is Newest right after the op.
func (s *SlidingLogState) ForgetAt(t int64, k int) int {
	// Find the run of entries equal to t; the log is sorted, so the ones
	// after it are later and move down over the removed ones.
	end := s.n // one past the last entry <= t
	for end > 0 && s.at(end-1) > t {
		end--
	}
	first := end
	for first > 0 && end-first < k && s.at(first-1) == t {
		first--
	}
	removed := end - first
	if removed == 0 {
		return 0
	}
	for i := end; i < s.n; i++ {
		s.set(i-removed, s.at(i))
	}
	s.n -= removed
	return removed
}

// set writes the i-th logged time, oldest first.
func (s *SlidingLogState) set(i int, t int64) {
	i += s.head
	if i >= len(s.ring) {
		i -= len(s.ring)
	}
	s.ring[i] = t
}

// decoder reads one encoded state, keeping the first error.
type decoder struct {
	data []byte
	what string
	err  error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", ErrCorruptState, d.what, fmt.Sprintf(format, args...))
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

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.data)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.data = d.data[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data)
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
