package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// fakeRedis is a RESP server on a loopback port: it answers the store's
// start-up commands (PING, INFO, SCRIPT LOAD) as Redis does, and every
// other command with what the test sets, so that it can give the replies a
// correct Redis never gives, which a real one cannot be made to.
type fakeRedis struct {
	addr  string
	conns atomic.Int64 // connections accepted
	mu    sync.Mutex
	// answers maps a command's name (lower case) to its raw reply; with
	// "close" set, the server closes the connection after each reply. A
	// reply's part after a NUL byte is sent only with the next reply of
	// the connection, so that the client sees half of it.
	answers map[string]string
}

// startFakeRedis starts a fakeRedis, stopped in t.Cleanup.
func startFakeRedis(t *testing.T) *fakeRedis {
	t.Helper()
	f := &fakeRedis{}
	f.addr = harness.ServeLoopback(t, func(c net.Conn) {
		f.conns.Add(1)
		f.serve(c)
	})
	return f
}

// set makes the server answer the named commands with the raw replies.
func (f *fakeRedis) set(answers map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers = answers
}

// serve answers the commands of one connection until it closes.
func (f *fakeRedis) serve(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReader(c)
	// The replies to the commands of one pipeline go out in one write,
	// as Redis sends them, so that a reply too many arrives with the
	// others and not, by chance of scheduling, after the client read them.
	wr := bufio.NewWriter(c)
	held := "" // the rest of the last reply
	for {
		args, err := readCommand(rd)
		if err != nil {
			return
		}
		var reply string
		switch name := strings.ToLower(args[0]); name {
		case "ping":
			reply = "+PONG\r\n"
		case "info":
			reply = bulk("# Server\r\nredis_version:7.0.0\r\n")
		case "script":
			reply = bulk(strings.Repeat("0", 40))
		default:
			f.mu.Lock()
			reply = f.answers[name]
			f.mu.Unlock()
			if reply == "" {
				reply = "-ERR unknown command\r\n"
			}
		}
		reply, held = held+reply, ""
		if i := strings.IndexByte(reply, 0); i >= 0 {
			reply, held = reply[:i], reply[i+1:]
		}
		if _, err := wr.WriteString(reply); err != nil {
			return
		}
		f.mu.Lock()
		closing := f.answers["close"] != ""
		f.mu.Unlock()
		if rd.Buffered() == 0 || closing {
			if err := wr.Flush(); err != nil || closing {
				return
			}
		}
	}
}

// readCommand reads one command: an array of bulk strings.
func readCommand(rd *bufio.Reader) ([]string, error) {
	n, err := readLength(rd, '*')
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		size, err := readLength(rd, '$')
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

func readLength(rd *bufio.Reader, kind byte) (int, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 4 || line[0] != kind {
		return 0, fmt.Errorf("fake redis: unexpected %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSuffix(line[1:], "\r\n"))
	if err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("fake redis: length %q", line)
	}
	return n, nil
}

func bulk(s string) string { return fmt.Sprintf("$%d\r\n%s\r\n", len(s), s) }

// ints is a RESP array of integers.
func ints(vs ...int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(vs))
	for _, v := range vs {
		fmt.Fprintf(&b, ":%d\r\n", v)
	}
	return b.String()
}

// The ops the reply cases are sent for: a fixed window's INCRBY and
// EXPIRE, its GET, a lean script, and decideLua for an all-or-nothing
// batch. Each has a limit of 5.
const (
	opIncr = iota
	opGet
	opLean
	opDecide
	opRefund
)

// The outcomes of a reply case.
const (
	// wantClosed: replyGuard refused the reply before go-redis read it and
	// closed the connection; the request fails with Unavailable.
	wantClosed = iota
	// wantBadReply: a whole reply no Redis gives; the request fails, its
	// error wraps errBadReply.
	wantBadReply
	// wantData: the key holds a count below zero; the request fails with
	// ErrData.
	wantData
	// wantError: go-redis itself refuses the reply; the request fails.
	wantError
	// wantOK: a reply a correct Redis may give.
	wantOK
)

// replyCases are replies a correct Redis never gives, and a few it does,
// for each kind of command the store sends. They seed FuzzReplies too.
var replyCases = []struct {
	name  string
	op    int
	reply string // to INCRBY, GET or EVALSHA; EXPIRE answers :1
	want  int
	// expire sends reply to the fixed window's EXPIRE; INCRBY answers :1.
	expire bool
}{
	{"incrby_ok", opIncr, ":1\r\n", wantOK, false},
	{"expire_nil", opIncr, "$-1\r\n", wantBadReply, true},
	{"expire_7", opIncr, ":7\r\n", wantBadReply, true},
	{"incrby_nil", opIncr, "$-1\r\n", wantBadReply, false},
	{"incrby_resp3_nil", opIncr, "_\r\n", wantBadReply, false},
	{"incrby_negative", opIncr, ":-5\r\n", wantData, false},
	{"incrby_zero", opIncr, ":0\r\n", wantData, false},
	{"incrby_huge_bulk", opIncr, "$9223372036854775807\r\n", wantClosed, false},
	{"incrby_oom_bulk", opIncr, "$100000000000\r\n", wantClosed, false},
	{"incrby_huge_array", opIncr, "*9223372036854775807\r\n", wantClosed, false},
	{"incrby_huge_map", opIncr, "%4611686018427387904\r\n", wantClosed, false},
	{"incrby_huge_set", opIncr, "~100000000\r\n", wantClosed, false},
	{"incrby_huge_attribute", opIncr, "|100000000\r\n", wantClosed, false},
	{"incrby_huge_blob_error", opIncr, "!100000000\r\n", wantClosed, false},
	{"incrby_huge_verbatim", opIncr, "=100000000\r\n", wantClosed, false},
	{"incrby_deep", opIncr, strings.Repeat("*1\r\n", 100) + ":1\r\n", wantClosed, false},
	{"incrby_endless_line", opIncr, "+" + strings.Repeat("A", 100<<10), wantClosed, false},
	{"incrby_length_not_a_number", opIncr, "$abc\r\n", wantClosed, false},
	{"incrby_negative_length", opIncr, "$-5\r\n", wantClosed, false},
	{"incrby_unknown_type", opIncr, "?5\r\n", wantClosed, false},
	{"incrby_empty_line", opIncr, "\r\n", wantClosed, false},
	{"incrby_two_replies", opIncr, ":1\r\n:1\r\n", wantClosed, false},
	{"incrby_array", opIncr, ints(1, 2, 3), wantError, false},
	{"incrby_array_of_1e5", opIncr, ints(make([]int64, 100_000)...), wantError, false},
	{"incrby_status", opIncr, "+OK\r\n", wantError, false},
	{"incrby_cut_short", opIncr, "$10\r\nabc", wantError, false},
	{"get_ok", opGet, "$1\r\n3\r\n", wantOK, false},
	{"get_nil", opGet, "$-1\r\n", wantOK, false},
	{"get_negative", opGet, "$2\r\n-3\r\n", wantData, false},
	{"get_huge_bulk", opGet, "$9223372036854775807\r\n", wantClosed, false},
	{"get_large_bulk", opGet, "$67108864\r\n", wantClosed, false},
	{"lean_ok", opLean, ints(1, 0, 1, 4, 0), wantOK, false},
	{"lean_short", opLean, ints(1, 0, 1), wantBadReply, false},
	{"lean_long", opLean, ints(1, 0, 1, 4, 0, 0), wantBadReply, false},
	{"lean_empty", opLean, "*0\r\n", wantBadReply, false},
	{"lean_nil", opLean, "*-1\r\n", wantBadReply, false},
	{"lean_allowed_2", opLean, ints(2, 0, 1, 4, 0), wantBadReply, false},
	{"lean_negative_before", opLean, ints(1, -1, 1, 4, 0), wantBadReply, false},
	{"lean_negative_remaining", opLean, ints(1, 0, 1, -1, 0), wantBadReply, false},
	{"lean_negative_reset", opLean, ints(1, 0, 1, 4, -1), wantBadReply, false},
	{"lean_remaining_past_limit", opLean, ints(1, 0, 1, 1000, 0), wantBadReply, false},
	{"lean_admitted_past_limit", opLean, ints(1, 5, 6, 0, 0), wantBadReply, false},
	{"lean_after_below_hits", opLean, ints(1, 0, 0, 5, 0), wantBadReply, false},
	{"lean_nil_elements", opLean, "*5\r\n:1\r\n$-1\r\n$-1\r\n:4\r\n:0\r\n", wantBadReply, false},
	{"lean_strings", opLean, "*5\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n", wantError, false},
	{"lean_nested", opLean, "*5\r\n*1\r\n:1\r\n:0\r\n:1\r\n:4\r\n:0\r\n", wantError, false},
	{"lean_error_element", opLean, "*5\r\n:1\r\n-ERR x\r\n:1\r\n:4\r\n:0\r\n", wantError, false},
	{"lean_error_element_then_late", opLean, "*5\r\n:1\r\n-ERR x\r\n\x00:1\r\n:4\r\n:0\r\n", wantError, false},
	{"lean_huge_array", opLean, "*9223372036854775807\r\n", wantClosed, false},
	{"lean_array_past_bound", opLean, "*1000000\r\n", wantClosed, false},
	{"decide_ok", opDecide, ints(1, 1, 0, 1, 4, 0, 0, 0), wantOK, false},
	{"decide_flag_7", opDecide, ints(7, 1, 0, 1, 4, 0, 0, 0), wantBadReply, false},
	{"decide_short", opDecide, ints(1, 1, 0), wantBadReply, false},
	{"decide_admitted_past_limit", opDecide, ints(1, 1, 0, 9, 0, 0, 0, 0), wantBadReply, false},
	{"decide_huge_array", opDecide, "*9223372036854775807\r\n", wantClosed, false},
	// A refund (decideLua with negative hits) is allowed, and reads the
	// state after it: before and after are the same.
	{"refund_ok", opRefund, ints(1, 1, 3, 3, 2, 0, 2, 0), wantOK, false},
	{"refund_over_limit_ok", opRefund, ints(1, 1, 7, 7, 0, 0, 2, 0), wantOK, false},
	{"refund_refused", opRefund, ints(1, 0, 3, 3, 2, 0, 2, 0), wantBadReply, false},
	{"refund_after_not_before", opRefund, ints(1, 1, 5, 3, 2, 0, 2, 0), wantBadReply, false},
	{"refund_remaining_past_limit", opRefund, ints(1, 1, 0, 0, 6, 0, 2, 0), wantBadReply, false},
}

// replyOp is the batch a reply case is sent for.
func replyOp(kind int) *limiter.Batch {
	op := limiter.Op{Key: "k", Algorithm: rules.FixedWindow, Limit: 5, Window: time.Minute, Hits: 1}
	b := &limiter.Batch{Now: time.Unix(1_700_000_000, 0), Ops: []limiter.Op{op}}
	switch kind {
	case opGet:
		b.Ops[0].Hits = 0
	case opLean:
		b.Ops[0].Algorithm = rules.SlidingWindow
	case opDecide:
		b.Ops[0].Algorithm = rules.SlidingWindow
		b.AllOrNothing = true
	case opRefund:
		b.Ops[0].Refund = true
	}
	return b
}

// answers are the fake server's replies for a case: EXPIRE as Redis, the
// case's reply to the others (with expire, the other way round).
func answers(reply string, expire bool) map[string]string {
	a := map[string]string{"incrby": reply, "get": reply, "evalsha": reply, "expire": ":1\r\n"}
	if expire {
		a["incrby"], a["expire"] = ":1\r\n", reply
	}
	if strings.HasSuffix(reply, "abc") { // cut short: the server hangs up
		a["close"] = "1"
	}
	return a
}

// TestRepliesNoRedisGives is issue 24's cases 3 and 4: a reply a correct
// Redis cannot give is an error for its request, never an admission; one
// that announces more than the store's bounds (a bulk string of 2^63-1 or
// 10^11 bytes, an array of 2^63-1 elements) is refused before go-redis
// allocates it, and its connection closed; nothing panics and the heap
// does not grow; the store answers again on a new connection.
func TestRepliesNoRedisGives(t *testing.T) {
	f := startFakeRedis(t)
	s := newStore(t, Config{URL: f.addr, SocketType: "tcp", PoolSize: 1, Timeout: 5 * time.Second})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, tc := range replyCases {
		t.Run(tc.name, func(t *testing.T) {
			f.set(answers(tc.reply, tc.expire))
			conns := f.conns.Load()
			b := replyOp(tc.op)
			err := s.Do(t.Context(), b)
			switch tc.want {
			case wantOK:
				if err != nil {
					t.Fatalf("Do = %v, want a decision", err)
				}
				return
			case wantClosed:
				if !errors.Is(err, errBadReply) || !errors.Is(err, limiter.ErrUnavailable) {
					t.Fatalf("Do = %v (%+v), want Unavailable: reply refused", err, b.Results[0])
				}
			case wantBadReply:
				if !errors.Is(err, errBadReply) || errors.Is(err, limiter.ErrUnavailable) {
					t.Fatalf("Do = %v (%+v), want an error for this request: a reply no Redis gives", err, b.Results[0])
				}
			case wantData:
				if !errors.Is(err, limiter.ErrData) {
					t.Fatalf("Do = %v (%+v), want ErrData", err, b.Results[0])
				}
			case wantError:
				if err == nil {
					t.Fatalf("Do = nil (%+v), want an error", b.Results[0])
				}
			}
			t.Logf("%v", err)
			// The store answers again, on the same connection or on a
			// new one; one whose reply go-redis left half read fails
			// once, at its next write.
			f.set(answers(replyCases[0].reply, false))
			good := replyOp(opIncr)
			if err := s.Do(t.Context(), good); err != nil {
				if !errors.Is(err, errBadReply) {
					t.Fatalf("the next request: %v", err)
				}
				t.Logf("the next request: %v", err)
				if err := s.Do(t.Context(), good); err != nil {
					t.Fatalf("the request after the next: %v", err)
				}
			}
			if tc.want == wantClosed && f.conns.Load() == conns {
				t.Errorf("the store still uses the connection that brought the refused reply")
			}
		})
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 16<<20 {
		t.Errorf("the heap grew by %d bytes over the replies, want under 16 MiB", grown)
	}
}

// TestWorkerSurvivesPanic: a panic in a round trip (here a Config.RoundTrip
// that panics once, on the worker's goroutine) fails that round trip's
// request with Unavailable; the worker goes on, and the next request is
// answered.
func TestWorkerSurvivesPanic(t *testing.T) {
	f := startFakeRedis(t)
	f.set(answers(":1\r\n", false))
	var panics atomic.Int64
	s := newStore(t, Config{URL: f.addr, SocketType: "tcp", PoolSize: 1, Timeout: 5 * time.Second,
		RoundTrip: func(time.Duration, int) {
			if panics.Add(1) == 1 {
				panic("a hook's bug")
			}
		}})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	err := s.Do(t.Context(), replyOp(opIncr))
	if !errors.Is(err, errPanic) || !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("the round trip that panicked: %v, want Unavailable naming the panic", err)
	}
	for i := range 3 {
		if err := s.Do(t.Context(), replyOp(opIncr)); err != nil {
			t.Fatalf("request %d after the panic: %v", i, err)
		}
	}
}

// memConn is a connection whose peer sends data and hangs up; what is
// written to it is dropped, and counted.
type memConn struct {
	data    []byte
	written int
}

func (c *memConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.data)
	c.data = c.data[n:]
	return n, nil
}

func (c *memConn) Write(p []byte) (int, error)      { c.written += len(p); return len(p), nil }
func (c *memConn) Close() error                     { return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// replyStream is what a server sends to the pipeline FuzzReplies sends:
// INCRBY, EXPIRE, GET, a lean script and decideLua, each answered by ok
// but the one of kind, answered by reply.
func replyStream(kind int, reply string) []byte {
	stream := []string{":1\r\n", ":1\r\n", "$1\r\n1\r\n", ints(1, 0, 1, 4, 0), ints(1, 1, 0, 1, 4, 0, 0, 0)}
	stream[map[int]int{opIncr: 0, opGet: 2, opLean: 3, opDecide: 4}[kind]] = reply
	return []byte(strings.Join(stream, ""))
}

// FuzzReplies sends the store's kinds of command through go-redis over a
// connection whose server answers with the fuzzer's bytes, through the
// store's dialer's wrappers, and reads the replies as the store does.
// Nothing may panic, and what the replies make the process allocate stays
// within the reply bound (replyBase, replyPerByte) and a fixed slack for
// the client itself.
func FuzzReplies(f *testing.F) {
	for _, tc := range replyCases {
		f.Add(replyStream(tc.op, tc.reply))
	}
	op := replyOp(opLean).Ops[0]
	f.Fuzz(func(t *testing.T, data []byte) {
		conn := &memConn{data: data}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		c := goredis.NewClient(&goredis.Options{
			Dialer: func(context.Context, string, string) (net.Conn, error) {
				return newNoHelloConn(newReplyGuard(conn), nil), nil
			},
			Protocol: 2, DisableIdentity: true, MaxRetries: -1, PoolSize: 1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer c.Close()
		ctx := t.Context()
		incr := intCmd{goredis.NewIntCmd(ctx, "incrby", "k", "1")}
		expire := intCmd{goredis.NewIntCmd(ctx, "expire", "k", "60")}
		get := stringCmd{goredis.NewStringCmd(ctx, "get", "k")}
		lean := scriptCmd{goredis.NewIntSliceCmd(ctx, "evalsha", leanSHAArgs[algorithmIndex(rules.SlidingWindow)], "1", "k", "", "5", "60000000", "1")}
		decide := scriptCmd{goredis.NewIntSliceCmd(ctx, "evalsha", decideSHA, "1", "k", "", "1", "sliding_window", "5", "5", "60000000", "1", "60")}
		pipe := c.Pipeline()
		for _, cmd := range []goredis.Cmder{incr, expire, get, lean, decide} {
			_ = pipe.Process(ctx, cmd)
		}
		_, _ = pipe.Exec(ctx)
		_, _ = incrResult(incr, expire, &op)
		if res, err := leanResult(lean); err == nil {
			_ = res.check(&op)
		}
		if res, err := scriptResult(decide, 0); err == nil {
			_ = res.check(&op)
		}
		runtime.ReadMemStats(&ms)
		const slack = 1 << 20 // the client, its pool and its commands
		if grown := ms.TotalAlloc - before; grown > replyBase+replyPerByte*uint64(conn.written)+slack {
			t.Errorf("%d bytes of replies made the process allocate %d bytes", len(data), grown)
		}
	})
}
