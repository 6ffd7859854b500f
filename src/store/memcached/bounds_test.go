package memcached

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// TestDeadlineBound freezes memcached (SIGSTOP) when a chosen command of a
// batch is sent, and thaws it thawAfter later: the Do must end at its
// deadline, before memcached answers, AllOrNothing take-backs and retries
// included. The bounds come from the settings, not from a margin: a Do
// that waited for memcached returns after the thaw (after the answer, or,
// never answered, at the Timeout, which is longer), and one that ends at
// its deadline (50 or 200 ms) is most of a second ahead of it, room for
// a loaded machine. A batch run in order (one op, or two ops on one key:
// see distinctKeys) sends nothing after the frozen command, whose answer
// comes past its deadline: every command written after it (drained by
// Close once memcached is thawed, so that those queued behind it are seen
// too) is a round trip started past the deadline, such as a take-back's.
// Not parallel: it freezes a server.
func TestDeadlineBound(t *testing.T) {
	srv := harness.StartMemcached(t)
	// thawAfter is far above the deadlines below, and Timeout above it, so
	// that a wait for the frozen command ends at the thaw.
	const thawAfter = time.Second
	const timeout = 2 * thawAfter
	var (
		mu      sync.Mutex
		trigger string   // the command prefix that freezes memcached
		late    []string // commands of the test's keys sent after the frozen one
		fired   bool
		thawed  bool        // memcached thawed by thaw, before the Do returned
		thaw    *time.Timer // resumes memcached
	)
	var conns connCounter
	conns.onWrite = func(p []byte) {
		cmd := string(p)
		if !strings.Contains(cmd, "TestDeadlineBound") {
			return // the prober's version
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case fired:
			late = append(late, strings.Fields(cmd)[0])
		case strings.HasPrefix(cmd, trigger) || trigger != "" && strings.Contains(cmd, "\r\n"+trigger):
			// The trigger may follow other commands in a write.
			fired = true
			if err := srv.Freeze(); err != nil {
				t.Error(err)
			}
			thaw = time.AfterFunc(thawAfter, func() {
				mu.Lock()
				thawed = true
				mu.Unlock()
				_ = srv.Thaw()
			})
		}
	}
	raw := memcache.New(srv.Addr)

	fixed := func(key string, limit uint64) limiter.Op {
		return limiter.Op{Key: key, Algorithm: rules.FixedWindow, Limit: limit, Window: time.Hour, Hits: 1}
	}
	// Batches that freeze memcached after a few round trips get a 200 ms
	// deadline, room for those on a loaded machine. They run in order (k1
	// twice) and record five ops before, so that their take-back would
	// send five commands after the frozen one.
	const midBatch = 200 * time.Millisecond
	tests := []struct {
		name string
		// prepare returns the batch and the command that freezes memcached.
		prepare  func(t *testing.T, s *Store) (b *limiter.Batch, trigger string)
		deadline time.Duration
		// sideBySide: the other ops' commands may follow the frozen one.
		sideBySide bool
	}{
		{
			name: "take_back_after_failure",
			prepare: func(t *testing.T, _ *Store) (*limiter.Batch, string) {
				k := uniqueKey(t, "k")
				return &limiter.Batch{AllOrNothing: true, Ops: []limiter.Op{
					fixed(k+"1", 10), fixed(k+"1", 10), fixed(k+"2", 10), fixed(k+"3", 10), fixed(k+"4", 10), fixed(k+"5", 10),
				}}, "add " + k + "5"
			},
			deadline: midBatch,
		},
		{
			name: "take_back_after_refusal",
			prepare: func(t *testing.T, _ *Store) (*limiter.Batch, string) {
				k := uniqueKey(t, "k")
				sw := limiter.Op{Key: k + "sw", Algorithm: rules.SlidingWindow, Limit: 10, Window: time.Hour, Hits: 1}
				return &limiter.Batch{AllOrNothing: true, Ops: []limiter.Op{
					fixed(k+"1", 10), fixed(k+"1", 10), sw, fixed(k+"2", 10), fixed(k+"3", 10), fixed(k+"4", 0),
				}}, "decr " + k + "3"
			},
			deadline: midBatch,
		},
		{
			name: "state_answered_late",
			prepare: func(t *testing.T, _ *Store) (*limiter.Batch, string) {
				k := uniqueKey(t, "k")
				return &limiter.Batch{Ops: []limiter.Op{
					{Key: k, Algorithm: rules.TokenBucket, Limit: 10, Window: time.Hour, Hits: 1},
				}}, "gets " + k
			},
			deadline: 50 * time.Millisecond,
		},
		{
			name: "incr_missed_late",
			prepare: func(t *testing.T, s *Store) (*limiter.Batch, string) {
				k := uniqueKey(t, "k")
				// Counted once, so that the next hit starts with incr, then
				// gone: that incr misses and add would follow.
				do(t, s, false, time.Now(), fixed(k, 10))
				if err := raw.Delete(k); err != nil {
					t.Fatal(err)
				}
				return &limiter.Batch{Ops: []limiter.Op{fixed(k, 10)}}, "incr " + k
			},
			deadline: 50 * time.Millisecond,
		},
		{
			name: "frozen_at_start",
			prepare: func(t *testing.T, _ *Store) (*limiter.Batch, string) {
				k := uniqueKey(t, "k")
				var ops []limiter.Op
				for _, alg := range rules.Algorithms {
					ops = append(ops, limiter.Op{Key: k + alg.String(), Algorithm: alg, Limit: 10, Window: time.Hour, Hits: 1})
				}
				return &limiter.Batch{Ops: ops}, "" // any: the first command
			},
			deadline:   50 * time.Millisecond,
			sideBySide: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Cleanup(func() {
				mu.Lock()
				trigger = "\x00" // nothing matches
				if thaw != nil {
					thaw.Stop()
				}
				mu.Unlock()
				if err := srv.Thaw(); err != nil {
					t.Error(err)
				}
				harness.WaitFor(t, 5*time.Second, "memcached answers again", func() bool {
					_, err := srv.Stats(context.Background()) // t.Context() has ended
					return err == nil
				})
			})
			// A store of its own, closed to see the commands queued behind
			// the frozen one.
			mu.Lock()
			trigger = "\x00" // the prober's first version and prepare's do
			mu.Unlock()
			s := newCountingStore(t, Config{Addrs: []string{srv.Addr}, Timeout: timeout}, &conns)
			// A machine so loaded that the deadline passes before the
			// command that freezes memcached is sent proves nothing: try
			// again with new keys.
			for attempt := 1; ; attempt++ {
				b, trig := tt.prepare(t, s)
				b.Now = time.Now()
				mu.Lock()
				trigger, late, fired, thawed = trig, nil, false, false
				mu.Unlock()
				ctx, cancel := context.WithTimeout(t.Context(), tt.deadline)
				start := time.Now()
				err := s.Do(ctx, b)
				took := time.Since(start)
				cancel()
				mu.Lock()
				fired, thawed := fired, thawed
				if thaw != nil {
					thaw.Stop()
				}
				mu.Unlock()
				if !fired {
					if attempt == 5 {
						t.Fatalf("memcached never frozen in %d attempts; last Do: %v", attempt, err)
					}
					t.Logf("attempt %d: the deadline passed before the freezing command (%v)", attempt, err)
					continue
				}
				if !errors.Is(err, limiter.ErrUnavailable) {
					t.Errorf("Do = %v, want ErrUnavailable", err)
				}
				if thawed || took >= thawAfter {
					t.Errorf("Do took %v, want it to end at its %v deadline, before memcached, frozen, was thawed %v later", took, tt.deadline, thawAfter)
				}
				if err := srv.Thaw(); err != nil {
					t.Fatal(err)
				}
				if err := s.Close(); err != nil { // writes what was queued behind the frozen command
					t.Fatal(err)
				}
				mu.Lock()
				late := late
				mu.Unlock()
				if len(late) > 0 && !tt.sideBySide {
					t.Errorf("commands %q sent after the frozen one, whose answer came past the deadline", late)
				}
				return
			}
		})
	}
}

// TestDialWithinTimeout: a round trip on a new connection ends within
// Timeout, the dial included. The server begins the TLS handshake
// handshakeDelay after it accepts, then never answers: gomemcache alone
// would give the round trip a Timeout of its own after the dial. The bound
// comes from the server, not from a margin: a round trip timed from the end
// of its dial cannot end before the server's handshake began plus Timeout
// (the dial ends only once the server has answered the handshake), and one
// timed from the start of the dial ends handshakeDelay (most of the
// Timeout) ahead of that, room for a loaded machine.
func TestDialWithinTimeout(t *testing.T) {
	t.Parallel()
	ca := harness.NewCA(t, "TestDialWithinTimeout")
	cert := ca.Server(t)
	// The handshake gets Timeout - handshakeDelay; a dial that does not
	// end within the Timeout leaves no round trip to check.
	const timeout, handshakeDelay = 900 * time.Millisecond, 600 * time.Millisecond
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// stop ends the server's connections, so that the stores close at once.
	serving, stop := context.WithCancel(t.Context())
	defer stop()
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	// shook receives when the server began the handshake of the connection
	// that carried the Do's command (key).
	const key = "dialed"
	shook := make(chan time.Time, 8)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				defer context.AfterFunc(serving, func() { _ = c.Close() })()
				select {
				case <-time.After(handshakeDelay): // the slow part of the dial
				case <-serving.Done():
					return
				}
				began := time.Now()
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert.TLS}, MinVersion: tls.VersionTLS12})
				if tc.Handshake() != nil {
					return
				}
				br := bufio.NewReader(tc)
				for { // never answers
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if strings.Contains(line, " "+key+" ") {
						shook <- began
					}
				}
			})
		}
	})
	b := &limiter.Batch{Ops: []limiter.Op{{Key: key, Limit: 1, Window: time.Minute, Hits: 1}}}
	// A machine so loaded that the handshake takes the rest of the Timeout
	// proves nothing: try again with a new store.
	for attempt := 1; ; attempt++ {
		// One connection: the prober's, on which the Do's command waits
		// for the dial.
		s := newStore(t, Config{Addrs: []string{l.Addr().String()}, TLS: harness.ClientConfig(nil, ca), Conns: 1, Timeout: timeout})
		err := s.Do(t.Context(), b)
		ended := time.Now()
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("Do = %v, want ErrUnavailable", err)
		}
		if !errors.Is(err, mcclient.ErrNoAnswer) {
			if attempt == 3 {
				t.Fatalf("no dial ended within the %v Timeout in %d attempts; last Do: %v", timeout, attempt, err)
			}
			t.Logf("attempt %d: the dial did not end within the Timeout (%v)", attempt, err)
			continue
		}
		// The command was written: the server reads it.
		select {
		case began := <-shook:
			if bound := began.Add(timeout); !ended.Before(bound) {
				t.Errorf("Do ended %v after the server began the handshake, want within the %v Timeout, the dial included (it began %v after the dial)",
					ended.Sub(began), timeout, handshakeDelay)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the server never read the Do's command")
		}
		return
	}
}

// TestConnectionBound freezes memcached and starts MaxConns calls without
// a deadline, which take every slot (their commands wait in the pipeline),
// then many concurrent Do calls with one deadline: MaxWaiting of them
// wait for a slot until their deadline, and the others fail at once; those
// two fail with ErrOverloaded and are counted in Shed. The holders end when
// their ctx does. No more than the pipelined connections are ever open, in
// the store's count and in memcached's, and once memcached is thawed the
// store serves again. The bounds come from the order of events, not from a
// margin: the holders keep their slots until the test cancels them, after
// the others ended, so that a call waiting for a slot can end only at its
// deadline; and memcached is thawed thawAfter later, so that a holder that
// waited for memcached ends only after the thaw. Not parallel: it freezes
// a server.
func TestConnectionBound(t *testing.T) {
	srv := harness.StartMemcached(t)
	const (
		maxConns, maxWaiting, calls = 4, 4, 20
		deadline                    = time.Second
		thawAfter                   = 2 * time.Second
	)
	key := uniqueKey(t, "k")
	holderKey := key + "held"
	var written atomic.Int64 // the holders' commands written to memcached, frozen
	conns := connCounter{onWrite: func(p []byte) {
		written.Add(int64(strings.Count(string(p), holderKey)))
	}}
	s := newCountingStore(t, Config{
		Addrs: []string{srv.Addr}, MaxConns: maxConns, MaxWaiting: maxWaiting,
		Timeout: 10 * time.Second, // above thawAfter: the connections are not closed as late
	}, &conns)
	currConns := func() int {
		t.Helper()
		stats, err := srv.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(stats["curr_connections"])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// memcached's own connections (listener, the stats one): all but ours.
	others := currConns() - int(conns.open.Load())

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Thaw() })
	var (
		mu     sync.Mutex
		thawed bool
	)
	thaw := func() {
		mu.Lock()
		thawed = true
		mu.Unlock()
		if err := srv.Thaw(); err != nil {
			t.Error(err)
		}
	}
	one := func(ctx context.Context, key string) error {
		return s.Do(ctx, &limiter.Batch{Ops: []limiter.Op{{Key: key, Limit: 10, Window: time.Hour, Hits: 1}}})
	}

	// The holders hold every slot, their commands under way: written, or
	// queued behind one that was.
	held, release := context.WithCancel(context.Background())
	defer release()
	type holderEnd struct {
		err    error
		thawed bool // memcached was thawed when the Do returned
	}
	holders := make(chan holderEnd, maxConns)
	for i := range maxConns {
		go func() {
			err := one(held, holderKey+strconv.Itoa(i))
			mu.Lock()
			defer mu.Unlock()
			holders <- holderEnd{err, thawed}
		}()
	}
	harness.WaitFor(t, 5*time.Second, "every slot held, a command written", func() bool {
		return written.Load() > 0 && len(s.slots) == maxConns
	})

	// One deadline for all: a call that waited for a slot can end only at
	// it, and one shed at once ends before it, however late it was
	// scheduled, unless a call came only after the deadline, which would
	// take a second's stall.
	end := time.Now().Add(deadline)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	type outcome struct {
		err    error
		before bool // the Do returned before the deadline
	}
	results := make(chan outcome, calls)
	for i := range calls {
		go func() {
			err := one(ctx, key+strconv.Itoa(i))
			results <- outcome{err, time.Now().Before(end)}
		}()
	}
	var fast, waited int
	check := func(r outcome) {
		t.Helper()
		switch {
		case !errors.Is(r.err, limiter.ErrOverloaded) || errors.Is(r.err, limiter.ErrUnavailable):
			t.Errorf("Do = %v, want ErrOverloaded", r.err)
		case strings.Contains(r.err.Error(), "waiting for one"): // shed at once
			fast++
			if !r.before {
				t.Errorf("a call shed at once ended only at its deadline: %v", r.err)
			}
		default:
			waited++
			if r.before {
				t.Errorf("a call waiting for a connection failed before its deadline: %v", r.err)
			}
		}
	}
	// Every call ends while the holders keep their slots: a call waiting
	// for one ends at its deadline or never.
	wait := time.After(10 * time.Second)
	for range calls {
		select {
		case r := <-results:
			check(r)
		case <-wait:
			t.Fatalf("%d calls ended while every slot was held, want %d", fast+waited, calls)
		}
	}
	if want := calls - maxWaiting; fast != want || waited != maxWaiting {
		t.Errorf("%d calls shed at once and %d waited, want %d and %d", fast, waited, want, maxWaiting)
	}
	if n := len(holders); n > 0 {
		t.Errorf("%d calls holding a slot ended before their ctx did", n)
	}

	// The holders end with their ctx, memcached still frozen.
	release()
	thawing := time.AfterFunc(thawAfter, thaw)
	for range maxConns {
		select {
		case h := <-holders:
			if !errors.Is(h.err, limiter.ErrUnavailable) || !errors.Is(h.err, context.Canceled) {
				t.Errorf("a call holding a slot: Do = %v, want ErrUnavailable (context canceled)", h.err)
			}
			if h.thawed {
				t.Errorf("a call holding a slot ended once memcached was thawed, %v after its ctx, want when its ctx ended", thawAfter)
			}
		case <-time.After(2 * thawAfter):
			t.Fatal("a call holding a slot never ended")
		}
	}
	if thawing.Stop() {
		thaw()
	}
	if got, want := s.Shed(), uint64(fast+waited); got != want {
		t.Errorf("Shed() = %d, want the %d calls that failed with ErrOverloaded", got, want)
	}
	want := defaultConns
	if peak := conns.peak.Load(); peak > int64(want) {
		t.Errorf("%d connections open at once, want at most %d", peak, want)
	}
	// A connection the store closed while memcached was frozen is still
	// counted until memcached, thawed, reads its close: wait for that.
	harness.WaitFor(t, 5*time.Second, fmt.Sprintf("memcached counts at most %d connections of the store", want), func() bool {
		return currConns()-others <= want
	})

	// Everything works again, under as many concurrent calls as there are
	// connections.
	var wg sync.WaitGroup
	for range maxConns {
		wg.Go(func() {
			for range 20 {
				if err := hit(t.Context(), s, uniqueKey(t, "after")); err != nil {
					t.Errorf("after the thaw: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	harness.WaitFor(t, 5*time.Second, "healthy after the thaw", s.Healthy)
}
