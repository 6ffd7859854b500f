package mcclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimit/harness"
)

// testClient returns a client of srv (more servers: sharded) with cfg's
// zero fields defaulted, closed in t.Cleanup. Its dial counts the writes
// made on its connections into writes, when not nil.
func testClient(t testing.TB, cfg Config, writes *atomic.Int64, addrs ...string) *Client {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 1024
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: cfg.Timeout}
		cfg.Dial = d.DialContext
	}
	if writes != nil {
		dial := cfg.Dial
		cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c, writes: writes}, nil
		}
	}
	c := New(cfg)
	if err := c.SetServers(addrs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// connCounter counts the connections open through the dial it wraps.
type connCounter struct{ open atomic.Int64 }

func (c *connCounter) wrap(dial DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.open.Add(1)
		return &closeCounted{Conn: conn, c: c}, nil
	}
}

type closeCounted struct {
	net.Conn
	c    *connCounter
	once sync.Once
}

func (cc *closeCounted) Close() error {
	cc.once.Do(func() { cc.c.open.Add(-1) })
	return cc.Conn.Close()
}

// TestClientCommands checks every command's answers against a real
// memcached, misses and conflicts included.
func TestClientCommands(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	c := testClient(t, Config{Conns: 2}, nil, srv.Addr)
	ctx := t.Context()

	if _, err := c.Incr(ctx, "cmd_n", 1); !errors.Is(err, ErrCacheMiss) {
		t.Fatalf("incr of a missing key: %v, want ErrCacheMiss", err)
	}
	if err := c.Add(ctx, "cmd_n", []byte("5"), 60); err != nil {
		t.Fatalf("add: %v", err)
	}
	if err := c.Add(ctx, "cmd_n", []byte("7"), 60); !errors.Is(err, ErrNotStored) {
		t.Fatalf("add of an existing key: %v, want ErrNotStored", err)
	}
	if n, err := c.Incr(ctx, "cmd_n", 3); err != nil || n != 8 {
		t.Fatalf("incr = %d, %v, want 8", n, err)
	}
	if n, err := c.Decr(ctx, "cmd_n", 10); err != nil || n != 0 {
		t.Fatalf("decr below 0 = %d, %v, want 0", n, err)
	}
	if n, err := c.Incr(ctx, "cmd_n", 1<<63); err != nil || n != 1<<63 {
		t.Fatalf("incr by 2^63 = %d, %v", n, err)
	}

	if _, _, err := c.Gets(ctx, "cmd_state"); !errors.Is(err, ErrCacheMiss) {
		t.Fatalf("gets of a missing key: %v, want ErrCacheMiss", err)
	}
	state := []byte("a value\r\nwith CRLF inside")
	if err := c.Add(ctx, "cmd_state", state, 60); err != nil {
		t.Fatal(err)
	}
	v, casID, err := c.Gets(ctx, "cmd_state")
	if err != nil || string(v) != string(state) {
		t.Fatalf("gets = %q, %v, want %q", v, err, state)
	}
	if err := c.CAS(ctx, "cmd_state", []byte("two"), 60, casID); err != nil {
		t.Fatalf("cas: %v", err)
	}
	if err := c.CAS(ctx, "cmd_state", []byte("three"), 60, casID); !errors.Is(err, ErrExists) {
		t.Fatalf("cas with a stale unique: %v, want ErrExists", err)
	}
	if err := c.CAS(ctx, "cmd_gone", []byte("x"), 60, casID); !errors.Is(err, ErrCacheMiss) {
		t.Fatalf("cas of a missing key: %v, want ErrCacheMiss", err)
	}
	if v, _, err := c.Gets(ctx, "cmd_state"); err != nil || string(v) != "two" {
		t.Fatalf("gets after cas = %q, %v, want two", v, err)
	}

	// memcached refuses incr on a value that is not a number: an answer,
	// and the connection goes on.
	var ce *ClientError
	if _, err := c.Incr(ctx, "cmd_state", 1); !errors.As(err, &ce) {
		t.Fatalf("incr of a non-number: %v, want a ClientError", err)
	}
	// An item over memcached's 1 MiB limit: SERVER_ERROR, data swallowed.
	var se *ServerError
	if err := c.Add(ctx, "cmd_big", make([]byte, 2<<20), 60); !errors.As(err, &se) {
		t.Fatalf("add of 2 MiB: %v, want a ServerError", err)
	}
	for _, key := range []string{"", "has space", "ctl\x01", string(make([]byte, 251))} {
		if _, err := c.Incr(ctx, key, 1); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("incr(%q): %v, want ErrMalformedKey", key, err)
		}
	}
	if n, err := c.Incr(ctx, "cmd_n", 1); err != nil || n != 1<<63+1 {
		t.Fatalf("incr after the refusals = %d, %v: the connection is out of step", n, err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

// TestClientPipelineOrder hammers one connection from many goroutines,
// each on its own counter with its own deltas and its own state item, and
// checks that every answer is its request's: answers matched out of order
// would show as wrong counts or values. It also checks that the requests
// were pipelined: fewer writes than requests.
func TestClientPipelineOrder(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	var writes atomic.Int64
	c := testClient(t, Config{Conns: 1}, &writes, srv.Addr)
	const workers, rounds = 32, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := "order_" + strconv.Itoa(w)
			delta := uint64(w + 1)
			if err := c.Add(t.Context(), key, []byte("0"), 60); err != nil {
				t.Error(err)
				return
			}
			state := "state_" + strconv.Itoa(w)
			if err := c.Add(t.Context(), state, []byte(state), 60); err != nil {
				t.Error(err)
				return
			}
			for i := range uint64(rounds) {
				n, err := c.Incr(t.Context(), key, delta)
				if err != nil || n != (i+1)*delta {
					t.Errorf("worker %d round %d: incr = %d, %v, want %d", w, i, n, err, (i+1)*delta)
					return
				}
				if i%10 == 0 {
					v, _, err := c.Gets(t.Context(), state)
					if err != nil || string(v) != state {
						t.Errorf("worker %d: gets = %q, %v, want %q", w, v, err, state)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	requests := int64(workers * (2 + rounds + rounds/10))
	if w := writes.Load(); w >= requests {
		t.Errorf("%d writes for %d requests: nothing was pipelined", w, requests)
	} else {
		t.Logf("%d writes for %d requests", w, requests)
	}
}

// TestClientPicksAsGomemcache checks that a key goes to the server
// gomemcache's ServerList picks (anchor instances share the servers
// during a rolling upgrade), for a few lists and many keys.
func TestClientPicksAsGomemcache(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 5; n++ {
		addrs := make([]string, n)
		for i := range addrs {
			addrs[i] = "127.0.0." + strconv.Itoa(i+1) + ":11211"
		}
		var sl memcache.ServerList
		if err := sl.SetServers(addrs...); err != nil {
			t.Fatal(err)
		}
		c := New(Config{})
		if err := c.SetServers(addrs...); err != nil {
			t.Fatal(err)
		}
		for i := range 2000 {
			key := "domain_key_value_" + strconv.Itoa(i*7919) + "_" + strconv.Itoa(1700000000+i)
			if i%100 == 0 {
				key = string(make([]byte, 300)) + key // longer than the 256 bytes hashed
			}
			want, err := sl.PickServer(key)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.AddrOf(key)
			if err != nil || got != want.String() {
				t.Fatalf("%d servers: addrOf(%q) = %q, %v, want %q", n, key, got, err, want)
			}
		}
		_ = c.Close()
	}
}

// TestClientShards checks that requests reach the server of their key.
func TestClientShards(t *testing.T) {
	t.Parallel()
	a, b := harness.StartMemcached(t), harness.StartMemcached(t)
	c := testClient(t, Config{Conns: 2}, nil, a.Addr, b.Addr)
	for i := range 50 {
		if err := c.Add(t.Context(), "shard_"+strconv.Itoa(i), []byte("1"), 60); err != nil {
			t.Fatal(err)
		}
	}
	for _, srv := range []*harness.MemcachedServer{a, b} {
		stats, err := srv.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(stats["curr_items"]); n == 0 || n == 50 {
			t.Errorf("%s holds %d of 50 items, want a share", srv.Addr, n)
		}
		if err := c.PingAddr(t.Context(), srv.Addr); err != nil {
			t.Errorf("pingAddr(%s): %v", srv.Addr, err)
		}
	}
	if err := c.PingAddr(t.Context(), "127.0.0.1:1"); !errors.Is(err, ErrNoServers) {
		t.Errorf("pingAddr of a server not in the list: %v, want ErrNoServers", err)
	}
}

// TestClientOutage kills memcached with requests under way, then freezes
// it: the requests under way fail, fast when killed and within Timeout
// when frozen (the late connection is closed); requests meanwhile fail
// without waiting; and the client works again once memcached is back.
func TestClientOutage(t *testing.T) {
	srv := harness.StartMemcached(t)
	const timeout = 300 * time.Millisecond
	goroutines := runtime.NumGoroutine()
	c := New(Config{Dial: (&net.Dialer{Timeout: timeout}).DialContext, Conns: 2, MaxQueue: 1024, Timeout: timeout})
	if err := c.SetServers(srv.Addr); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(t.Context(), "outage_n", []byte("0"), 60); err != nil {
		t.Fatal(err)
	}
	// load keeps 16 workers incrementing until stop, counting answers in
	// okN and failures in failN; wait returns both once they stopped.
	var okN, failN atomic.Int64
	load := func(stop <-chan struct{}) (wait func() (ok, failed int)) {
		okN.Store(0)
		failN.Store(0)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for i := 0; i < 100_000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					_, err := c.Incr(t.Context(), "outage_n", 1)
					if took := time.Since(start); took > timeout+500*time.Millisecond {
						t.Errorf("incr took %v, want within %v", took, timeout)
					}
					if err != nil {
						failN.Add(1)
						time.Sleep(time.Millisecond) // pacing: no spin on fast failures
					} else {
						okN.Add(1)
					}
				}
			})
		}
		return func() (int, int) { wg.Wait(); return int(okN.Load()), int(failN.Load()) }
	}

	for _, outage := range []struct {
		name       string
		start, end func() error
	}{
		{"killed", srv.Stop, srv.Start},
		{"frozen", srv.Freeze, srv.Thaw},
	} {
		stop := make(chan struct{})
		wait := load(stop)
		harness.WaitFor(t, 5*time.Second, outage.name+": the load answered", func() bool { return okN.Load() >= 16 })
		if err := outage.start(); err != nil {
			t.Fatal(err)
		}
		// Every worker's request failed once: the connections are gone.
		harness.WaitFor(t, 5*time.Second, outage.name+": the load failed", func() bool { return failN.Load() >= 16 })
		// While down, a request fails without waiting for a Timeout:
		// the connections are closed and the next dials back off.
		start := time.Now()
		_, err := c.Incr(t.Context(), "outage_n", 1)
		if err == nil {
			t.Errorf("%s: incr succeeded", outage.name)
		}
		if outage.name == "killed" {
			if took := time.Since(start); took > timeout/2 {
				t.Errorf("%s: incr took %v to fail", outage.name, took)
			}
		}
		if err := outage.end(); err != nil {
			t.Fatal(err)
		}
		if outage.name == "killed" {
			if err := c.Add(t.Context(), "outage_n", []byte("0"), 60); err != nil && !errors.Is(err, ErrNotStored) {
				t.Logf("add after restart: %v", err)
			}
		}
		harness.WaitFor(t, 5*time.Second, outage.name+": answering again", func() bool {
			_, err := c.Incr(t.Context(), "outage_n", 1)
			if errors.Is(err, ErrCacheMiss) {
				_ = c.Add(t.Context(), "outage_n", []byte("0"), 60)
			}
			return err == nil
		})
		close(stop)
		ok, failed := wait()
		t.Logf("%s: %d incr answered, %d failed", outage.name, ok, failed)
		if failed == 0 {
			t.Errorf("%s: no request failed", outage.name)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	harness.CheckGoroutines(t, goroutines)
}

// TestClientDeadline freezes memcached: a request whose ctx ends first
// returns ctx's error at its deadline, long before Timeout; the
// connection is closed at Timeout and its requests fail.
func TestClientDeadline(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	const timeout = 400 * time.Millisecond
	c := testClient(t, Config{Conns: 1, Timeout: timeout}, nil, srv.Addr)
	if err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Thaw() }()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.Incr(ctx, "deadline_n", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("incr past its deadline: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > timeout/2 {
		t.Errorf("incr returned after %v, want at its 30ms deadline", took)
	}
	start = time.Now()
	_, err := c.Incr(t.Context(), "deadline_n", 1)
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("incr without deadline on a frozen server: %v, want a late answer", err)
	}
	if took := time.Since(start); took > timeout+500*time.Millisecond {
		t.Errorf("incr on a frozen server failed after %v, want within %v", took, timeout)
	}
}

// TestClientQueueBound freezes memcached and fills its queue: one more
// request fails at once with ErrQueueFull, and is counted.
func TestClientQueueBound(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	c := testClient(t, Config{Conns: 2, MaxQueue: 4, Timeout: 2 * time.Second}, nil, srv.Addr)
	if err := c.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { _, _ = c.Incr(t.Context(), "queue_"+strconv.Itoa(i), 1) })
	}
	harness.WaitFor(t, 2*time.Second, "4 requests queued", func() bool {
		c.mu.RLock()
		defer c.mu.RUnlock()
		return c.servers[0].queued.Load() == 4
	})
	start := time.Now()
	if _, err := c.Incr(t.Context(), "queue_more", 1); !errors.Is(err, ErrQueueFull) {
		t.Errorf("incr beyond the queue: %v, want ErrQueueFull", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("shed after %v, want at once", took)
	}
	if n := c.Shed(); n != 1 {
		t.Errorf("shed = %d, want 1", n)
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// TestClientCloseDrains closes the client with requests under way on a
// slow (frozen, then thawed) server: they get their answers, and requests
// after close fail.
func TestClientCloseDrains(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	c := testClient(t, Config{Conns: 1, Timeout: 2 * time.Second}, nil, srv.Addr)
	if err := c.Add(t.Context(), "drain_n", []byte("0"), 60); err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var answered atomic.Int64
	for range 8 {
		wg.Go(func() {
			if _, err := c.Incr(t.Context(), "drain_n", 1); err != nil {
				t.Errorf("incr under way at close: %v", err)
				return
			}
			answered.Add(1)
		})
	}
	harness.WaitFor(t, 2*time.Second, "8 requests queued", func() bool {
		return c.servers[0].queued.Load() == 8
	})
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	harness.WaitFor(t, 2*time.Second, "Close under way", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closed
	})
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	<-closed
	wg.Wait()
	if n := answered.Load(); n != 8 {
		t.Errorf("%d of 8 requests answered", n)
	}
	if _, err := c.Incr(t.Context(), "drain_n", 1); !errors.Is(err, ErrClientClosed) {
		t.Errorf("incr after close: %v, want ErrClientClosed", err)
	}
}

// TestParseUint checks the allocation-free number parser.
func TestParseUint(t *testing.T) {
	tests := []struct {
		give string
		want uint64
		ok   bool
	}{
		{"0", 0, true},
		{"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 0, false},
		{"", 0, false},
		{"12a", 0, false},
		{" 1", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseUint([]byte(tt.give))
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseUint(%q) = %d, %v, want %d, %v", tt.give, got, ok, tt.want, tt.ok)
		}
	}
}

// benchIdleConns is gomemcache's MaxIdleConns in the benchmarks that
// compare it: one idle connection per concurrent client, so that none
// dials.
const benchIdleConns = 64

// BenchmarkClientIncr compares gomemcache and this client on the store's
// hot command (incr on 10,000 keys, 64 concurrent callers), on one
// memcached, in the same run: ns/op is the throughput, cpu-ns/op the CPU
// of this process (callers and client) per incr.
func BenchmarkClientIncr(b *testing.B) {
	srv := harness.StartMemcached(b)
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "bench_client_" + strconv.Itoa(i)
	}
	seed := memcache.New(srv.Addr)
	for _, k := range names {
		if err := seed.Set(&memcache.Item{Key: k, Value: []byte("0")}); err != nil {
			b.Fatal(err)
		}
	}
	_ = seed.Close()
	run := func(b *testing.B, incr func(key string) error) {
		var next atomic.Uint64
		cpu := srv.StartCPU(b.Context())
		b.ReportAllocs()
		b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := incr(names[next.Add(1)%keys]); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		cpu.Report(b)
	}
	b.Run("gomemcache", func(b *testing.B) {
		gm := memcache.New(srv.Addr)
		gm.MaxIdleConns = benchIdleConns
		defer gm.Close()
		run(b, func(key string) error { _, err := gm.Increment(key, 1); return err })
	})
	for _, conns := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("pipelined_conns=%d", conns), func(b *testing.B) {
			c := testClient(b, Config{Conns: conns}, nil, srv.Addr)
			ctx := context.Background()
			run(b, func(key string) error { _, err := c.Incr(ctx, key, 1); return err })
		})
	}
}

// TestClientPrefersFirstConn checks that requests stay on a server's first
// connection while its queue is shallow (the second is not even dialed),
// and that a deep queue there sends the next request to the second.
func TestClientPrefersFirstConn(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	var dials atomic.Int64
	d := &net.Dialer{Timeout: time.Second}
	c := testClient(t, Config{Conns: 2, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}}, nil, srv.Addr)
	ctx := t.Context()
	if err := c.Add(ctx, "prefer", []byte("0"), 60); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if _, err := c.Incr(ctx, "prefer", 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections dialed for requests one at a time, want 1", n)
	}
	// Held requests stay queued on the first connection until flushed.
	var held []*request
	var first *pconn
	for range deepQueue {
		r, pc, err := c.start(ctx, "prefer", request{verb: verbIncr, key: "prefer", num: 1}, true)
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = pc
		} else if pc != first {
			t.Fatalf("a request went to another connection with %d queued on the first", len(held))
		}
		held = append(held, r)
	}
	r, pc, err := c.start(ctx, "prefer", request{verb: verbIncr, key: "prefer", num: 1}, true)
	if err != nil {
		t.Fatal(err)
	}
	if pc == first {
		t.Errorf("request %d went to the first connection, whose queue is deep", deepQueue+1)
	}
	first.flush()
	pc.flush()
	for _, r := range append(held, r) {
		if _, err := c.wait(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientYieldSharesWrite checks that requests made at the same moment
// on an idle connection go out together: the one that finds it idle yields
// before writing, and those runnable meanwhile join its write. With one
// processor, 16 goroutines started together make one write per round
// (two without the yield: the first request alone, then the others when
// its answer comes), or two when the scheduler happens to take its global
// queue, where the yielding goroutine went, first (about one round in
// four); the bound leaves room for that.
func TestClientYieldSharesWrite(t *testing.T) {
	srv := harness.StartMemcached(t)
	var writes atomic.Int64
	c := testClient(t, Config{Conns: 1}, &writes, srv.Addr)
	ctx := t.Context()
	if err := c.Add(ctx, "yield", []byte("0"), 60); err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const rounds, callers = 20, 16
	writes.Store(0)
	for range rounds {
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				if _, err := c.Incr(ctx, "yield", 1); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if w := writes.Load(); w > rounds*7/4 {
		t.Errorf("%d writes for %d rounds of %d requests made together, want at most %d", w, rounds, callers, rounds*7/4)
	} else {
		t.Logf("%d writes for %d rounds of %d requests made together", w, rounds, callers)
	}
}

// TestClientPassesOverDownConn checks that while the first connection is
// down and cannot be redialed (backing off), requests go to the second,
// which is up, rather than failing with the first's error.
func TestClientPassesOverDownConn(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	var (
		mu     sync.Mutex
		opened []net.Conn
		refuse bool
	)
	d := &net.Dialer{Timeout: time.Second}
	c := testClient(t, Config{Conns: 2, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return nil, errors.New("dial refused by the test")
		}
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			opened = append(opened, nc)
		}
		return nc, err
	}}, nil, srv.Addr)
	ctx := t.Context()
	if err := c.Ping(ctx); err != nil { // dials both
		t.Fatal(err)
	}
	mu.Lock()
	refuse = true
	first := opened[0]
	mu.Unlock()
	_ = first.Close() // the first connection breaks; its redial fails
	s, err := c.pick("down")
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 5*time.Second, "the first connection down", func() bool { return !s.conns[0].up.Load() })
	if err := c.Add(ctx, "down", []byte("0"), 60); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := c.Incr(ctx, "down", 1); err != nil {
			t.Fatalf("request %d with the second connection up: %v", i, err)
		}
	}
}

// TestClientBackoffResetsOnAnswer checks that the reconnection backoff
// counts failures in a row: late answers while memcached is frozen grow
// it, and once a connection answers again the next late answer backs off
// from redialMin, not from where the earlier outage left it.
func TestClientBackoffResetsOnAnswer(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	c := testClient(t, Config{Conns: 1, Timeout: 100 * time.Millisecond}, nil, srv.Addr)
	ctx := t.Context()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := c.pick("k")
	if err != nil {
		t.Fatal(err)
	}
	pc := s.conns[0]
	backoff := func() time.Duration {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return pc.backoff
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	for i := 0; backoff() < 8*redialMin; i++ {
		if i == 100 {
			srv.Thaw()
			t.Fatalf("backoff %v after 100 pings of a frozen memcached, want it to grow past %v", backoff(), 8*redialMin)
		}
		_ = c.Ping(ctx) // late, or refused at once within the backoff
		// The backoff runs on the client's real clock: let it pass.
		time.Sleep(redialMin)
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 5*time.Second, "an answer after the thaw", func() bool { return c.Ping(ctx) == nil })
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer srv.Thaw()
	if err := c.Ping(ctx); err == nil {
		t.Fatal("a ping of a frozen memcached answered")
	}
	if got := backoff(); got != redialMin {
		t.Errorf("backoff after one late answer following an answer = %v, want %v (a fresh run of failures)", got, redialMin)
	}
}

// TestClientLateReaderIsNoTimeout: a reader that starts reading after the
// connection's read deadline has passed (a busy host ran it late) while
// the answer waits in the socket reads the answer: memcached was not late.
// One that waited in time for an answer that does not come times out.
func TestClientLateReaderIsNoTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	c := New(Config{Timeout: 2 * time.Second})
	pc := newPconn(c, &server{addr: "test"})
	pc.mu.Lock()
	pc.nc, pc.gen = nc, 1
	pc.setReadDeadlineLocked(time.Now().Add(-time.Second)) // passed before the read starts
	pc.mu.Unlock()
	r := &connReader{pc: pc, nc: nc, gen: 1}

	if _, err := peer.Write([]byte("STORED\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	// Loopback delivers the write into the socket before it returns; the
	// read below finds the answer there whenever it runs.
	n, err := io.ReadAtLeast(r, buf, len("STORED\r\n"))
	if err != nil || string(buf[:n]) != "STORED\r\n" {
		t.Fatalf("read started after the deadline, with the answer waiting: %q, %v; want the answer", buf[:n], err)
	}

	// In time for an answer that never comes: a timeout, with the
	// deadline short enough to pass while the read waits.
	pc.mu.Lock()
	pc.setReadDeadlineLocked(time.Now().Add(50 * time.Millisecond))
	pc.mu.Unlock()
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read in time, no answer: %v, want a timeout", err)
	}
}

// TestIdleConnectionsPastIdleAreClosed: with 2 connections and Idle 1 (the
// anchor's MEMCACHE_MAX_IDLE_CONNS), the second connection is dialed while
// the first has a deep queue, and closed as soon as nothing is under way
// on it; with Idle 2 it stays.
//
// The requests are queued one after the other from the test's goroutine,
// each counted on its connection before the next chooses one: goroutines
// started at once could all choose the first connection before any had
// counted its request there (choose reads the counts without a lock), and
// the second was then never dialed (1 run in 40 failed so, idle machine).
func TestIdleConnectionsPastIdleAreClosed(t *testing.T) {
	t.Parallel()
	for _, idle := range []int{1, 2} {
		t.Run(fmt.Sprint("idle_", idle), func(t *testing.T) {
			t.Parallel()
			srv := harness.StartMemcached(t)
			var counter connCounter
			d := &net.Dialer{Timeout: 10 * time.Second}
			c := testClient(t, Config{Conns: 2, Idle: idle, Timeout: 10 * time.Second, Dial: counter.wrap(d.DialContext)}, nil, srv.Addr)
			ctx := t.Context()
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			// Frozen, memcached answers nothing: the first connection's
			// queue grows past deepQueue and the next incr goes to the
			// second (bounded: a memcached that answered one or two
			// before it stopped leaves the queue a little shorter).
			if err := srv.Freeze(); err != nil {
				t.Fatal(err)
			}
			var calls []Call
			for i := 0; counter.open.Load() < 2 && i < 2*deepQueue; i++ {
				call, err := c.QueueIncr(ctx, nil, fmt.Sprint("idle-", i), 1)
				if err != nil {
					t.Fatal(err)
				}
				calls = append(calls, call)
			}
			if n := counter.open.Load(); n != 2 {
				t.Fatalf("%d connections open after %d requests with memcached frozen, want a second one", n, len(calls))
			}
			if err := srv.Thaw(); err != nil {
				t.Fatal(err)
			}
			for _, call := range calls {
				if _, err := c.Wait(ctx, call); err != nil && !errors.Is(err, ErrCacheMiss) {
					t.Error(err)
				}
			}
			// A connection past Idle is closed by its reader with the
			// answer that empties its queue, under its mu: once each mu
			// is taken, every close has happened.
			connected := 0
			c.mu.RLock()
			for _, pc := range c.servers[0].conns {
				pc.mu.Lock()
				if pc.nc != nil {
					connected++
				}
				pc.mu.Unlock()
			}
			c.mu.RUnlock()
			if n := counter.open.Load(); n != int64(idle) || connected != idle {
				t.Errorf("%d connections open (%d connected) once all is answered with Idle %d, want %d", n, connected, idle, idle)
			}
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
