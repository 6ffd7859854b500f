package memcached

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestOpStats counts the commands sent to a real memcached by outcome, as
// the anchor's memcache statistics do.
func TestOpStats(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	now := time.Now()
	fixed := limiter.Op{Key: uniqueKey(t, "fixed"), Algorithm: rules.FixedWindow, Limit: 10, Window: time.Hour, Hits: 1}
	// A key this instance has not written is tried with add first, then
	// counted with incr.
	do(t, s, false, now, fixed)
	do(t, s, false, now, fixed)
	got := s.OpStats()
	if got.AddSuccess != 1 || got.IncrementSuccess != 1 || got.IncrementError != 0 || got.AddError != 0 {
		t.Errorf("after two hits on a new fixed window: %+v; want one add and one incr, both successful", got)
	}
	// The other algorithms read their state with get: a new key is a
	// read that found nothing, then a stored key is found.
	bucket := limiter.Op{Key: uniqueKey(t, "bucket"), Algorithm: rules.TokenBucket, Limit: 10, Window: time.Hour, Hits: 1}
	do(t, s, false, now, bucket)
	do(t, s, false, now, bucket)
	got = s.OpStats()
	if got.KeysRequested != 2 || got.KeysFound != 1 || got.MultiGetSuccess != 2 || got.MultiGetError != 0 {
		t.Errorf("after two hits on a new token bucket: %+v; want 2 keys read, 1 found", got)
	}
}
