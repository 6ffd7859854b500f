package redis

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestRefundKeys: a refund of a key never hit makes no key in Redis (the
// anchor's decrement script does not either), and a fixed window's refund
// keeps its key's TTL (DECRBY), so the window's key still goes when it
// would have.
func TestRefundKeys(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr})
	now := time.Now()
	do := func(op limiter.Op) limiter.Result {
		t.Helper()
		b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}, Results: make([]limiter.Result, 1)}
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		return b.Results[0]
	}
	for _, a := range rules.Algorithms {
		op := limiter.Op{Key: "refund_never_hit_" + a.String(), Algorithm: a, Limit: 5, Window: time.Hour, Hits: 3, Refund: true}
		if r := do(op); !r.Allowed || r.After != 0 || r.Remaining != 5 {
			t.Errorf("%s: refund of a key never hit = %+v, want allowed, empty", a, r)
		}
		if n, err := srv.Do(t.Context(), "EXISTS", stateKey(&op)); err != nil || n != int64(0) {
			t.Errorf("%s: EXISTS %s after a refund of a key never hit = %v, %v; want 0", a, stateKey(&op), n, err)
		}
	}
	op := limiter.Op{Key: "refund_ttl", Algorithm: rules.FixedWindow, Limit: 5, Window: time.Hour, Hits: 4}
	do(op)
	if _, err := srv.Do(t.Context(), "EXPIRE", op.Key, "100"); err != nil {
		t.Fatal(err)
	}
	op.Hits, op.Refund = 1, true
	if r := do(op); r.After != 3 || r.Remaining != 2 {
		t.Errorf("refund of 1 of 4 = %+v, want 3 in use, 2 left", r)
	}
	ttl, err := srv.Do(t.Context(), "TTL", op.Key)
	if got, _ := ttl.(int64); err != nil || got <= 0 || got > 100 {
		t.Errorf("TTL after a refund = %v, %v; want the key's own, at most 100 s", ttl, err)
	}
}
