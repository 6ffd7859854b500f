package memcached

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
	"github.com/ratelimitd/ratelimit/storetest"
)

// newStore returns a Store on cfg, closed in t.Cleanup.
func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// do sends one batch and returns its results.
func do(t *testing.T, s *Store, allOrNothing bool, now time.Time, ops ...limiter.Op) []limiter.Result {
	t.Helper()
	b := &limiter.Batch{Now: now, Ops: ops, AllOrNothing: allOrNothing}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatalf("Do(%+v): %v", ops, err)
	}
	return b.Results
}

// uniqueKey is a key of its own for each test, so tests share servers.
func uniqueKey(t *testing.T, name string) string {
	return fmt.Sprintf("%s_%s_%d", strings.ReplaceAll(t.Name(), "/", "_"), name, time.Now().UnixNano())
}

func TestStore(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	// Batch.Now is the clock of every algorithm (see the package doc).
	storetest.Run(t, func(t *testing.T) limiter.Store {
		return newStore(t, Config{Addrs: []string{srv.Addr}})
	}, storetest.Options{})
}

// TestShards spreads keys over two servers: each holds some, together they
// hold every key once, and the counts are exact.
func TestShards(t *testing.T) {
	t.Parallel()
	a, b := harness.StartMemcached(t), harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{a.Addr, b.Addr}})
	const keys = 200
	now := time.Now()
	for _, alg := range rules.Algorithms {
		for i := range keys {
			op := limiter.Op{Key: fmt.Sprintf("shard_%s_%d", alg, i), Algorithm: alg, Limit: 10, Window: time.Hour, Hits: 2}
			do(t, s, false, now, op)
			r := do(t, s, false, now, op)[0]
			if !r.Allowed || r.Before != 2 || r.After != 4 {
				t.Fatalf("%s key %d, second op: %+v, want 2 -> 4 admitted", alg, i, r)
			}
		}
	}
	var total int
	for _, srv := range []*harness.MemcachedServer{a, b} {
		stats, err := srv.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(stats["curr_items"])
		if n < keys/4 {
			t.Errorf("server %s holds %d of %d items: keys are not spread", srv.Addr, n, 4*keys)
		}
		total += n
	}
	if total != 4*keys {
		t.Errorf("the servers hold %d items, want %d", total, 4*keys)
	}
	// Each key is on the server gomemcache picks, and only there.
	var sl memcache.ServerList
	if err := sl.SetServers(a.Addr, b.Addr); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		key := fmt.Sprintf("shard_fixed_window_%d", i)
		want, _ := sl.PickServer(key)
		for _, srv := range []*harness.MemcachedServer{a, b} {
			_, err := memcache.New(srv.Addr).Get(key)
			if has := err == nil; has != (want.String() == srv.Addr) {
				t.Errorf("key %q on %s: %v (picked server %s)", key, srv.Addr, err, want)
			}
		}
	}
}

// TestUnsafeKeys counts keys that memcached refuses as they are (too long,
// spaces, control characters) under stable substitutes, and keeps the
// others as they are, as the anchor writes them.
func TestUnsafeKeys(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	long := "rl_domain_user_" + strings.Repeat("x", 300) + "_1700000000"
	keys := map[string]string{
		"long":    long,
		"spaces":  "rl_domain_user_alice smith_1700000000",
		"control": "rl_domain_path_/a\r\nb\x7f_1700000000",
		// Same first 100 bytes as long, different end: a different item.
		"long_other": "rl_domain_user_" + strings.Repeat("x", 300) + "_1700000060",
	}
	now := time.Now()
	for name, key := range keys {
		for _, alg := range rules.Algorithms {
			op := limiter.Op{Key: key + alg.String(), Algorithm: alg, Limit: 3, Window: time.Hour, Hits: 1}
			for i := range 4 {
				r := do(t, s, false, now, op)[0]
				if want := i < 3; r.Allowed != want || r.Before != uint64(min(i, 3)) {
					t.Errorf("%s %s hit %d: %+v, want allowed %v", name, alg, i, r, want)
				}
			}
			op.Hits = 0
			r := do(t, s, false, now, op)[0]
			want := uint64(3)
			if alg == rules.FixedWindow {
				want = 4
			}
			if r.Before != want {
				t.Errorf("%s %s: count %d after 4 hits, want %d", name, alg, r.Before, want)
			}
		}
	}
	sub := itemKey(long)
	if !mcclient.LegalKey(sub) || sub != itemKey(long) {
		t.Errorf("itemKey(long) = %q: not a stable legal memcached key", sub)
	}
	if !strings.HasPrefix(sub, long[:keyHead]+"#sha256:") {
		t.Errorf("itemKey(long) = %q, want the key's first %d bytes, then #sha256:", sub, keyHead)
	}
	if got := itemKey("rl_domain_user_alice smith_1"); got[:len("rl_domain_user_alice_smith_1#")] != "rl_domain_user_alice_smith_1#" {
		t.Errorf("itemKey with a space = %q", got)
	}
	// Keys memcached takes are used as they are: the anchor's key.
	key := "rl_anchor_user_bob_" + strconv.FormatInt(now.Unix()/60*60, 10)
	do(t, s, false, now, limiter.Op{Key: key, Limit: 10, Window: time.Minute, Hits: 7})
	it, err := memcache.New(srv.Addr).Get(key)
	if err != nil || strings.TrimSpace(string(it.Value)) != "7" {
		t.Errorf("Get(%q) = %v, %v; want the count 7 under the key as given", key, it, err)
	}
}

// TestCounterShrinks reads a fixed-window count that decr made shorter:
// memcached pads it with spaces.
func TestCounterShrinks(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	op := limiter.Op{Key: uniqueKey(t, "c"), Limit: 10, Window: time.Hour, Hits: 10}
	now := time.Now()
	do(t, s, false, now, op)
	op.Hits = 1
	if r := do(t, s, true, now, op)[0]; r.Allowed || r.Before != 10 || r.After != 11 {
		t.Fatalf("11th hit, all or nothing: %+v, want refused 10 -> 11", r)
	}
	op.Hits = 0
	if r := do(t, s, false, now, op)[0]; r.Before != 10 || r.Remaining != 0 {
		t.Errorf("after the take-back: %+v, want the count 10", r)
	}
	// 10 -> 9 leaves "9 " in memcached.
	if _, err := s.client.Decr(t.Context(), itemKey(op.Key), 1); err != nil {
		t.Fatal(err)
	}
	if r := do(t, s, false, now, op)[0]; r.Before != 9 || r.Remaining != 1 {
		t.Errorf("after decr to 9: %+v, want the count 9", r)
	}
	op.Hits = 1
	if r := do(t, s, false, now, op)[0]; !r.Allowed || r.Before != 9 || r.After != 10 {
		t.Errorf("hit after decr to 9: %+v, want admitted 9 -> 10", r)
	}
}

// TestAllOrNothingTakesBackUnderTraffic runs refused all-or-nothing batches
// while other requests hit the same keys: the take-back removes exactly the
// refused batches' hits, so the counts end as if those batches never ran.
func TestAllOrNothingTakesBackUnderTraffic(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	now := time.Now()
	for _, alg := range rules.Algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			// A limit far above the hits, but not so far that a token
			// bucket's item expires within seconds: its TAT would be
			// under a second past now (a hit is W/Limit), and a loaded
			// machine that stalls longer loses the count.
			shared := limiter.Op{Key: uniqueKey(t, "shared"), Algorithm: alg, Limit: 1000, Window: time.Hour, Hits: 1}
			full := limiter.Op{Key: uniqueKey(t, "full"), Algorithm: alg, Limit: 0, Window: time.Hour, Hits: 1}
			const workers, rounds = 4, 50
			errs := make(chan error, 2*workers)
			for w := range workers {
				go func() { // plain hits on the shared key
					b := &limiter.Batch{Now: now, Ops: []limiter.Op{shared}}
					for range rounds {
						if err := s.Do(context.Background(), b); err != nil || !b.Results[0].Allowed {
							errs <- fmt.Errorf("plain hit: %v %+v", err, b.Results)
							return
						}
					}
					errs <- nil
				}()
				go func() { // batches refused by the full key: take back
					b := &limiter.Batch{Now: now, Ops: []limiter.Op{shared, full}, AllOrNothing: true}
					b.Ops[0].Hits = uint64(w + 1)
					for range rounds {
						if err := s.Do(context.Background(), b); err != nil || b.Results[1].Allowed {
							errs <- fmt.Errorf("refused batch: %v %+v", err, b.Results)
							return
						}
					}
					errs <- nil
				}()
			}
			for range 2 * workers {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			read := shared
			read.Hits = 0
			if r := do(t, s, false, now, read)[0]; r.Before != workers*rounds {
				t.Errorf("count %d after %d plain hits and only refused batches, want %d", r.Before, workers*rounds, workers*rounds)
			}
		})
	}
}

// metaTTL returns the seconds key has left in memcached (-1: none), with
// the meta command mg.
func metaTTL(t *testing.T, addr, key string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(conn, "mg %s t\r\n", key); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(line)[1:] {
		if v, ok := strings.CutPrefix(f, "t"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("mg %s: %q", key, line)
			}
			return n
		}
	}
	t.Fatalf("mg %s: %q, want a TTL", key, line)
	return 0
}

// TestExpiration checks the items' TTLs in memcached: the window (fixed)
// or the time until the state is idle, plus one second, plus the jitter;
// absolute beyond 30 days.
func TestExpiration(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	jittered := newStore(t, Config{Addrs: []string{srv.Addr}, ExpirationJitterMax: 10 * time.Second})
	now := time.Now()
	const day = 24 * time.Hour
	tests := []struct {
		name     string
		store    *Store
		op       limiter.Op
		min, max int
	}{
		{"fixed_minute", s, limiter.Op{Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute, Hits: 1}, 60, 61},
		{"fixed_jitter", jittered, limiter.Op{Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute, Hits: 1}, 60, 70},
		// Absolute expirations go through memcached's own coarse clock,
		// which can be a second or two off the wall clock: +3 s of slack.
		{"fixed_year_absolute", s, limiter.Op{Algorithm: rules.FixedWindow, Limit: 10, Window: 365 * day, Hits: 1}, 365*86400 - 5, 365*86400 + 3},
		// 10 tokens at one a second: full again in 10 s.
		{"token_bucket", s, limiter.Op{Algorithm: rules.TokenBucket, Limit: 60, Window: time.Minute, Hits: 10}, 9, 11},
		// Idle two windows after the current one started.
		{"sliding_window", s, limiter.Op{Algorithm: rules.SlidingWindow, Limit: 10, Window: time.Minute, Hits: 1}, 59, 121},
		{"sliding_log", s, limiter.Op{Algorithm: rules.SlidingLog, Limit: 10, Window: time.Minute, Hits: 1}, 59, 61},
		{"sliding_log_40_days", s, limiter.Op{Algorithm: rules.SlidingLog, Limit: 10, Window: 40 * day, Hits: 1}, 40*86400 - 5, 40*86400 + 3},
	}
	for _, tt := range tests {
		tt.op.Key = uniqueKey(t, tt.name)
		do(t, tt.store, false, now, tt.op)
		if got := metaTTL(t, srv.Addr, tt.op.Key); got < tt.min || got > tt.max {
			t.Errorf("%s: TTL %d s, want %d..%d", tt.name, got, tt.min, tt.max)
		}
	}
}

func TestExpirationValues(t *testing.T) {
	t.Parallel()
	s := &Store{}
	now := time.Now().Unix()
	tests := []struct {
		name     string
		give     int64
		min, max int64
	}{
		{"past", -5, 2, 2},
		{"zero", 0, 2, 2},
		{"one", 1, 2, 2},
		{"minute", 60, 61, 61},
		{"30_days_relative", maxRelativeExpiration - 1, maxRelativeExpiration, maxRelativeExpiration},
		{"31_days_absolute", 31 * 86400, now + 31*86400, now + 31*86400 + 3},
		{"huge_capped", math.MaxInt64 / 2, math.MaxInt32, math.MaxInt32},
	}
	for _, tt := range tests {
		if got := int64(s.expiration(tt.give)); got < tt.min || got > tt.max {
			t.Errorf("%s: expiration(%d) = %d, want %d..%d", tt.name, tt.give, got, tt.min, tt.max)
		}
	}
	base := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		idle int64
		want int64
	}{
		{base.UnixMicro() + 1, 1},
		{base.UnixMicro() + 1_000_000, 1},
		{base.UnixMicro() + 1_000_001, 2},
		{base.UnixMicro(), 0},
		{math.MinInt64, 0},
		{math.MaxInt64, (math.MaxInt64-base.UnixMicro()-1)/1_000_000 + 1},
	} {
		if got := secondsUntil(tt.idle, base); got != tt.want {
			t.Errorf("secondsUntil(%d) = %d, want %d", tt.idle, got, tt.want)
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		give Config
		want string // in the error
	}{
		{"no_servers", Config{}, "set Addrs (MEMCACHE_HOST_PORT) or SRV"},
		{"both_addrs_and_srv", Config{Addrs: []string{"127.0.0.1:11211"}, SRV: "_mc._tcp.example.com"}, "both Addrs"},
		{"addr_without_port", Config{Addrs: []string{"localhost"}}, "Addrs[0]"},
		{"addr_bad_port", Config{Addrs: []string{"127.0.0.1:11211", "127.0.0.1:x"}}, "Addrs[1]"},
		{"addr_empty_host", Config{Addrs: []string{":11211"}}, "empty host"},
		{"negative_timeout", Config{Addrs: []string{"127.0.0.1:1"}, Timeout: -1}, "Timeout"},
		{"negative_idle_conns", Config{Addrs: []string{"127.0.0.1:1"}, MaxIdleConns: -1}, "MaxIdleConns"},
		{"too_many_conns", Config{Addrs: []string{"127.0.0.1:1"}, Conns: 9}, "MEMCACHE_CONNECTIONS"},
		{"negative_max_conns", Config{Addrs: []string{"127.0.0.1:1"}, MaxConns: -1}, "MaxConns"},
		{"negative_max_waiting", Config{Addrs: []string{"127.0.0.1:1"}, MaxWaiting: -1}, "MaxWaiting"},
		{"negative_refresh", Config{SRV: "x", SRVRefresh: -time.Second}, "SRVRefresh"},
		{"negative_jitter", Config{Addrs: []string{"127.0.0.1:1"}, ExpirationJitterMax: -time.Second}, "ExpirationJitterMax"},
	}
	for _, tt := range tests {
		s, err := New(t.Context(), tt.give)
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: New(%+v) succeeded, want an error", tt.name, tt.give)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "memcached: ") {
			t.Errorf("%s: New(%+v) = %q, want a memcached error mentioning %q", tt.name, tt.give, err, tt.want)
		}
	}
	// The bounds' defaults, and MaxWaiting following MaxConns unless set.
	for _, tt := range []struct {
		give           Config
		conns, waiting int
	}{
		{Config{Addrs: []string{"127.0.0.1:1"}}, 128, 512},
		{Config{Addrs: []string{"127.0.0.1:1"}, MaxIdleConns: 64}, 128, 512},
		{Config{Addrs: []string{"127.0.0.1:1"}, MaxConns: 10}, 10, 40},
		{Config{Addrs: []string{"127.0.0.1:1"}, MaxConns: 10, MaxWaiting: 3}, 10, 3},
	} {
		got, err := tt.give.withDefaults()
		if err != nil || got.MaxConns != tt.conns || got.MaxWaiting != tt.waiting {
			t.Errorf("withDefaults(%+v) = MaxConns %d, MaxWaiting %d, %v; want %d, %d", tt.give, got.MaxConns, got.MaxWaiting, err, tt.conns, tt.waiting)
		}
	}
	// Validation reports every problem at once.
	_, err := New(t.Context(), Config{Addrs: []string{"a"}, Timeout: -1, MaxIdleConns: -1})
	for _, want := range []string{"Addrs[0]", "Timeout", "MaxIdleConns"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New with three problems = %v, want %s among them", err, want)
		}
	}
}

// TestNothingListens: New succeeds without memcached; the store is
// unhealthy, WaitStarted honours ctx, and Do fails with ErrUnavailable.
func TestNothingListens(t *testing.T) {
	t.Parallel()
	addr := harness.ClosedPort(t)
	s := newStore(t, Config{Addrs: []string{addr}, Timeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.WaitStarted(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitStarted = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("WaitStarted took %v after its ctx ended", took)
	}
	if s.Healthy() {
		t.Error("Healthy with nothing listening")
	}
	b := &limiter.Batch{Ops: []limiter.Op{{Key: "k", Limit: 1, Window: time.Minute, Hits: 1}}}
	if err := s.Do(t.Context(), b); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do = %v, want ErrUnavailable", err)
	}

	// A name that does not resolve is the same: unavailable, not a
	// failure of New.
	s = newStore(t, Config{Addrs: []string{"memcached.invalid:11211"}, Timeout: 200 * time.Millisecond})
	if err := s.Do(t.Context(), b); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do with a name that does not resolve = %v, want ErrUnavailable", err)
	}
	if s.Healthy() {
		t.Error("Healthy with a name that does not resolve")
	}
}

// TestSRV resolves the servers from an SRV record (a fake resolver), in a
// stable order, and follows the record when it changes.
func TestSRV(t *testing.T) {
	t.Parallel()
	a, b := harness.StartMemcached(t), harness.StartMemcached(t)
	records := func(srvs ...*harness.MemcachedServer) []*net.SRV {
		var out []*net.SRV
		for _, s := range srvs {
			host, port, _ := net.SplitHostPort(s.Addr)
			p, _ := strconv.Atoi(port)
			out = append(out, &net.SRV{Target: host + ".", Port: uint16(p)})
		}
		return out
	}
	answer := make(chan []*net.SRV, 1)
	answer <- records(a)
	var current []*net.SRV
	lookup := func(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
		if service != "" || proto != "" || name != "_memcache._tcp.test." {
			return "", nil, fmt.Errorf("lookup %q %q %q", service, proto, name)
		}
		select {
		case current = <-answer:
		default:
		}
		return name, current, nil
	}
	s, err := newWith(t.Context(), Config{SRV: "_memcache._tcp.test.", SRVRefresh: 20 * time.Millisecond}, deps{lookup: lookup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	do(t, s, false, now, limiter.Op{Key: uniqueKey(t, "on_a"), Limit: 5, Window: time.Minute, Hits: 1})
	if n := items(t, a); n != 1 {
		t.Fatalf("%d items on the SRV target, want 1", n)
	}
	answer <- records(b)
	harness.WaitFor(t, 5*time.Second, "the store followed the SRV record to the new server", func() bool {
		if items(t, b) > 0 {
			return true
		}
		do(t, s, false, now, limiter.Op{Key: uniqueKey(t, "on_b"), Limit: 5, Window: time.Minute, Hits: 1})
		return false
	})

	// An SRV answer's order is random: the list is sorted.
	got, err := resolveSRV(t.Context(), func(context.Context, string, string, string) (string, []*net.SRV, error) {
		return "", []*net.SRV{{Target: "b.example.", Port: 2}, {Target: "a.example.", Port: 1}}, nil
	}, "x")
	if err != nil || strings.Join(got, ",") != "a.example:1,b.example:2" {
		t.Errorf("resolveSRV = %q, %v; want the sorted targets", got, err)
	}
	// A record that does not resolve at start fails New.
	_, err = newWith(t.Context(), Config{SRV: "_none._tcp.test."}, deps{lookup: func(context.Context, string, string, string) (string, []*net.SRV, error) {
		return "", nil, errors.New("no such host")
	}})
	if err == nil || !strings.Contains(err.Error(), "MEMCACHE_SRV") {
		t.Errorf("New with an SRV that does not resolve = %v, want an error naming MEMCACHE_SRV", err)
	}
}

// items is the server's curr_items.
func items(t *testing.T, srv *harness.MemcachedServer) int {
	t.Helper()
	stats, err := srv.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(stats["curr_items"])
	return n
}

// TestTLS counts over TLS (memcached -Z) and refuses a server whose
// certificate it does not trust.
func TestTLS(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcachedTLS(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, TLS: srv.TLS.ClientConfig()})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, alg := range rules.Algorithms {
		op := limiter.Op{Key: uniqueKey(t, alg.String()), Algorithm: alg, Limit: 2, Window: time.Minute, Hits: 1}
		do(t, s, false, now, op)
		if r := do(t, s, false, now, op)[0]; !r.Allowed || r.Before != 1 || r.After != 2 {
			t.Errorf("%s over TLS, second hit: %+v, want admitted 1 -> 2", alg, r)
		}
	}
	untrusted := newStore(t, Config{Addrs: []string{srv.Addr}, TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	b := &limiter.Batch{Ops: []limiter.Op{{Key: "k", Limit: 1, Window: time.Minute, Hits: 1}}}
	if err := untrusted.Do(t.Context(), b); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do with an untrusted server certificate = %v, want ErrUnavailable", err)
	}
}

// TestBatchOpsSideBySide: the ops of a batch on keys apart go out side by
// side, pipelined on the server's connections, so that a request with
// several descriptors waits about one round trip; ops on one key stay in
// order, one round trip each. The proxy delays every reply by latency and
// counts the connections: never more than the pipelined ones.
func TestBatchOpsSideBySide(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	const latency = 50 * time.Millisecond
	tests := []struct {
		name         string
		allOrNothing bool
		keys         []string
		minTrips     int // round trips the batch waits, at least
		maxTrips     int // and at most
	}{
		{name: "apart", keys: []string{"a", "b", "c", "d"}, minTrips: 1, maxTrips: 1},
		{name: "apart_all_or_nothing", allOrNothing: true, keys: []string{"a", "b", "c", "d"}, minTrips: 1, maxTrips: 5},
		{name: "one_key", keys: []string{"a", "a", "a", "a"}, minTrips: 4, maxTrips: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			proxy := harness.StartProxy(t, srv.Addr)
			s := newStore(t, Config{Addrs: []string{proxy.Addr}, MaxConns: 16})
			if err := s.WaitStarted(t.Context()); err != nil {
				t.Fatal(err)
			}
			proxy.SetLatency(latency)
			var ops []limiter.Op
			names := map[string]string{}
			for _, k := range tt.keys {
				if names[k] == "" {
					names[k] = uniqueKey(t, k)
				}
				ops = append(ops, limiter.Op{Key: names[k], Limit: 10, Window: time.Hour, Hits: 1})
			}
			start := time.Now()
			r := do(t, s, tt.allOrNothing, time.Now(), ops...)
			took := time.Since(start)
			for i := range r {
				if want := uint64(i + 1); tt.name == "one_key" && r[i].After != want {
					t.Errorf("op %d: count %d, want %d: ops on one key run in order", i, r[i].After, want)
				}
			}
			if took < time.Duration(tt.minTrips)*latency || took >= time.Duration(tt.maxTrips+1)*latency {
				t.Errorf("a batch of %d ops took %v, want %d to %d round trips of %v", len(ops), took, tt.minTrips, tt.maxTrips, latency)
			}
			if got := proxy.Conns(); got > defaultConns {
				t.Errorf("%d connections after one batch of %d ops, want at most %d", got, len(ops), defaultConns)
			}
		})
	}
}
