package harness

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// FakeMemcached is a server of memcached's text protocol on a free
// 127.0.0.1 port, for the answers a real memcached gives only in a rare
// race, or never: it answers version as memcached does, and every other
// command with the answer set for its verb (Answer), or not at all. Its
// methods are safe for concurrent use.
type FakeMemcached struct {
	// Addr is "127.0.0.1:port".
	Addr string

	commands atomic.Int64
	mu       sync.Mutex
	answers  map[string]string
}

// StartFakeMemcached starts a FakeMemcached that answers nothing but
// version, and stops it, its connections closed, in t.Cleanup.
func StartFakeMemcached(tb testing.TB) *FakeMemcached {
	tb.Helper()
	f := &FakeMemcached{}
	f.Addr = ServeLoopback(tb, f.serve)
	return f
}

// Answer makes the server answer each command of verb ("incr", "add",
// "gets", ...) with answer, sent as it is ("NOT_FOUND\r\n"); an empty
// answer leaves the command unanswered.
func (f *FakeMemcached) Answer(verb, answer string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answers == nil {
		f.answers = map[string]string{}
	}
	f.answers[verb] = answer
}

// Commands returns how many commands other than version the server has
// read.
func (f *FakeMemcached) Commands() int64 { return f.commands.Load() }

// serve reads the commands of one connection until it closes.
func (f *FakeMemcached) serve(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReader(c)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		verb := fields[0]
		switch verb {
		case "set", "add", "replace", "append", "prepend", "cas":
			// The data block: <bytes> is the fifth field.
			n := -1
			if len(fields) >= 5 {
				n, _ = strconv.Atoi(fields[4])
			}
			if n < 0 || n > 1<<20 {
				return
			}
			if _, err := io.CopyN(io.Discard, rd, int64(n)+2); err != nil {
				return
			}
		}
		answer := "VERSION 1.6.21\r\n"
		if verb != "version" {
			f.commands.Add(1)
			f.mu.Lock()
			answer = f.answers[verb]
			f.mu.Unlock()
		}
		if _, err := io.WriteString(c, answer); err != nil {
			return
		}
	}
}
