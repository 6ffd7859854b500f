package redis

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// fakeRedis is a RESP server on a loopback port: it answers the store's
// start-up commands (PING, INFO, SCRIPT LOAD) as Redis does, and every
// other command with what the test sets, so that it can give the replies a
// correct Redis never gives, which a real one cannot be made to.
type fakeRedis struct {
	addr string
	mu   sync.Mutex
	// answers maps a command's name (lower case) to its raw reply; with
	// "close" set, the server closes the connection after each reply.
	answers map[string]string
}

// startFakeRedis starts a fakeRedis, stopped in t.Cleanup.
func startFakeRedis(t *testing.T) *fakeRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
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
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
		f.mu.Lock()
		closing := f.answers["close"] != ""
		f.mu.Unlock()
		if closing {
			return
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
)

// The outcomes of a reply case.
const (
	// wantBadReply: a whole reply no Redis gives; the request fails, its
	// error wraps errBadReply.
	wantBadReply = iota
	// wantData: the key holds a count below zero; the request fails with
	// ErrData.
	wantData
	// wantError: go-redis itself refuses the reply; the request fails.
	wantError
	// wantOK: a reply a correct Redis may give.
	wantOK
)

// replyCases are replies a correct Redis never gives, and a few it does,
// for each kind of command the store sends.
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
	{"incrby_array", opIncr, ints(1, 2, 3), wantError, false},
	{"incrby_array_of_1e5", opIncr, ints(make([]int64, 100_000)...), wantError, false},
	{"incrby_status", opIncr, "+OK\r\n", wantError, false},
	{"incrby_cut_short", opIncr, "$10\r\nabc", wantError, false},
	{"get_ok", opGet, "$1\r\n3\r\n", wantOK, false},
	{"get_nil", opGet, "$-1\r\n", wantOK, false},
	{"get_negative", opGet, "$2\r\n-3\r\n", wantData, false},
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
	{"decide_ok", opDecide, ints(1, 1, 0, 1, 4, 0, 0, 0), wantOK, false},
	{"decide_flag_7", opDecide, ints(7, 1, 0, 1, 4, 0, 0, 0), wantBadReply, false},
	{"decide_short", opDecide, ints(1, 1, 0), wantBadReply, false},
	{"decide_admitted_past_limit", opDecide, ints(1, 1, 0, 9, 0, 0, 0, 0), wantBadReply, false},
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

// TestRepliesNoRedisGives is issue 24's case 3: a reply a correct Redis
// cannot give is an error for its request, never an admission, and the
// store answers the next request.
func TestRepliesNoRedisGives(t *testing.T) {
	f := startFakeRedis(t)
	s := newStore(t, Config{URL: f.addr, SocketType: "tcp", PoolSize: 1, Timeout: 5 * time.Second})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range replyCases {
		t.Run(tc.name, func(t *testing.T) {
			f.set(answers(tc.reply, tc.expire))
			b := replyOp(tc.op)
			err := s.Do(t.Context(), b)
			switch tc.want {
			case wantOK:
				if err != nil {
					t.Fatalf("Do = %v, want a decision", err)
				}
				return
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
			// The store answers again.
			f.set(answers(replyCases[0].reply, false))
			if err := s.Do(t.Context(), replyOp(opIncr)); err != nil {
				t.Fatalf("the next request: %v", err)
			}
		})
	}
}
