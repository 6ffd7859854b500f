package limiter

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestBurstAcrossWindowBoundary sends a limit's worth of hits at the end of
// one minute and another at the start of the next. A fixed window admits
// both bursts (twice the limit in 20 seconds); the sliding log sees the last
// minute exactly and admits only the first; the sliding window's estimate
// admits one more; a token bucket admits the first and what refilled
// meanwhile.
func TestBurstAcrossWindowBoundary(t *testing.T) {
	const limit = 10
	tests := []struct {
		alg          rules.Algorithm
		wantAdmitted int
	}{
		{rules.FixedWindow, 20},
		// The estimate weighs the previous minute's 10 by the share of it
		// still inside the last minute: at 66 s that is ceil(10 × 54/60) = 9,
		// so one more hit fits; at 67-69 s the one it admitted plus 9 fill it.
		{rules.SlidingWindow, 11},
		{rules.SlidingLog, 10},
		// One token comes back every 6 s after the first hit at 50 s: at 56,
		// 62 and 68 s, so three hits of the second burst find one.
		{rules.TokenBucket, 13},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			var m machine
			op := Op{Algorithm: tt.alg, Limit: limit, Burst: limit, Window: time.Minute, Hits: 1}
			admitted := 0
			for i := range 2 * limit {
				// 50 s, 51 s, ... 69 s after the start of a minute.
				if m.apply(base.Add(time.Duration(50+i)*time.Second), op).Allowed {
					admitted++
				}
			}
			if admitted != tt.wantAdmitted {
				t.Errorf("%s admitted %d of 20 hits sent at 50..69 s, want %d", tt.alg, admitted, tt.wantAdmitted)
			}
		})
	}
}
