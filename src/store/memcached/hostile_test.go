package memcached

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// connCounter counts the connections a Store dials, and how many are open
// (dials under way included) at most at once.
type connCounter struct {
	dials, open, peak atomic.Int64
}

func (c *connCounter) wrap(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.dials.Add(1)
		n := c.open.Add(1)
		for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
		}
		conn, err := dial(ctx, network, addr)
		if err != nil {
			c.open.Add(-1)
			return nil, err
		}
		return &countedConn{Conn: conn, c: c}, nil
	}
}

type countedConn struct {
	net.Conn
	c    *connCounter
	once sync.Once
}

func (cc *countedConn) Close() error {
	cc.once.Do(func() { cc.c.open.Add(-1) })
	return cc.Conn.Close()
}

// newCountingStore is newStore with its connections counted in c.
func newCountingStore(t *testing.T, cfg Config, c *connCounter) *Store {
	t.Helper()
	s, err := newWith(t.Context(), cfg, deps{lookup: net.DefaultResolver.LookupSRV, wrapDial: c.wrap})
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDataErrors puts items the store cannot count in into memcached: a
// fixed window that memcached refuses to incr (not a number, or past 64
// bits) or that is not a counter, and states that do not decode. Each op on
// them fails with ErrData and never ErrUnavailable, naming the key; the
// store stays healthy, keeps its idle connections, and serves other keys.
func TestDataErrors(t *testing.T) {
	t.Parallel()
	srv := storetest.StartMemcached(t)
	var conns connCounter
	s := newCountingStore(t, Config{Addrs: []string{srv.Addr}, MaxIdleConns: 4}, &conns)
	raw := memcache.New(srv.Addr)
	sw := string(limiter.AppendSlidingWindowState(nil, limiter.SlidingWindowState{Curr: 1}))
	tests := []struct {
		name  string
		alg   rules.Algorithm
		value string
		hits  uint64
		// all puts the op in an AllOrNothing batch before an op on an
		// item memcached refuses to incr: the batch fails with ErrData
		// and the op's hits are taken back.
		all bool
	}{
		{name: "fixed_not_a_number", alg: rules.FixedWindow, value: "abc", hits: 1},
		{name: "fixed_read_not_a_number", alg: rules.FixedWindow, value: "abc", hits: 0},
		{name: "fixed_past_64_bits", alg: rules.FixedWindow, value: "18446744073709551616", hits: 1},
		{name: "fixed_negative", alg: rules.FixedWindow, value: "-1", hits: 1},
		{name: "fixed_max_hits", alg: rules.FixedWindow, value: "abc", hits: limiter.MaxHits},
		{name: "sliding_window_garbage", alg: rules.SlidingWindow, value: "garbage", hits: 1},
		{name: "sliding_window_read", alg: rules.SlidingWindow, value: "garbage", hits: 0},
		{name: "sliding_log_garbage", alg: rules.SlidingLog, value: "garbage", hits: 1},
		{name: "token_bucket_garbage", alg: rules.TokenBucket, value: "garbage", hits: 1},
		{name: "token_bucket_of_sliding_window", alg: rules.TokenBucket, value: sw, hits: 1},
		{name: "all_or_nothing", alg: rules.SlidingLog, value: "", hits: 1, all: true},
	}
	now := time.Now()
	for _, tt := range tests {
		key := uniqueKey(t, tt.name)
		if tt.value != "" {
			if err := raw.Set(&memcache.Item{Key: key, Value: []byte(tt.value), Expiration: 60}); err != nil {
				t.Fatal(err)
			}
		}
		b := &limiter.Batch{Now: now, Ops: []limiter.Op{{Key: key, Algorithm: tt.alg, Limit: 5, Window: time.Minute, Hits: tt.hits}}}
		if tt.all {
			b.AllOrNothing = true
			bad := limiter.Op{Key: uniqueKey(t, tt.name+"_bad"), Algorithm: rules.FixedWindow, Limit: 5, Window: time.Minute, Hits: 1}
			b.Ops = append(b.Ops, bad)
			if err := raw.Set(&memcache.Item{Key: bad.Key, Value: []byte("abc"), Expiration: 60}); err != nil {
				t.Fatal(err)
			}
		}
		before := conns.open.Load()
		err := s.Do(t.Context(), b)
		if !errors.Is(err, limiter.ErrData) || errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), key[:20]) {
			t.Errorf("%s: Do = %v, want ErrData (not ErrUnavailable) naming the key", tt.name, err)
		}
		if !s.Healthy() {
			t.Errorf("%s: the store turned unhealthy", tt.name)
		}
		// gomemcache drops the connection that got a CLIENT_ERROR, and only
		// that one.
		if open := conns.open.Load(); open < before-1 {
			t.Errorf("%s: %d connections open before, %d after: the idle ones were closed", tt.name, before, open)
		}
		if tt.all {
			read := b.Ops[0]
			read.Hits = 0
			if r := do(t, s, false, now, read)[0]; r.Before != 0 {
				t.Errorf("%s: %d hits left recorded by a failed all-or-nothing batch", tt.name, r.Before)
			}
		}
	}
	if err := hit(t.Context(), s, uniqueKey(t, "other")); err != nil {
		t.Errorf("another key after the data errors: %v", err)
	}
	if !s.Healthy() {
		t.Error("the data errors made the store unhealthy")
	}
}
