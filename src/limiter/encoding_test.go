package limiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// logTimes is the log's hit times, oldest first.
func logTimes(s SlidingLogState) []int64 {
	out := make([]int64, 0, s.n)
	for i := range s.n {
		out = append(out, s.at(i))
	}
	return out
}

// wrappedLog returns a log whose ring has wrapped (head > 0), with 4 hits.
func wrappedLog(t *testing.T) SlidingLogState {
	t.Helper()
	op := Op{Algorithm: rules.SlidingLog, Limit: 4, Window: 10 * time.Second, Hits: 1}
	var st SlidingLogState
	for i := range 7 {
		st, _ = SlidingLog(st, base.Add(time.Duration(i)*2*s), op)
	}
	if st.head == 0 || st.n != 4 {
		t.Fatalf("log head %d n %d, want a wrapped ring of 4", st.head, st.n)
	}
	return st
}

func TestSlidingWindowStateRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give SlidingWindowState
	}{
		{"zero", SlidingWindowState{}},
		{"typical", SlidingWindowState{Start: base.UnixMicro(), Prev: 7, Curr: 3}},
		{"negative_start", SlidingWindowState{Start: -60_000_000, Prev: 1}},
		{"extremes", SlidingWindowState{Start: math.MinInt64, Prev: math.MaxUint64, Curr: math.MaxUint64}},
	}
	for _, tt := range tests {
		b := AppendSlidingWindowState([]byte("x"), tt.give)
		if b[0] != 'x' {
			t.Errorf("%s: Append overwrote dst", tt.name)
		}
		got, err := ParseSlidingWindowState(b[1:])
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
	for _, tat := range []int64{0, 1, -1, base.UnixMicro(), math.MaxInt64, math.MinInt64} {
		b := AppendTokenBucketState(nil, TokenBucketState{TAT: tat})
		got, err := ParseTokenBucketState(b)
		if err != nil || got.TAT != tat {
			t.Errorf("Parse(Append(TAT %d)) = %+v, %v", tat, got, err)
		}
	}
}

func TestSlidingLogStateRoundTrip(t *testing.T) {
	t.Parallel()
	t0 := base.UnixMicro()
	op := Op{Algorithm: rules.SlidingLog, Limit: 100, Window: time.Minute, Hits: 3}
	var burst SlidingLogState
	burst, _ = SlidingLog(burst, base, op)
	burst, _ = SlidingLog(burst, base.Add(time.Microsecond), op)
	tests := []struct {
		name string
		give SlidingLogState
		want []int64
	}{
		{"empty", SlidingLogState{}, []int64{}},
		{"same_instant_and_next", burst, []int64{t0, t0, t0, t0 + 1, t0 + 1, t0 + 1}},
		{"wrapped_ring", wrappedLog(t), []int64{t0 + 4_000_000, t0 + 6_000_000, t0 + 10_000_000, t0 + 12_000_000}},
		{"extremes", SlidingLogState{ring: []int64{math.MinInt64, math.MaxInt64}, n: 2}, []int64{math.MinInt64, math.MaxInt64}},
	}
	for _, tt := range tests {
		b := AppendSlidingLogState(nil, tt.give)
		got, err := ParseSlidingLogState(b)
		if err != nil {
			t.Errorf("%s: Parse(Append(%v)): %v", tt.name, tt.want, err)
			continue
		}
		if ts := logTimes(got); !slices.Equal(ts, tt.want) {
			t.Errorf("%s: Parse(Append(...)) logs %v, want %v", tt.name, ts, tt.want)
		}
		if b2 := AppendSlidingLogState(nil, got); !bytes.Equal(b, b2) {
			t.Errorf("%s: encoding not stable: %x then %x", tt.name, b, b2)
		}
	}
	// Hits at one instant take a byte each.
	if b := AppendSlidingLogState(nil, burst); len(b) > 1+1+9+5 {
		t.Errorf("6 hits over 2 µs take %d bytes, want at most 16", len(b))
	}
}

// TestParsedSlidingLogKeepsWorking runs SlidingLog on a parsed state: its
// ring is exactly as long as the log and must grow.
func TestParsedSlidingLogKeepsWorking(t *testing.T) {
	t.Parallel()
	op := Op{Algorithm: rules.SlidingLog, Limit: 10, Window: time.Minute, Hits: 2}
	var st SlidingLogState
	var r Result
	for i := range 5 {
		st, _ = SlidingLog(st, base.Add(time.Duration(i)*s), op)
		var err error
		st, err = ParseSlidingLogState(AppendSlidingLogState(nil, st))
		if err != nil {
			t.Fatal(err)
		}
	}
	st, r = SlidingLog(st, base.Add(5*s), op)
	if r.Allowed || r.Before != 10 || r.ResetAfter != 55*s {
		t.Errorf("sixth op on a full parsed log: %+v, want refused with 10 logged", r)
	}
	st, r = SlidingLog(st, base.Add(60*s+500*time.Millisecond), op)
	if !r.Allowed || r.Before != 8 {
		t.Errorf("after the oldest left: %+v, want admitted over 8 logged", r)
	}
	if st.Len() != 10 {
		t.Errorf("log of %d hits after the last op, want 10", st.Len())
	}
}

func TestParseCorruptStates(t *testing.T) {
	t.Parallel()
	sw := AppendSlidingWindowState(nil, SlidingWindowState{Start: 1, Prev: 2, Curr: 3})
	tb := AppendTokenBucketState(nil, TokenBucketState{TAT: 12345})
	sl := AppendSlidingLogState(nil, SlidingLogState{ring: []int64{10, 20, 30}, n: 3})
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
		if !errors.Is(err, ErrCorruptState) {
			t.Errorf("%s: Parse(%x) = %v, want an error wrapping ErrCorruptState", tt.name, tt.give, err)
		}
	}
}

func parseSW(b []byte) error { _, err := ParseSlidingWindowState(b); return err }
func parseTB(b []byte) error { _, err := ParseTokenBucketState(b); return err }
func parseSL(b []byte) error { _, err := ParseSlidingLogState(b); return err }

func TestSlidingLogForgetAt(t *testing.T) {
	t.Parallel()
	mk := func(ts ...int64) SlidingLogState {
		return SlidingLogState{ring: slices.Clone(ts), n: len(ts)}
	}
	tests := []struct {
		name        string
		give        SlidingLogState
		at          int64
		k           int
		wantRemoved int
		want        []int64
	}{
		{"newest_run", mk(1, 2, 2, 2), 2, 2, 2, []int64{1, 2}},
		{"later_hits_stay", mk(1, 2, 2, 3, 4), 2, 2, 2, []int64{1, 3, 4}},
		{"fewer_than_k", mk(1, 2, 3), 2, 5, 1, []int64{1, 3}},
		{"absent", mk(1, 3), 2, 1, 0, []int64{1, 3}},
		{"empty", SlidingLogState{}, 2, 1, 0, []int64{}},
		{"all", mk(5, 5), 5, 2, 2, []int64{}},
	}
	for _, tt := range tests {
		got := tt.give.ForgetAt(tt.at, tt.k)
		if got != tt.wantRemoved || !slices.Equal(logTimes(tt.give), tt.want) {
			t.Errorf("%s: ForgetAt(%d, %d) = %d leaving %v, want %d leaving %v",
				tt.name, tt.at, tt.k, got, logTimes(tt.give), tt.wantRemoved, tt.want)
		}
	}
	// On a wrapped ring: forget the second newest hit.
	st := wrappedLog(t)
	t0 := base.UnixMicro()
	if n := st.ForgetAt(t0+10_000_000, 1); n != 1 {
		t.Fatalf("ForgetAt on a wrapped ring removed %d, want 1", n)
	}
	if got, want := logTimes(st), []int64{t0 + 4_000_000, t0 + 6_000_000, t0 + 12_000_000}; !slices.Equal(got, want) {
		t.Errorf("wrapped ring after ForgetAt: %v, want %v", got, want)
	}
	if ts, ok := st.Newest(); !ok || ts != t0+12_000_000 {
		t.Errorf("Newest = %d, %v; want %d, true", ts, ok, t0+12_000_000)
	}
	if _, ok := (SlidingLogState{}).Newest(); ok {
		t.Error("Newest of an empty log reports a hit")
	}
}

// FuzzParseStates requires the parsers never to panic, and every state they
// accept to encode back to the same bytes.
func FuzzParseStates(f *testing.F) {
	f.Add(AppendSlidingWindowState(nil, SlidingWindowState{Start: base.UnixMicro(), Prev: 4, Curr: 2}))
	f.Add(AppendTokenBucketState(nil, TokenBucketState{TAT: base.UnixMicro()}))
	f.Add(AppendSlidingLogState(nil, SlidingLogState{ring: []int64{1, 1, 5}, n: 3}))
	f.Add([]byte{'l', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte("1:2:3"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := ParseSlidingWindowState(data); err == nil {
			if b := AppendSlidingWindowState(nil, s); !bytes.Equal(b, data) && !nonCanonical(data) {
				t.Errorf("sliding window %x -> %+v -> %x", data, s, b)
			}
		}
		if s, err := ParseTokenBucketState(data); err == nil {
			if b := AppendTokenBucketState(nil, s); !bytes.Equal(b, data) && !nonCanonical(data) {
				t.Errorf("token bucket %x -> %+v -> %x", data, s, b)
			}
		}
		if s, err := ParseSlidingLogState(data); err == nil {
			if b := AppendSlidingLogState(nil, s); !bytes.Equal(b, data) && !nonCanonical(data) {
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
