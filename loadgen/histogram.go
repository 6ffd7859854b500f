package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: each power of two is split into
// 2^(subBits-1) linear buckets, so a recorded value is known to within
// 1/64 (1.6%) of itself. Values are nanoseconds.
const (
	subBits    = 7
	subCount   = 1 << subBits
	halfCount  = subCount / 2
	maxBitLen  = 40 // 2^40 ns is about 18 minutes; larger values are clamped
	numBuckets = (maxBitLen-subBits+1)*halfCount + halfCount
)

// histogram is a log-linear latency histogram in the manner of HdrHistogram:
// fixed memory (about 18 KiB), O(1) record, no allocation. It is not safe for
// concurrent use; each worker owns one and they are merged at the end.
type histogram struct {
	counts [numBuckets]uint64
	total  uint64
	sum    float64
	min    int64
	max    int64
}

func bucketOf(v int64) int {
	if v < subCount {
		return int(max(v, 0))
	}
	n := bits.Len64(uint64(v))
	if n > maxBitLen {
		return numBuckets - 1
	}
	exp := n - subBits
	return exp*halfCount + int(v>>uint(exp))
}

// bucketHigh returns the largest value that falls into bucket i.
func bucketHigh(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	exp := i/halfCount - 1
	sub := int64(i - exp*halfCount)
	return (sub+1)<<uint(exp) - 1
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.counts[bucketOf(v)]++
	h.total++
	h.sum += float64(v)
}

func (h *histogram) merge(o *histogram) {
	if o.total == 0 {
		return
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.sum += o.sum
}

// quantile returns the value at quantile q (0..1): the highest value
// equivalent to the bucket holding the ceil(q*total)-th smallest sample,
// clamped to the observed maximum.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = min(max(rank, 1), h.total)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(bucketHigh(i), h.max))
		}
	}
	return time.Duration(h.max)
}

func (h *histogram) mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.total))
}
