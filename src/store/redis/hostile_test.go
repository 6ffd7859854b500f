package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// rawDo sends one command to the Redis that serves key, bypassing the store.
type rawDo func(ctx context.Context, key string, args ...string) (any, error)

// deployments runs f on a single Redis and on a Cluster, whose keys spread
// over three masters.
func deployments(t *testing.T, f func(t *testing.T, cfg Config, raw rawDo)) {
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartRedis(t, harness.RedisOptions{})
		f(t, Config{URL: srv.Addr}, func(ctx context.Context, _ string, args ...string) (any, error) {
			return srv.Do(ctx, args...)
		})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := harness.StartRedisCluster(t, harness.RedisOptions{})
		f(t, Config{Type: TypeCluster, URL: c.URL}, func(ctx context.Context, key string, args ...string) (any, error) {
			m, err := c.MasterFor(ctx, key)
			if err != nil {
				return nil, err
			}
			return m.Do(ctx, args...)
		})
	})
}

// modes are the two ways a batch is applied: INCRBY or one script per op,
// and all-or-nothing scripts.
var modes = []struct {
	name         string
	allOrNothing bool
}{{"each", false}, {"all_or_nothing", true}}

// TestSaturation: no hit, however large, wraps, resets or fails a count.
// A fixed window driven to the top of Redis's integer range stays over its
// limit without an error or a health change, and for every algorithm a hit
// of limiter.MaxHits is decided exactly as the pure function decides it.
func TestSaturation(t *testing.T) {
	t.Parallel()
	deployments(t, func(t *testing.T, cfg Config, raw rawDo) {
		cfg.scriptClock = true
		// The probe would mark the store up again; only round trips may
		// change its health here.
		cfg.HealthCheckActiveConnection, cfg.HealthCheckInterval = true, time.Hour
		s := newStore(t, cfg)
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_700_000_000, 0)

		t.Run("fixed_window_near_max_int64", func(t *testing.T) {
			for _, m := range modes {
				key := "saturate_" + m.name
				const start = math.MaxInt64 - 7
				if _, err := raw(t.Context(), key, "SET", key, strconv.FormatInt(start, 10)); err != nil {
					t.Fatal(err)
				}
				for i, hits := range []uint64{limiter.MaxHits, 1, limiter.MaxHits, 0, 3} {
					op := limiter.Op{Key: key, Limit: 10, Window: time.Hour, Hits: hits}
					b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}, AllOrNothing: m.allOrNothing}
					if err := s.Do(t.Context(), b); err != nil {
						t.Fatalf("%s: hit %d (%d hits) on a count near 2^63: %v", m.name, i, hits, err)
					}
					if r := b.Results[0]; r.Allowed || r.After <= op.Limit || r.Before <= op.Limit || r.Remaining != 0 {
						t.Errorf("%s: hit %d (%d hits): %+v, want over the limit", m.name, i, hits, r)
					}
					if hits == limiter.MaxHits && !m.allOrNothing && b.Results[0].After != math.MaxInt64 {
						t.Errorf("%s: hit %d: After = %d, want the count saturated at %d", m.name, i, b.Results[0].After, int64(math.MaxInt64))
					}
					if !s.Healthy() {
						t.Fatalf("%s: hit %d: a saturated count marked the store unhealthy", m.name, i)
					}
				}
				v, err := raw(t.Context(), key, "GET", key)
				if n, perr := strconv.ParseInt(fmt.Sprint(v), 10, 64); err != nil || perr != nil || n < start {
					t.Errorf("%s: GET %s = %v, %v; want a count of at least %d: never wrapped or reset", m.name, key, v, err, int64(start))
				}
			}

			// decideLua records a fixed window's hits only when admitted, so
			// the store never has it INCRBY past the top; called without
			// all-or-nothing, as a fixed window counts in the anchor, it
			// saturates too.
			key := "saturate_script"
			if _, err := raw(t.Context(), key, "SET", key, strconv.FormatInt(math.MaxInt64-7, 10)); err != nil {
				t.Fatal(err)
			}
			hits := strconv.FormatUint(limiter.MaxHits, 10)
			reply, err := raw(t.Context(), key, "EVAL", decideLua, "1", key, "", "0", "0", "10", "10", "3600000000", hits, "3600")
			vals, _ := reply.([]any)
			var after int64
			if len(vals) == 1+resultsPerOp {
				after, _ = vals[3].(int64)
			}
			if err != nil || len(vals) != 1+resultsPerOp || vals[1] != int64(0) || after <= 10 {
				t.Errorf("decideLua of %s hits on a count near 2^63 = %v, %v; want recorded, over the limit", hits, reply, err)
			}
		})

		for _, alg := range rules.Algorithms {
			for _, m := range modes {
				t.Run(fmt.Sprintf("%s/%s", alg, m.name), func(t *testing.T) {
					var model pure
					do := func(op limiter.Op, at time.Time) limiter.Result {
						t.Helper()
						b := &limiter.Batch{Now: at, Ops: []limiter.Op{op}, AllOrNothing: m.allOrNothing}
						if err := s.Do(t.Context(), b); err != nil {
							t.Fatalf("%d hits: %v", op.Hits, err)
						}
						prev := model
						want := model.apply(at, op)
						if m.allOrNothing && !want.Allowed {
							model = prev // nothing recorded, fixed windows included
						}
						if b.Results[0] != want {
							t.Fatalf("%d hits: got %+v, the pure function gives %+v", op.Hits, b.Results[0], want)
						}
						return b.Results[0]
					}

					// A spent key stays spent after a hit of MaxHits.
					spent := limiter.Op{Key: fmt.Sprintf("spent_%s_%s", alg, m.name), Algorithm: alg, Limit: 5, Window: time.Hour}
					for i, hits := range []uint64{5, limiter.MaxHits, 1, limiter.MaxHits, 0, 1} {
						spent.Hits = hits
						r := do(spent, now.Add(time.Duration(i)*time.Second))
						if i > 0 && (r.Remaining != 0 || hits > 0 && r.Allowed) {
							t.Fatalf("hit %d (%d hits) on a spent key: %+v, want it still spent", i, hits, r)
						}
					}

					// A hit of MaxHits fills a key whose capacity is MaxHits.
					if alg == rules.SlidingLog {
						return // its limit is at most rules.MaxSlidingLog
					}
					model = pure{}
					full := limiter.Op{Key: fmt.Sprintf("full_%s_%s", alg, m.name), Algorithm: alg, Limit: limiter.MaxHits, Window: time.Hour}
					for i, hits := range []uint64{limiter.MaxHits, 1, 0} {
						full.Hits = hits
						if r := do(full, now); i < 2 && r.Allowed != (i == 0) {
							t.Fatalf("hit %d (%d hits) on a key of capacity MaxHits: %+v", i, hits, r)
						}
					}
					if alg != rules.TokenBucket {
						return
					}
					// A bucket of MaxHits tokens refilled one an hour: filled,
					// its TAT lies past 2^63 µs and saturates.
					model = pure{}
					huge := limiter.Op{Key: "huge_" + m.name, Algorithm: alg, Limit: 1, Burst: limiter.MaxHits, Window: time.Hour}
					for i, hits := range []uint64{limiter.MaxHits, 1, 0} {
						huge.Hits = hits
						do(huge, now.Add(time.Duration(i)*time.Second))
					}
				})
			}
		}
	})
}

// TestDataErrors: a key holding what the op does not expect (another
// type, a value that is not a counter) fails that request with
// limiter.ErrData, never ErrUnavailable. It leaves the store healthy and
// the request that shared its pipeline answered.
func TestDataErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		op   limiter.Op
		aon  bool
		set  []string // writes the bad value; "KEY" stands for the op's key
	}{
		{name: "fixed_window_on_a_list", op: limiter.Op{Hits: 1}, set: []string{"LPUSH", "KEY", "x"}},
		{name: "fixed_window_read_on_a_list", op: limiter.Op{Hits: 0}, set: []string{"LPUSH", "KEY", "x"}},
		{name: "fixed_window_on_text", op: limiter.Op{Hits: 1}, set: []string{"SET", "KEY", "abc"}},
		{name: "fixed_window_read_on_text", op: limiter.Op{Hits: 0}, set: []string{"SET", "KEY", "abc"}},
		{name: "fixed_window_all_or_nothing_on_a_list", op: limiter.Op{Hits: 1}, aon: true, set: []string{"LPUSH", "KEY", "x"}},
		{name: "sliding_window_on_a_list", op: limiter.Op{Algorithm: rules.SlidingWindow, Hits: 1}, set: []string{"LPUSH", "KEY", "x"}},
		{name: "sliding_window_on_text", op: limiter.Op{Algorithm: rules.SlidingWindow, Hits: 1}, set: []string{"SET", "KEY", "1:2:3"}},
		{name: "sliding_window_all_or_nothing_on_text", op: limiter.Op{Algorithm: rules.SlidingWindow, Hits: 1}, aon: true, set: []string{"SET", "KEY", "1:2:3"}},
		{name: "sliding_log_on_a_string", op: limiter.Op{Algorithm: rules.SlidingLog, Hits: 1}, set: []string{"SET", "KEY", "1"}},
		{name: "sliding_log_on_a_list", op: limiter.Op{Algorithm: rules.SlidingLog, Hits: 1}, set: []string{"RPUSH", "KEY", "abc"}},
		{name: "sliding_log_all_or_nothing_on_a_string", op: limiter.Op{Algorithm: rules.SlidingLog, Hits: 1}, aon: true, set: []string{"SET", "KEY", "123456789"}},
		{name: "token_bucket_on_text", op: limiter.Op{Algorithm: rules.TokenBucket, Hits: 1}, set: []string{"SET", "KEY", "abc"}},
		{name: "token_bucket_on_a_decimal_tat", op: limiter.Op{Algorithm: rules.TokenBucket, Hits: 1}, set: []string{"SET", "KEY", "1700000000000000"}},
		{name: "token_bucket_on_a_hash", op: limiter.Op{Algorithm: rules.TokenBucket, Hits: 1}, aon: true, set: []string{"HSET", "KEY", "f", "v"}},
	}
	deployments(t, func(t *testing.T, cfg Config, raw rawDo) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				key := "data_" + tt.name
				bad := tt.op
				bad.Key, bad.Limit, bad.Window = key, 10, time.Hour
				stored := stateKey(&bad)
				set := append([]string(nil), tt.set...)
				set[1] = stored
				if _, err := raw(t.Context(), stored, set...); err != nil {
					t.Fatal(err)
				}
				good := limiter.Op{Key: "data_good_" + tt.name, Limit: 10, Window: time.Hour, Hits: 1}

				// Hold the pipeline until both requests are queued, so
				// that they share it. The probe would mark the store up
				// again: only round trips may change its health here.
				c := cfg
				c.PipelineWindow, c.PipelineLimit = 10*time.Second, requestCommands(bad, tt.aon)+requestCommands(good, tt.aon)
				c.HealthCheckActiveConnection, c.HealthCheckInterval = true, time.Hour
				s := newStore(t, c)
				if err := s.WaitStarted(t.Context()); err != nil {
					t.Fatal(err)
				}
				// Load the script first: NOSCRIPT would take a round trip.
				for _, k := range []string{stored, good.Key} {
					for _, src := range scriptSources {
						if _, err := raw(t.Context(), k, "SCRIPT", "LOAD", src); err != nil {
							t.Fatal(err)
						}
					}
				}
				before, _ := s.Counters()
				errs := make(chan error, 2)
				for _, op := range []limiter.Op{bad, good} {
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						errs <- s.Do(ctx, &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{op}, AllOrNothing: tt.aon})
					}()
				}
				var errBad error
				for range 2 {
					if err := <-errs; err != nil {
						if errBad != nil {
							t.Fatalf("both requests failed: %v; %v", errBad, err)
						}
						errBad = err
					}
				}
				if !errors.Is(errBad, limiter.ErrData) || errors.Is(errBad, limiter.ErrUnavailable) {
					t.Errorf("Do on %s = %v, want ErrData and not ErrUnavailable", tt.name, errBad)
				}
				if !s.Healthy() {
					t.Error("a key of the wrong kind marked the store unhealthy")
				}
				if after, _ := s.Counters(); cfg.Type != TypeCluster && after-before != 1 {
					t.Errorf("the two requests took %d round trips, want 1: they did not share a pipeline", after-before)
				}
			})
		}
	})
}

// requestCommands is the number of Redis commands of a one-op request.
func requestCommands(op limiter.Op, aon bool) int {
	if op.Algorithm == rules.FixedWindow && !aon && op.Hits > 0 {
		return 2 // INCRBY, EXPIRE
	}
	return 1
}

// TestServerErrors: an error reply about Redis's state is an outage, even
// when it comes from inside a script.
func TestServerErrors(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, HealthCheckActiveConnection: true, HealthCheckInterval: time.Hour})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A replica refuses writes with READONLY; port 1 has no master, so it
	// stays a replica of nothing.
	if _, err := srv.Do(t.Context(), "REPLICAOF", "127.0.0.1", "1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = srv.Do(context.Background(), "REPLICAOF", "NO", "ONE") })
	for _, alg := range rules.Algorithms {
		err := hitOnce(t.Context(), s, "readonly_"+alg.String(), alg)
		if !errors.Is(err, limiter.ErrUnavailable) || errors.Is(err, limiter.ErrData) {
			t.Errorf("%s on a read-only replica: %v, want ErrUnavailable and not ErrData", alg, err)
		}
	}
	if s.Healthy() {
		t.Error("Healthy() = true after READONLY")
	}
}

// replyError is an error reply as go-redis reports it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestIsDataError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		give string
		want bool
	}{
		{"WRONGTYPE Operation against a key holding the wrong kind of value", true},
		{"ERR value is not an integer or out of range", true},
		{"ERR increment or decrement would overflow", true},
		// Redis 7, from inside a script.
		{"WRONGTYPE Operation against a key holding the wrong kind of value script: e4b6, on @user_script:30.", true},
		{"ERR value is not an integer or out of range script: e4b6, on @user_script:1.", true},
		{"ERR user_script:57: attempt to compare number with nil script: a21d, on @user_script:57.", true},
		{"READONLY You can't write against a read only replica. script: 897a, on @user_script:1.", false},
		{"OOM command not allowed when used memory > 'maxmemory'. script: 897a, on @user_script:1.", false},
		{"ERR Script killed by user with SCRIPT KILL... script: 694a, on @user_script:1.", false},
		// Redis 6 wraps what a script raised.
		{"ERR Error running script (call to f_e4b6): @user_script:30: @user_script: 30: -WRONGTYPE Operation against a key holding the wrong kind of value", true},
		{"ERR Error running script (call to f_a21d): @user_script:57: user_script:57: attempt to compare number with nil", true},
		{"ERR Error running script (call to f_897a): @user_script:1: @user_script: 1: -READONLY You can't write against a read only replica.", false},
		{"ERR Error running script (call to f_694a): @user_script:1: Script killed by user with SCRIPT KILL...", false},
		// Redis cannot serve.
		{"LOADING Redis is loading the dataset in memory", false},
		{"READONLY You can't write against a read only replica.", false},
		{"CLUSTERDOWN The cluster is down", false},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", false},
		{"NOAUTH Authentication required.", false},
		{"WRONGPASS invalid username-password pair or user is disabled.", false},
		{"NOPERM this user has no permissions to run the 'evalsha' command", false},
		{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", false},
		{"TRYAGAIN Multiple keys request during rehashing of slot", false},
		{"NOSCRIPT No matching script. Please use EVAL.", false},
		{"ERR max number of clients reached", false},
		{"ERR unknown command 'evalsha'", false},
	}
	for _, tt := range tests {
		if got := isDataError(replyError(tt.give)); got != tt.want {
			t.Errorf("isDataError(%q) = %v, want %v", tt.give, got, tt.want)
		}
	}
	if isDataError(errors.New("WRONGTYPE from a transport, not a reply")) {
		t.Error("isDataError of an error that is no Redis reply = true")
	}
}

// TestOutOfMemoryIsAnAnswer is issue 24's case 2, its part on one write: a
// Redis at maxmemory with noeviction refuses every write that needs memory
// with OOM. That is an answer about the request (ErrOverloaded:
// ResourceExhausted, never OK), not an outage: it trips no breaker, even
// one that opens at the first failure, and health stays; reads are still
// served.
func TestOutOfMemoryIsAnAnswer(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, HealthCheckActiveConnection: true, HealthCheckInterval: time.Hour,
		Breaker: breaker.Config{Failures: 1}})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := hitOnce(t.Context(), s, "before_full", rules.FixedWindow); err != nil {
		t.Fatal(err)
	}
	// 2 MiB of data, then a maxmemory below it: Redis is over it for good
	// (filling up to maxmemory leaves room for small writes, give or take
	// the clients' buffers).
	for i := range 8 {
		if _, err := srv.Do(t.Context(), "SET", fmt.Sprint("fill_", i), strings.Repeat("x", 256<<10)); err != nil {
			t.Fatal(err)
		}
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1mb"}} {
		if _, err := srv.Do(t.Context(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, alg := range rules.Algorithms {
		for _, key := range []string{"before_full", "new"} {
			err := hitOnce(t.Context(), s, key+"_"+alg.String(), alg)
			if !errors.Is(err, limiter.ErrOverloaded) || errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("%s, %s at maxmemory: %v, want ErrOverloaded and not ErrUnavailable", alg, key, err)
			}
		}
	}
	read := &limiter.Batch{Now: time.Now(), Ops: []limiter.Op{{Key: "before_full", Limit: 5, Window: time.Hour}}}
	if err := s.Do(t.Context(), read); err != nil || read.Results[0].Before != 1 {
		t.Errorf("a read at maxmemory: %+v, %v; want the count, 1", read.Results[0], err)
	}
	if st := s.Breakers(); st.Trips != 0 || !s.Healthy() {
		t.Errorf("breakers %+v, healthy %v; want none tripped, healthy", st, s.Healthy())
	}
}

func TestIsOOM(t *testing.T) {
	t.Parallel()
	for give, want := range map[string]bool{
		"OOM command not allowed when used memory > 'maxmemory'.":                                                        true,
		"OOM command not allowed when used memory > 'maxmemory'. script: 897a, on @user_script:1.":                       true,
		"ERR Error running script (call to f_897a): @user_script:1: @user_script: 1: -OOM command not allowed when used": true,
		"ERR value is not an integer or out of range":                                                                    false,
		"LOADING Redis is loading the dataset in memory":                                                                 false,
	} {
		if got := isOOM(replyError(give)); got != want {
			t.Errorf("isOOM(%q) = %v, want %v", give, got, want)
		}
	}
	if isOOM(errors.New("OOM but not a reply")) {
		t.Error("isOOM of a transport error = true")
	}
}

// TestDataErrorKeepsOtherAnswers: in a batch that is not AllOrNothing, the
// op on a key of another type fails the batch with ErrData, and the ops
// after it, which Redis applied in the same pipeline, have their Results
// (the write-behind flush relies on it not to send them twice).
func TestDataErrorKeepsOtherAnswers(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{SocketType: "tcp", URL: srv.Addr})
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer raw.Close()
	if err := raw.RPush(t.Context(), "keep_bad", "x").Err(); err != nil {
		t.Fatal(err)
	}
	b := &limiter.Batch{Now: time.Now()}
	for _, k := range []string{"keep_a", "keep_bad", "keep_b", "keep_c"} {
		b.Ops = append(b.Ops, limiter.Op{Key: k, Limit: 10, Window: time.Hour, Hits: 3})
	}
	b.Results = make([]limiter.Result, len(b.Ops))
	b.Results[1].ResetAfter = -1
	if err := s.Do(t.Context(), b); !errors.Is(err, limiter.ErrData) {
		t.Fatalf("Do = %v, want ErrData", err)
	}
	for i, want := range []uint64{3, 0, 3, 3} {
		if b.Results[i].After != want {
			t.Errorf("Results[%d].After = %d, want %d", i, b.Results[i].After, want)
		}
	}
	if b.Results[1].ResetAfter != -1 {
		t.Errorf("the failed op's Result was written: %+v", b.Results[1])
	}
}
