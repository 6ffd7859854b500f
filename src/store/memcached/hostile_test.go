package memcached

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// connCounter counts the connections a Store dials, and how many are open
// (dials under way included) at most at once.
type connCounter struct {
	dials, open, peak atomic.Int64
	// onWrite, when set before the store is made, sees every write to
	// memcached before it is sent.
	onWrite func(p []byte)
}

func (c *connCounter) wrap(dial mcclient.DialFunc) mcclient.DialFunc {
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

func (cc *countedConn) Write(p []byte) (int, error) {
	if cc.c.onWrite != nil {
		cc.c.onWrite(p)
	}
	return cc.Conn.Write(p)
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
	srv := harness.StartMemcached(t)
	var conns connCounter
	s := newCountingStore(t, Config{Addrs: []string{srv.Addr}, MaxConns: 8}, &conns)
	raw := memcache.New(srv.Addr)
	sw := string(appendSlidingWindowState(nil, limiter.SlidingWindowState{Curr: 1}))
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

// TestSaturation sets fixed-window counts around the marks, and near 2^64
// as a count written by others could be, and hits them with MaxHits, on
// their own and in AllOrNothing batches: every op is over the limit
// without an error, the ordinary hits after it too, and memcached's count
// ends saturated and pinned below pinMark, never small again. The limit is
// the largest a rule can set, so that a count that wrapped would show.
func TestSaturation(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	const limit = limiter.MaxHits
	tests := []struct {
		name string
		give uint64
	}{
		{"near_wrap", math.MaxUint64 - 9},
		{"max", math.MaxUint64},
		{"wraps_to_zero", math.MaxUint64 - limiter.MaxHits + 1},
		{"below_pin", pinMark - 1},
		{"pin", pinMark},
		{"below_saturation", satMark - 1},
		{"saturation", satMark},
		{"spent", limit},
	}
	now := time.Now()
	for _, tt := range tests {
		for _, all := range []bool{false, true} {
			name := fmt.Sprintf("%s_all_%v", tt.name, all)
			key := uniqueKey(t, name)
			if err := raw.Set(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, tt.give, 10), Expiration: 3600}); err != nil {
				t.Fatal(err)
			}
			op := limiter.Op{Key: key, Limit: limit, Window: time.Hour, Hits: limiter.MaxHits}
			for i := range 4 {
				r := do(t, s, all, now, op)[0]
				if r.Allowed || r.After <= limit || r.Remaining != 0 {
					t.Errorf("%s: hit %d of %d: %+v, want over the limit", name, i, op.Hits, r)
				}
				op.Hits = 1 // then ordinary hits
			}
			op.Hits = 0
			r := do(t, s, false, now, op)[0]
			it, err := raw.Get(key)
			if err != nil {
				t.Fatal(err)
			}
			n, err := parseCount(it.Value)
			if err != nil {
				t.Fatal(err)
			}
			if tt.name == "spent" {
				if r.Before < limit || r.Remaining != 0 {
					t.Errorf("%s: read %+v, want the limit spent", name, r)
				}
				continue
			}
			if r.Before != math.MaxUint64 || r.Remaining != 0 {
				t.Errorf("%s: read %+v, want the count saturated", name, r)
			}
			if n < satMark || n >= pinMark {
				t.Errorf("%s: memcached holds %d, want in [2^63, 2^63+2^62)", name, n)
			}
			// A pin or a repair keeps the key expiring.
			if ttl := metaTTL(t, srv.Addr, key); ttl <= 0 || ttl > 3601 {
				t.Errorf("%s: TTL %d s, want within the hour window", name, ttl)
			}
		}
	}
}

// TestSaturationConcurrent hammers a count just below pinMark with maximal
// ops from many goroutines, some in AllOrNothing batches: every op is over
// the limit, and the pins keep the count within range.
func TestSaturationConcurrent(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	key := uniqueKey(t, "k")
	if err := raw.Set(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, pinMark-1000, 10), Expiration: 3600}); err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 8, 40
	now := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			b := &limiter.Batch{Now: now, AllOrNothing: w%2 == 0, Ops: []limiter.Op{{Key: key, Limit: limiter.MaxHits, Window: time.Hour, Hits: limiter.MaxHits}}}
			for range rounds {
				if err := s.Do(t.Context(), b); err != nil || b.Results[0].Allowed {
					t.Errorf("maximal op: %v %+v, want over the limit", err, b.Results)
					return
				}
			}
		})
	}
	wg.Wait()
	it, err := raw.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := parseCount(it.Value); err != nil || n < satMark || n >= pinMark+workers*limiter.MaxHits {
		t.Errorf("memcached holds %d (%v), want in [2^63, 2^63+2^62+%d maximal ops)", n, err, workers)
	}
}

// TestSpentStates puts spent states of the continuous algorithms, some at
// the edge of their encodings, in memcached and hits them with MaxHits and
// then ordinary hits: every op is refused without an error, and the state
// stays as it was.
func TestSpentStates(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	now := time.Now()
	const limit, window = 5, time.Hour
	start := now.UnixMicro() / window.Microseconds() * window.Microseconds()
	log, _ := limiter.SlidingLog(limiter.SlidingLogState{}, now, limiter.Op{Algorithm: rules.SlidingLog, Limit: limit, Window: window, Hits: limit})
	tests := []struct {
		name  string
		alg   rules.Algorithm
		state []byte
	}{
		{"sliding_window_full", rules.SlidingWindow, appendSlidingWindowState(nil, limiter.SlidingWindowState{Start: start, Curr: limit})},
		{"sliding_window_max_counts", rules.SlidingWindow, appendSlidingWindowState(nil, limiter.SlidingWindowState{Start: start, Prev: math.MaxUint64, Curr: math.MaxUint64})},
		{"sliding_window_max_prev", rules.SlidingWindow, appendSlidingWindowState(nil, limiter.SlidingWindowState{Start: start, Prev: math.MaxUint64})},
		{"sliding_log_full", rules.SlidingLog, appendSlidingLogState(nil, log)},
		{"token_bucket_empty", rules.TokenBucket, appendTokenBucketState(nil, limiter.TokenBucketState{TAT: now.Add(window).UnixMicro()})},
		{"token_bucket_max_tat", rules.TokenBucket, appendTokenBucketState(nil, limiter.TokenBucketState{TAT: math.MaxInt64})},
	}
	for _, tt := range tests {
		key := uniqueKey(t, tt.name)
		if err := raw.Set(&memcache.Item{Key: key, Value: tt.state, Expiration: 3600}); err != nil {
			t.Fatal(err)
		}
		op := limiter.Op{Key: key, Algorithm: tt.alg, Limit: limit, Window: window, Hits: limiter.MaxHits}
		for _, all := range []bool{false, true, false} {
			r := do(t, s, all, now, op)[0]
			if r.Allowed || r.After <= limit || r.Remaining != 0 {
				t.Errorf("%s: %d hits: %+v, want refused", tt.name, op.Hits, r)
			}
			op.Hits = 1
		}
		it, err := raw.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(it.Value, tt.state) {
			t.Errorf("%s: state %q after refused ops, want %q unchanged", tt.name, it.Value, tt.state)
		}
	}
}

// TestIncrAddLoopIsBounded is issue 24's case 6: a memcached that answers
// incr with NOT_FOUND and add with NOT_STORED, which no memcached does
// for long, held a fixed-window op in its incr-then-add loop until the
// request's deadline (75,000 round trips in 5.8 s; with no deadline, for
// ever). The loop now ends after maxAttempts adds with ErrOverloaded,
// counted in Shed, and the store stays healthy: memcached answered.
func TestIncrAddLoopIsBounded(t *testing.T) {
	t.Parallel()
	f := harness.StartFakeMemcached(t)
	f.Answer("incr", "NOT_FOUND\r\n")
	f.Answer("add", "NOT_STORED\r\n")
	s := newStore(t, Config{Addrs: []string{f.Addr}})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A deadline far beyond what the bounded loop takes: the old loop
	// ran until it.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i, now := range []time.Time{time.Unix(1_700_000_000, 0), time.Unix(1_700_000_001, 0)} {
		// The first op starts with add (the key is new to this
		// instance), the second with incr.
		b := &limiter.Batch{Now: now, Ops: []limiter.Op{{Key: "k", Limit: 5, Window: time.Minute, Hits: 1}}}
		before := f.Commands()
		err := s.Do(ctx, b)
		if !errors.Is(err, limiter.ErrOverloaded) || !errors.Is(err, errMissing) {
			t.Errorf("op %d: Do = %v, want ErrOverloaded: incr missed at every attempt", i, err)
		}
		if n := f.Commands() - before; n > 2*maxAttempts {
			t.Errorf("op %d: %d commands, want at most %d (incr and add, %d times)", i, n, 2*maxAttempts, maxAttempts)
		}
	}
	if got := s.Shed(); got != 2 {
		t.Errorf("Shed = %d, want 2", got)
	}
	if !s.Healthy() {
		t.Error("the store is unhealthy: memcached answered every command")
	}
}

// TestOutOfMemoryIsAnAnswer is issue 24's case 2, its part on one write: a
// memcached that refuses to store when full (-M) answers a new item with
// "SERVER_ERROR out of memory storing object". That is an answer about the
// request (ErrOverloaded: ResourceExhausted, never OK, counted in Shed),
// not an outage: it trips no breaker, even one that opens at the first
// failure, and health stays; the keys already stored are still counted.
func TestOutOfMemoryIsAnAnswer(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t, "-m", "2", "-M")
	s := newStore(t, Config{Addrs: []string{srv.Addr}, Breaker: breaker.Config{Failures: 1}})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	op := func(i int) limiter.Op {
		return limiter.Op{Key: fmt.Sprintf("fill_%06d", i), Limit: 5, Window: time.Hour, Hits: 1}
	}
	// 2 MiB hold some 20,000 counters: fill until memcached refuses one.
	var err error
	stored := 0
	for ; stored < 100_000 && err == nil; stored++ {
		err = s.Do(t.Context(), &limiter.Batch{Now: now, Ops: []limiter.Op{op(stored)}})
	}
	if !errors.Is(err, limiter.ErrOverloaded) || errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("after %d counters: %v, want ErrOverloaded and not ErrUnavailable", stored, err)
	}
	t.Logf("after %d counters: %v", stored, err)
	b := &limiter.Batch{Now: now, Ops: []limiter.Op{op(0)}}
	if err := s.Do(t.Context(), b); err != nil || b.Results[0].Before != 1 {
		t.Errorf("a stored key when full: %+v, %v; want counted, its second hit", b.Results[0], err)
	}
	if st := s.Breakers(); st.Trips != 0 || !s.Healthy() || s.Shed() == 0 {
		t.Errorf("breakers %+v, healthy %v, shed %d; want none tripped, healthy, the refusal shed", st, s.Healthy(), s.Shed())
	}
}
