package limiter_test

import (
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

func ExampleCacheKey() {
	entries := []rules.Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/login"}}
	now := time.Unix(1_700_000_029, 0)
	perMinute := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1}
	bucket := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: rules.TokenBucket}

	buf := make([]byte, 0, 128) // reuse it: CacheKey appends
	buf = limiter.CacheKey(buf[:0], "rl_", "edge", entries, perMinute, now)
	fmt.Println(string(buf))
	buf = limiter.CacheKey(buf[:0], "rl_", "edge", entries, bucket, now)
	fmt.Println(string(buf))
	// Output:
	// rl_edge_remote_address_10.0.0.1_path_/login_1699999980
	// rl_edge_remote_address_10.0.0.1_path_/login_60_token_bucket
}

func ExampleEscapedCacheKey() {
	perHour := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Hour, UnitMultiplier: 1}
	now := time.Unix(1_700_000_029, 0)
	// Under a rule k1 -> k2, two clients whose values hold '_'.
	a := []rules.Entry{{Key: "k1", Value: "x_k2_y"}, {Key: "k2", Value: "z"}}
	b := []rules.Entry{{Key: "k1", Value: "x"}, {Key: "k2", Value: "y_k2_z"}}
	fmt.Println(string(limiter.CacheKey(nil, "rl_", "edge", a, perHour, now)))
	fmt.Println(string(limiter.CacheKey(nil, "rl_", "edge", b, perHour, now)))
	fmt.Println(string(limiter.EscapedCacheKey(nil, "rl_", "edge", a, perHour, now)))
	fmt.Println(string(limiter.EscapedCacheKey(nil, "rl_", "edge", b, perHour, now)))
	// Output:
	// rl_edge_k1_x_k2_y_k2_z_1699999200
	// rl_edge_k1_x_k2_y_k2_z_1699999200
	// rl_edge_k1_x\_k2\_y_k2_z_1699999200
	// rl_edge_k1_x_k2_y\_k2\_z_1699999200
}

func ExampleFixedWindow() {
	op := limiter.Op{Algorithm: rules.FixedWindow, Limit: 2, Window: time.Minute, Hits: 1}
	now := time.Unix(1_700_000_020, 0) // 40 s into a minute
	var s limiter.FixedWindowState
	for range 3 {
		var r limiter.Result
		s, r = limiter.FixedWindow(s, now, op)
		fmt.Printf("allowed=%v count=%d remaining=%d reset=%v\n", r.Allowed, r.After, r.Remaining, r.ResetAfter)
	}
	// Output:
	// allowed=true count=1 remaining=1 reset=20s
	// allowed=true count=2 remaining=0 reset=20s
	// allowed=false count=3 remaining=0 reset=20s
}

func ExampleSlidingWindow() {
	op := limiter.Op{Algorithm: rules.SlidingWindow, Limit: 10, Window: time.Minute}
	start := time.Unix(1_699_999_980, 0) // the start of a minute
	var s limiter.SlidingWindowState
	var r limiter.Result
	op.Hits = 10
	s, r = limiter.SlidingWindow(s, start, op)
	fmt.Printf("allowed=%v estimate=%d next fits in %v\n", r.Allowed, r.After, r.ResetAfter)
	// 45 s into the next minute, the previous one weighs 15/60.
	op.Hits = 0
	_, r = limiter.SlidingWindow(s, start.Add(105*time.Second), op)
	fmt.Printf("estimate=%d remaining=%d\n", r.After, r.Remaining)
	// Output:
	// allowed=true estimate=10 next fits in 1m6s
	// estimate=3 remaining=7
}

func ExampleSlidingLog() {
	op := limiter.Op{Algorithm: rules.SlidingLog, Limit: 2, Window: time.Minute, Hits: 1}
	t0 := time.Unix(1_700_000_000, 0)
	var s limiter.SlidingLogState
	var r limiter.Result
	for _, at := range []time.Duration{0, 20 * time.Second, 30 * time.Second, 60 * time.Second} {
		s, r = limiter.SlidingLog(s, t0.Add(at), op)
		fmt.Printf("%v: allowed=%v logged=%d oldest leaves in %v\n", at, r.Allowed, s.Len(), r.ResetAfter)
	}
	// Output:
	// 0s: allowed=true logged=1 oldest leaves in 1m0s
	// 20s: allowed=true logged=2 oldest leaves in 40s
	// 30s: allowed=false logged=2 oldest leaves in 30s
	// 1m0s: allowed=true logged=2 oldest leaves in 20s
}

func ExampleTokenBucket() {
	// 60 a minute (one token a second) with room for 5 at once.
	op := limiter.Op{Algorithm: rules.TokenBucket, Limit: 60, Burst: 5, Window: time.Minute}
	t0 := time.Unix(1_700_000_000, 0)
	var s limiter.TokenBucketState
	var r limiter.Result
	op.Hits = 5
	s, r = limiter.TokenBucket(s, t0, op)
	fmt.Printf("allowed=%v tokens=%d full in %v\n", r.Allowed, r.Remaining, r.ResetAfter)
	op.Hits = 2
	s, r = limiter.TokenBucket(s, t0.Add(1500*time.Millisecond), op)
	fmt.Printf("allowed=%v tokens=%d full in %v\n", r.Allowed, r.Remaining, r.ResetAfter)
	op.Hits = 1
	_, r = limiter.TokenBucket(s, t0.Add(1500*time.Millisecond), op)
	fmt.Printf("allowed=%v tokens=%d full in %v\n", r.Allowed, r.Remaining, r.ResetAfter)
	// Output:
	// allowed=true tokens=0 full in 5s
	// allowed=false tokens=1 full in 3.5s
	// allowed=true tokens=0 full in 4.5s
}
