package redis

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// The bounds of what Redis's replies may make the client allocate (docs/STORES.md,
// "Redis"). go-redis allocates the length a reply announces as soon as it
// reads the header: "$9223372036854775807" panics in makeslice,
// "$100000000000" is a fatal out-of-memory, "*9223372036854775807" to
// EVALSHA panics, and a line without an end grows its buffer until the
// process dies. replyGuard checks every header against these bounds before
// go-redis sees it.
const (
	// maxReplyLine bounds a line: a status, an error, a number, or the
	// header of a bulk string or an aggregate.
	maxReplyLine = 64 << 10
	// maxReplyDepth bounds how deep aggregates nest in one reply; the
	// deepest reply go-redis may ask for, COMMAND (a Cluster client's),
	// nests about eight deep.
	maxReplyDepth = 32
	// replyBase and replyPerByte bound what the replies of one round trip
	// may make go-redis allocate: replyBase plus replyPerByte bytes per
	// byte the round trip sent. A reply takes about half what its command
	// sent (an INCRBY's reply is a few bytes, an op's part of a script
	// reply about 170 bytes of go-redis's memory for about 140 sent), and
	// the few replies larger than their command (INFO, CLUSTER SLOTS,
	// COMMAND: 268 KB from Redis 7.0) take well under replyBase.
	replyBase    = 4 << 20
	replyPerByte = 4
	// elemBytes is what go-redis allocates for one element of an
	// aggregate (an interface value), before reading the element.
	elemBytes = 16
)

// replyGuard is a connection to Redis whose replies are checked, as they
// arrive and before go-redis reads them, against the bounds above. Once a
// reply breaks one, the connection is closed and every later Read and
// Write fails: go-redis then drops it, and the requests that were on it
// fail with limiter.ErrUnavailable. It counts the commands written, so
// that a reply no command waits for is refused too, and a write while a
// reply is only partly read (the connection is out of step) fails.
//
// go-redis uses a connection from one goroutine at a time: Read and Write
// are not called concurrently. Close may be.
type replyGuard struct {
	net.Conn
	in, out  respScanner
	commands int64 // written whole
	replies  int64 // read whole
	// avail is what the replies of the round trip may still take; reading
	// is set once a reply byte of the round trip has come.
	avail   int64
	reading bool
	err     error
}

func newReplyGuard(c net.Conn) *replyGuard { return &replyGuard{Conn: c, avail: replyBase} }

func (g *replyGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if n > 0 {
		g.reading = true
		done, bad := g.in.scan(p[:n], &g.avail)
		g.replies += int64(done)
		if bad == nil && g.replies > g.commands {
			bad = fmt.Errorf("%d replies to %d commands", g.replies, g.commands)
		}
		if bad != nil {
			return 0, g.fail(bad)
		}
	}
	return n, err
}

func (g *replyGuard) Write(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.in.partial() {
		return 0, g.fail(errors.New("a write while a reply is partly read"))
	}
	if g.reading { // a new round trip
		g.avail, g.reading = replyBase, false
	}
	g.avail = min(g.avail+replyPerByte*int64(len(p)), 1<<50)
	done, bad := g.out.scan(p, nil)
	if bad != nil {
		return 0, g.fail(fmt.Errorf("a command that is not RESP: %w", bad))
	}
	g.commands += int64(done)
	return g.Conn.Write(p)
}

// owes reports whether a command written has not had its whole reply
// yet. It is called from the goroutine that uses the connection (see
// stallConn).
func (g *replyGuard) owes() bool { return g.commands > g.replies }

// fail closes the connection for good with cause.
func (g *replyGuard) fail(cause error) error {
	g.err = fmt.Errorf("%w: %w (connection closed)", errBadReply, cause)
	_ = g.Conn.Close()
	return g.err
}

// respScanner follows a stream of RESP values (RESP2 and RESP3, as go-redis
// reads them) without keeping them: it counts the top-level values that
// end, and with a budget charges each header what go-redis will allocate
// for it. Its zero value is at the start of a value.
type respScanner struct {
	// head holds the first bytes of the line being read (its type and,
	// for a header, its length); lineLen counts all of it.
	head    [24]byte
	lineLen int
	// skip is what is left of a bulk string's body and its CRLF.
	skip int64
	// stack holds the elements left in each aggregate open, innermost
	// last; attr marks an attribute, whose end leaves its value to come.
	stack [maxReplyDepth]struct {
		left int64
		attr bool
	}
	depth int
}

// partial reports whether s is inside a value.
func (s *respScanner) partial() bool { return s.lineLen > 0 || s.skip > 0 || s.depth > 0 }

// scan follows b and returns how many top-level values ended in it. With
// avail, each header is charged what go-redis allocates for it (a line its
// length, a bulk string its length, an aggregate elemBytes an element)
// against *avail, and one it cannot pay is an error. After an error s is
// of no further use.
func (s *respScanner) scan(b []byte, avail *int64) (done int, err error) {
	for len(b) > 0 {
		if s.skip > 0 {
			n := min(int64(len(b)), s.skip)
			b, s.skip = b[n:], s.skip-n
			if s.skip == 0 {
				done += s.end()
			}
			continue
		}
		i := bytes.IndexByte(b, '\n')
		line := b
		if i >= 0 {
			line = b[:i+1]
		}
		if s.lineLen < len(s.head) {
			copy(s.head[s.lineLen:], line)
		}
		s.lineLen += len(line)
		b = b[len(line):]
		if s.lineLen > maxReplyLine {
			return done, fmt.Errorf("a line longer than %d bytes", maxReplyLine)
		}
		if i < 0 {
			break
		}
		n, err := s.header(avail)
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// header acts on the line just read whole, and returns how many top-level
// values ended with it.
func (s *respScanner) header(avail *int64) (int, error) {
	size := s.lineLen
	head := s.head[:min(size, len(s.head))]
	s.lineLen = 0
	if size < 3 {
		return 0, fmt.Errorf("an empty line")
	}
	charge := func(n int64) error {
		if avail == nil {
			return nil
		}
		if n > *avail {
			return fmt.Errorf("%q announces %d bytes, past the round trip's bound (%d bytes left)", head[:min(len(head), size-2)], n, *avail)
		}
		*avail -= n
		return nil
	}
	if err := charge(int64(size)); err != nil {
		return 0, err
	}
	kind := head[0]
	switch kind {
	case '+', '-', ':', '_', ',', '#', '(':
		return s.end(), nil
	case '$', '!', '=', '*', '~', '>', '%', '|':
	default:
		return 0, fmt.Errorf("a reply of unknown type %q", kind)
	}
	if size > len(s.head) {
		return 0, fmt.Errorf("a length of more than %d digits", len(s.head)-3)
	}
	n, err := strconv.ParseInt(string(head[1:size-2]), 10, 64)
	if err != nil || n < -1 || head[size-2] != '\r' {
		return 0, fmt.Errorf("a bad header %q", head[:size])
	}
	if n <= 0 { // nil or empty
		if n == 0 && (kind == '$' || kind == '!' || kind == '=') {
			s.skip = 2
			return 0, nil
		}
		if kind == '|' {
			return 0, nil // an empty attribute: its value follows
		}
		return s.end(), nil
	}
	if n > 1<<58 {
		return 0, fmt.Errorf("a length of %d", n)
	}
	switch kind {
	case '$', '!', '=':
		if err := charge(n); err != nil {
			return 0, err
		}
		s.skip = n + 2
		return 0, nil
	case '%', '|':
		n *= 2
	}
	if err := charge(elemBytes * n); err != nil {
		return 0, err
	}
	if s.depth == maxReplyDepth {
		return 0, fmt.Errorf("aggregates nested more than %d deep", maxReplyDepth)
	}
	s.stack[s.depth].left, s.stack[s.depth].attr = n, kind == '|'
	s.depth++
	return 0, nil
}

// end records that a value ended, and returns 1 when it was a top-level
// one.
func (s *respScanner) end() int {
	for s.depth > 0 {
		f := &s.stack[s.depth-1]
		if f.left--; f.left > 0 {
			return 0
		}
		s.depth--
		if f.attr {
			return 0 // the value the attribute describes follows
		}
	}
	return 1
}
