package limiter

import (
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

func TestSlidingLogTakeBack(t *testing.T) {
	t.Parallel()
	mk := func(ts ...int64) SlidingLogState {
		return SlidingLogState{ring: slices.Clone(ts), n: len(ts)}
	}
	tests := []struct {
		name        string
		give        SlidingLogState
		at          int64
		k           uint64
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
		got := tt.give.TakeBack(tt.at, tt.k)
		if got != tt.wantRemoved || !slices.Equal(logTimes(tt.give), tt.want) {
			t.Errorf("%s: TakeBack(%d, %d) = %d leaving %v, want %d leaving %v",
				tt.name, tt.at, tt.k, got, logTimes(tt.give), tt.wantRemoved, tt.want)
		}
	}
	// On a wrapped ring: forget the second newest hit.
	st := wrappedLog(t)
	t0 := base.UnixMicro()
	if n := st.TakeBack(t0+10_000_000, 1); n != 1 {
		t.Fatalf("TakeBack on a wrapped ring removed %d, want 1", n)
	}
	if got, want := logTimes(st), []int64{t0 + 4_000_000, t0 + 6_000_000, t0 + 12_000_000}; !slices.Equal(got, want) {
		t.Errorf("wrapped ring after TakeBack: %v, want %v", got, want)
	}
	if ts, ok := st.Newest(); !ok || ts != t0+12_000_000 {
		t.Errorf("Newest = %d, %v; want %d, true", ts, ok, t0+12_000_000)
	}
	if _, ok := (SlidingLogState{}).Newest(); ok {
		t.Error("Newest of an empty log reports a hit")
	}
}
