package memcached

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// encBase is the tests' clock start; sec a second.
var encBase = time.Unix(1_699_920_000, 0)

const sec = time.Second

// logTimes is the log's hit times, oldest first.
func logTimes(s limiter.SlidingLogState) []int64 {
	out := make([]int64, 0, s.Len())
	for i := range s.Len() {
		out = append(out, s.At(i))
	}
	return out
}

// wrappedLog returns a log of 4 hits whose ring has wrapped (7 ops, limit 4).
func wrappedLog(t *testing.T) limiter.SlidingLogState {
	t.Helper()
	op := limiter.Op{Algorithm: rules.SlidingLog, Limit: 4, Window: 10 * time.Second, Hits: 1}
	var st limiter.SlidingLogState
	for i := range 7 {
		st, _ = limiter.SlidingLog(st, encBase.Add(time.Duration(i)*2*sec), op)
	}
	if st.Len() != 4 {
		t.Fatalf("log of %d hits, want 4", st.Len())
	}
	return st
}

func TestSlidingWindowStateRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give limiter.SlidingWindowState
	}{
		{"zero", limiter.SlidingWindowState{}},
		{"typical", limiter.SlidingWindowState{Start: encBase.UnixMicro(), Prev: 7, Curr: 3}},
		{"negative_start", limiter.SlidingWindowState{Start: -60_000_000, Prev: 1}},
		{"extremes", limiter.SlidingWindowState{Start: math.MinInt64, Prev: math.MaxUint64, Curr: math.MaxUint64}},
	}
	for _, tt := range tests {
		b := appendSlidingWindowState([]byte("x"), tt.give)
		if b[0] != 'x' {
			t.Errorf("%s: Append overwrote dst", tt.name)
		}
		got, err := parseSlidingWindowState(b[1:])
		if err != nil || got != tt.give {
			t.Errorf("%s: Parse(Append(%+v)) = %+v, %v", tt.name, tt.give, got, err)
		}
		if len(b)-1 > 31 {
			t.Errorf("%s: %d bytes, want at most 31", tt.name, len(b)-1)
		}
	}
}

func TestTokenBucketStateRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tat := range []int64{0, 1, -1, encBase.UnixMicro(), math.MaxInt64, math.MinInt64} {
		b := appendTokenBucketState(nil, limiter.TokenBucketState{TAT: tat})
		got, err := parseTokenBucketState(b)
		if err != nil || got.TAT != tat {
			t.Errorf("Parse(Append(TAT %d)) = %+v, %v", tat, got, err)
		}
	}
}

func TestSlidingLogStateRoundTrip(t *testing.T) {
	t.Parallel()
	t0 := encBase.UnixMicro()
	op := limiter.Op{Algorithm: rules.SlidingLog, Limit: 100, Window: time.Minute, Hits: 3}
	var burst limiter.SlidingLogState
	burst, _ = limiter.SlidingLog(burst, encBase, op)
	burst, _ = limiter.SlidingLog(burst, encBase.Add(time.Microsecond), op)
	tests := []struct {
		name string
		give limiter.SlidingLogState
		want []int64
	}{
		{"empty", limiter.SlidingLogState{}, []int64{}},
		{"same_instant_and_next", burst, []int64{t0, t0, t0, t0 + 1, t0 + 1, t0 + 1}},
		{"wrapped_ring", wrappedLog(t), []int64{t0 + 4_000_000, t0 + 6_000_000, t0 + 10_000_000, t0 + 12_000_000}},
		{"extremes", limiter.SlidingLogStateOf([]int64{math.MinInt64, math.MaxInt64}), []int64{math.MinInt64, math.MaxInt64}},
	}
	for _, tt := range tests {
		b := appendSlidingLogState(nil, tt.give)
		got, err := parseSlidingLogState(b)
		if err != nil {
			t.Errorf("%s: Parse(Append(%v)): %v", tt.name, tt.want, err)
			continue
		}
		if ts := logTimes(got); !slices.Equal(ts, tt.want) {
			t.Errorf("%s: Parse(Append(...)) logs %v, want %v", tt.name, ts, tt.want)
		}
		if b2 := appendSlidingLogState(nil, got); !bytes.Equal(b, b2) {
			t.Errorf("%s: encoding not stable: %x then %x", tt.name, b, b2)
		}
	}
	// Hits at one instant take a byte each.
	if b := appendSlidingLogState(nil, burst); len(b) > 1+1+9+5 {
		t.Errorf("6 hits over 2 µs take %d bytes, want at most 16", len(b))
	}
}

// TestParsedSlidingLogKeepsWorking runs SlidingLog on a parsed state: its
// ring is exactly as long as the log and must grow.
func TestParsedSlidingLogKeepsWorking(t *testing.T) {
	t.Parallel()
	op := limiter.Op{Algorithm: rules.SlidingLog, Limit: 10, Window: time.Minute, Hits: 2}
	var st limiter.SlidingLogState
	var r limiter.Result
	for i := range 5 {
		st, _ = limiter.SlidingLog(st, encBase.Add(time.Duration(i)*sec), op)
		var err error
		st, err = parseSlidingLogState(appendSlidingLogState(nil, st))
		if err != nil {
			t.Fatal(err)
		}
	}
	st, r = limiter.SlidingLog(st, encBase.Add(5*sec), op)
	if r.Allowed || r.Before != 10 || r.ResetAfter != 55*sec {
		t.Errorf("sixth op on a full parsed log: %+v, want refused with 10 logged", r)
	}
	st, r = limiter.SlidingLog(st, encBase.Add(60*sec+500*time.Millisecond), op)
	if !r.Allowed || r.Before != 8 {
		t.Errorf("after the oldest left: %+v, want admitted over 8 logged", r)
	}
	if st.Len() != 10 {
		t.Errorf("log of %d hits after the last op, want 10", st.Len())
	}
}

func TestParseCorruptStates(t *testing.T) {
	t.Parallel()
	sw := appendSlidingWindowState(nil, limiter.SlidingWindowState{Start: 1, Prev: 2, Curr: 3})
	tb := appendTokenBucketState(nil, limiter.TokenBucketState{TAT: 12345})
	sl := appendSlidingLogState(nil, limiter.SlidingLogStateOf([]int64{10, 20, 30}))
	overflow := binary.AppendUvarint(binary.AppendVarint([]byte{'l', 2}, math.MaxInt64), 1)
	tests := []struct {
		name  string
		parse func([]byte) error
		give  []byte
	}{
		{"sliding_window_empty", parseSW, nil},
		{"sliding_window_other_tag", parseSW, tb},
		{"sliding_window_truncated", parseSW, sw[:len(sw)-1]},
		{"sliding_window_trailing", parseSW, append(slices.Clone(sw), 0)},
		{"sliding_window_bad_varint", parseSW, []byte{'w', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0}},
		{"sliding_window_text", parseSW, []byte("1:2:3")},
		{"token_bucket_empty", parseTB, []byte{}},
		{"token_bucket_tag_only", parseTB, []byte{'t'}},
		{"token_bucket_other_tag", parseTB, sw},
		{"token_bucket_trailing", parseTB, append(slices.Clone(tb), 1)},
		{"token_bucket_counter", parseTB, []byte("42")},
		{"sliding_log_empty", parseSL, nil},
		{"sliding_log_other_tag", parseSL, tb},
		{"sliding_log_truncated", parseSL, sl[:len(sl)-1]},
		{"sliding_log_trailing", parseSL, append(slices.Clone(sl), 0)},
		{"sliding_log_count_too_large", parseSL, []byte{'l', 0xff, 0xff, 0xff, 0xff, 0x0f, 1}},
		{"sliding_log_time_overflows", parseSL, overflow},
	}
	for _, tt := range tests {
		err := tt.parse(tt.give)
		if !errors.Is(err, errCorruptState) {
			t.Errorf("%s: Parse(%x) = %v, want an error wrapping errCorruptState", tt.name, tt.give, err)
		}
	}
}

func parseSW(b []byte) error { _, err := parseSlidingWindowState(b); return err }
func parseTB(b []byte) error { _, err := parseTokenBucketState(b); return err }
func parseSL(b []byte) error { _, err := parseSlidingLogState(b); return err }

// FuzzParseStates requires the parsers never to panic, and every state they
// accept to encode back to the same bytes.
func FuzzParseStates(f *testing.F) {
	f.Add(appendSlidingWindowState(nil, limiter.SlidingWindowState{Start: encBase.UnixMicro(), Prev: 4, Curr: 2}))
	f.Add(appendTokenBucketState(nil, limiter.TokenBucketState{TAT: encBase.UnixMicro()}))
	f.Add(appendSlidingLogState(nil, limiter.SlidingLogStateOf([]int64{1, 1, 5})))
	f.Add([]byte{'l', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte("1:2:3"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := parseSlidingWindowState(data); err == nil {
			if b := appendSlidingWindowState(nil, s); !bytes.Equal(b, data) && !nonCanonical(data) {
				t.Errorf("sliding window %x -> %+v -> %x", data, s, b)
			}
		}
		if s, err := parseTokenBucketState(data); err == nil {
			if b := appendTokenBucketState(nil, s); !bytes.Equal(b, data) && !nonCanonical(data) {
				t.Errorf("token bucket %x -> %+v -> %x", data, s, b)
			}
		}
		if s, err := parseSlidingLogState(data); err == nil {
			if b := appendSlidingLogState(nil, s); !bytes.Equal(b, data) && !nonCanonical(data) {
				t.Errorf("sliding log %x -> %v -> %x", data, logTimes(s), b)
			}
		}
	})
}

// nonCanonical reports whether data holds a varint with a redundant
// trailing zero group (0x80 0x00 is 0 in two bytes), which encoding/binary
// accepts but never writes.
func nonCanonical(data []byte) bool {
	for i := 1; i < len(data); i++ {
		if data[i] == 0 && data[i-1]&0x80 != 0 {
			return true
		}
	}
	return false
}
