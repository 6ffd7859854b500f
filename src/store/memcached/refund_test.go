package memcached

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// TestRefundMakesNoItem: a refund of a key never hit, alone or a list's,
// has nothing to give back and leaves no item (decr misses; the state
// algorithms and lists write only what a refund changed).
func TestRefundMakesNoItem(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	now := time.Now()
	for _, a := range rules.Algorithms {
		op := limiter.Op{Key: uniqueKey(t, a.String()), Algorithm: a, Limit: 5, Window: time.Hour, Hits: 3, Refund: true}
		if r := do(t, s, false, now, op)[0]; !r.Allowed || r.After != 0 || r.Remaining != 5 {
			t.Errorf("%s: refund of a key never hit = %+v, want allowed, empty", a, r)
		}
		if _, _, err := s.client.Gets(t.Context(), itemKey(op.Key)); !errors.Is(err, mcclient.ErrCacheMiss) {
			t.Errorf("%s: the item after a refund of a key never hit: %v, want a miss", a, err)
		}
	}
	// A list of a fixed window and a token bucket, in one item.
	entries := []rules.Entry{{Key: "user", Value: uniqueKey(t, "list")}}
	cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(`domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: hour, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := limiter.New(s, limiter.Config{})
	ds := []limiter.Descriptor{{Entries: entries, Limit: cfg.Match("d", entries).Limit, Hits: 3, Refund: true}}
	out := make([]limiter.Status, 1)
	if err := l.Check(t.Context(), "d", now, ds, out); err != nil || out[0].Code != limiter.OK || out[0].Remaining != 5 {
		t.Errorf("refund of a list never hit = %+v, %v; want OK, 5 left", out[0], err)
	}
	key, _, _ := limiter.SplitListKey(string(limiter.CacheKey(nil, "", "d", entries, ds[0].Limit.Limits[0], now)), rules.FixedWindow)
	if _, _, err := s.client.Gets(t.Context(), itemKey(key)); !errors.Is(err, mcclient.ErrCacheMiss) {
		t.Errorf("the list's item after a refund of a list never hit: %v, want a miss", err)
	}
}

// TestRefundSaturated: a count saturated past 2^63 (see counted) stays
// over any limit, however much a request may give back (as the undos of
// AllOrNothing, refunds may take it just under 2^63).
func TestRefundSaturated(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	op := limiter.Op{Key: uniqueKey(t, "sat"), Limit: 10, Window: time.Hour}
	if err := s.client.Add(t.Context(), itemKey(op.Key), []byte("9223372036854775810"), 3600); err != nil {
		t.Fatal(err)
	}
	op.Hits, op.Refund = limiter.MaxHits, true
	for range 3 {
		if r := do(t, s, false, time.Now(), op)[0]; !r.Allowed || r.After <= math.MaxUint32 || r.Remaining != 0 {
			t.Errorf("refund of %d of a saturated count = %+v, want allowed, still over any limit, nothing left", op.Hits, r)
		}
	}
}
