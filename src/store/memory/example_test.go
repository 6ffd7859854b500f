package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

func ExampleNew() {
	store := memory.New(memory.Config{MaxKeys: 1_000_000})
	defer store.Close()
	l := limiter.New(store, limiter.Config{NearLimitRatio: 0.8})

	login := &rules.Limit{RequestsPerUnit: 2, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: rules.SlidingLog}
	ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "path", Value: "/login"}}, Limit: login, Hits: 1}}
	out := make([]limiter.Status, len(ds))
	now := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		if err := l.Check(context.Background(), "edge", now.Add(time.Duration(i)*10*time.Second), ds, out); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("code=%d remaining=%d reset=%v\n", out[0].Code, out[0].Remaining, out[0].ResetAfter)
	}
	// Output:
	// code=0 remaining=1 reset=1m0s
	// code=0 remaining=0 reset=50s
	// code=1 remaining=0 reset=40s
}
