package loadgen

import (
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	for _, v := range []int64{0, 1, 63, 127, 128, 129, 255, 256, 1000, 4095, 12345, 999_999, 1 << 30, 1<<40 - 1} {
		i := bucketOf(v)
		hi := bucketHigh(i)
		if hi < v {
			t.Errorf("bucketHigh(bucketOf(%d)) = %d, want >= %d", v, hi, v)
		}
		if i > 0 && bucketHigh(i-1) >= v {
			t.Errorf("bucketHigh(bucketOf(%d)-1) = %d, want < %d", v, bucketHigh(i-1), v)
		}
		if float64(hi-v) > float64(v)/64 {
			t.Errorf("bucket of %d reaches %d: more than 1/64 above", v, hi)
		}
	}
	if got := bucketOf(1 << 50); got != numBuckets-1 {
		t.Errorf("bucketOf(2^50) = %d, want the last bucket %d", got, numBuckets-1)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	// 1..10000 µs, recorded by two workers and merged.
	var a, b histogram
	for i := int64(1); i <= 10000; i++ {
		h := &a
		if i%2 == 0 {
			h = &b
		}
		h.record(time.Duration(i) * time.Microsecond)
	}
	a.merge(&b)
	tests := []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 5000 * time.Microsecond},
		{0.9, 9000 * time.Microsecond},
		{0.99, 9900 * time.Microsecond},
		{0.999, 9990 * time.Microsecond},
		{1, 10000 * time.Microsecond},
	}
	for _, tt := range tests {
		got := a.quantile(tt.q)
		if got < tt.want || float64(got-tt.want) > float64(tt.want)/64 {
			t.Errorf("quantile(%v) = %v, want %v within 1/64 above", tt.q, got, tt.want)
		}
	}
	if a.total != 10000 || a.min != int64(time.Microsecond) || a.max != int64(10000*time.Microsecond) {
		t.Errorf("total, min, max = %d, %d, %d; want 10000, 1µs, 10ms", a.total, a.min, a.max)
	}
	if got, want := a.mean(), 5000500*time.Nanosecond; got != want {
		t.Errorf("mean() = %v, want %v", got, want)
	}
	var empty histogram
	if got := empty.quantile(0.99); got != 0 {
		t.Errorf("empty quantile = %v, want 0", got)
	}
}
