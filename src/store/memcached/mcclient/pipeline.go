package mcclient

import (
	"bufio"
	"bytes"
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
	"time"

	cbackoff "github.com/cenkalti/backoff/v5"
)

// verb is a command the client sends.
type verb uint8

const (
	verbIncr verb = iota + 1
	verbDecr
	verbAdd
	verbCAS
	verbGets
	verbVersion
	// verbAddNum is add with the decimal num as its data: a new counter,
	// without a value slice to allocate.
	verbAddNum
)

// request is one command and, once answered, its answer. It belongs to the
// caller until submit, then to its connection until done is signalled,
// then to the caller again.
type request struct {
	verb  verb
	key   string
	num   uint64 // in: incr/decr delta, cas unique; out: new value, gets' cas unique
	value []byte // in: add/cas data (copied at submit); out: gets' value
	exp   int32
	// sent is when the request was written (zero while it waits to be);
	// guarded by its connection's mu.
	sent time.Time
	err  error
	done chan struct{} // capacity 1: signalled once
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func getRequest() *request { return requestPool.Get().(*request) }

// putRequest recycles r, which must be answered and its signal consumed.
func putRequest(r *request) {
	done := r.done
	*r = request{done: done}
	requestPool.Put(r)
}

// appendTo appends r's command line (and data block) to b.
func (r *request) appendTo(b []byte) []byte {
	switch r.verb {
	case verbIncr, verbDecr:
		if r.verb == verbIncr {
			b = append(b, "incr "...)
		} else {
			b = append(b, "decr "...)
		}
		b = append(b, r.key...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, r.num, 10)
		return append(b, "\r\n"...)
	case verbAdd, verbCAS:
		if r.verb == verbAdd {
			b = append(b, "add "...)
		} else {
			b = append(b, "cas "...)
		}
		b = append(b, r.key...)
		b = append(b, " 0 "...) // flags
		b = strconv.AppendInt(b, int64(r.exp), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(len(r.value)), 10)
		if r.verb == verbCAS {
			b = append(b, ' ')
			b = strconv.AppendUint(b, r.num, 10)
		}
		b = append(b, "\r\n"...)
		b = append(b, r.value...)
		return append(b, "\r\n"...)
	case verbAddNum:
		var digits [20]byte
		d := strconv.AppendUint(digits[:0], r.num, 10)
		b = append(b, "add "...)
		b = append(b, r.key...)
		b = append(b, " 0 "...)
		b = strconv.AppendInt(b, int64(r.exp), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(len(d)), 10)
		b = append(b, "\r\n"...)
		b = append(b, d...)
		return append(b, "\r\n"...)
	case verbGets:
		b = append(b, "gets "...)
		b = append(b, r.key...)
		return append(b, "\r\n"...)
	default:
		return append(b, "version\r\n"...)
	}
}

// Reconnection backoff: a connection that fails before any answer (a
// dial refused, a server frozen) waits from redialMin, doubling up to
// redialMax, before the next dial; requests meanwhile fail at once with
// the last error, so that an outage costs no waiting. The first answer on
// a connection ends the run of failures: the next one starts again from
// redialMin.
const (
	redialMin = 20 * time.Millisecond
	redialMax = time.Second
)

// readBufferSize is the reader's buffer: many answers per read syscall.
const readBufferSize = 16 << 10

// maxSpare bounds the write buffer kept between writes.
const maxSpare = 64 << 10

// pconn is one pipelined connection to a server, redialed when it breaks.
// Requests queue in order, and the connection's reader goroutine matches
// answers to the queue's head.
//
// Flush when idle: a connection has at most one batch of requests written
// and not yet all answered. A request that finds the connection idle is
// written by its caller; one that finds a batch in flight waits for its
// last answer, and the reader then writes everything queued meanwhile in
// one write. Either writer first yields the processor once
// (runtime.Gosched, with the write claimed): the goroutines already
// runnable, other calls on their way to the store, queue their requests
// meanwhile and go in the same write. A lone request finds nothing else to
// run and goes out at once, so this adds no latency at low load, and no
// timer is involved. Batches so grow with the load, and each costs one
// write and about one read on both sides, the main cost of a shallow
// pipeline (the Redis store schedules its pipelines so too); see also
// server.choose, which keeps the load on one connection while it keeps up.
type pconn struct {
	c *Client
	s *server
	// pending counts the requests queued or under way, and up is set
	// while connected (for choose).
	pending atomic.Int64
	up      atomic.Bool

	// mu guards everything below.
	mu sync.Mutex
	nc net.Conn // nil while down
	// gen changes when a connection is made and when it breaks; a
	// reader serves the gen it was started for.
	gen uint64
	// queue holds the requests sent or to be sent, oldest first; the
	// last unsent have their bytes in wbuf.
	queue   ring
	unsent  int
	wbuf    []byte
	spare   []byte
	writing bool
	// rdl is the read deadline set: the oldest written request's sent
	// plus Timeout, zero when none waits. rdlNano mirrors it (Unix
	// nanoseconds, 0 for none) for the reader, which reads without mu.
	rdl     time.Time
	rdlNano atomic.Int64
	// answered is set by the first answer on the current connection;
	// dialed is when its dial started.
	answered bool
	dialed   time.Time
	// dialing is closed when the dial under way ends.
	dialing chan struct{}
	// retryAt is when the next dial may start; lastErr fails requests
	// until then.
	retryAt time.Time
	redial  cbackoff.ExponentialBackOff // from redialMin, doubling to redialMax
	backoff time.Duration               // the last wait redial gave
	lastErr error
	closed  bool
	// idleClose is set on a connection past Idle: it is closed once
	// nothing is queued or under way on it.
	idleClose bool
	// readerDone is closed when the current connection's reader returns.
	readerDone chan struct{}
}

func newPconn(c *Client, s *server) *pconn {
	pc := &pconn{c: c, s: s}
	pc.redial = cbackoff.ExponentialBackOff{InitialInterval: redialMin, Multiplier: 2, MaxInterval: redialMax}
	pc.redial.Reset()
	return pc
}

// submit queues r, dialing first when the connection is down, and writes
// it unless a write is under way (whose writer then writes it) or hold is
// set (flush will).
func (pc *pconn) submit(ctx context.Context, r *request, hold bool) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if err := pc.readyLocked(ctx); err != nil {
		return err
	}
	pc.wbuf = r.appendTo(pc.wbuf)
	pc.queue.push(r)
	pc.unsent++
	pc.pending.Add(1)
	if !hold {
		pc.flushIdleLocked()
	}
	return nil
}

// flush writes what is queued if the connection is idle (see pconn).
func (pc *pconn) flush() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.flushIdleLocked()
}

// flushIdleLocked writes what is queued when nothing written awaits its
// answer and no write is under way; otherwise the reader will, after the
// last answer. It first lets the other runnable goroutines run once, with
// mu released and the write claimed, so that the requests they are about
// to queue go in the same write (see pconn).
func (pc *pconn) flushIdleLocked() {
	if pc.writing || pc.unsent == 0 || pc.queue.len() > pc.unsent {
		return
	}
	pc.writing = true
	pc.mu.Unlock()
	runtime.Gosched()
	pc.mu.Lock()
	pc.flushLocked()
	pc.writing = false
}

// flushLocked writes the queued bytes, with mu released during the write,
// and again on a connection dialed meanwhile if the write broke the old one.
func (pc *pconn) flushLocked() {
	timeout := pc.c.cfg.Timeout
	for pc.unsent > 0 && pc.nc != nil && pc.queue.len() == pc.unsent {
		buf, n := pc.wbuf, pc.unsent
		pc.wbuf, pc.unsent = pc.spare[:0], 0
		pc.spare = nil
		now := time.Now()
		sent := now
		if !pc.answered {
			// Until the first answer, the dial counts in the
			// requests' Timeout, as in one round trip.
			sent = pc.dialed
		}
		pc.queue.stampLast(n, sent)
		if pc.queue.len() == n { // nothing older awaits its answer
			pc.setReadDeadlineLocked(sent.Add(timeout))
		}
		nc, gen := pc.nc, pc.gen
		pc.mu.Unlock()
		// The write deadline is per write; a blocked write past it
		// breaks the connection.
		err := nc.SetWriteDeadline(now.Add(timeout))
		if err == nil {
			_, err = nc.Write(buf)
		}
		pc.mu.Lock()
		if cap(buf) <= maxSpare {
			pc.spare = buf[:0]
		}
		if err != nil {
			// A connection dialed since (for requests that queued
			// meanwhile) is written on the next turn.
			pc.breakLocked(gen, fmt.Errorf("write: %w", err))
		}
	}
}

// setReadDeadlineLocked sets the connection's read deadline to t (zero:
// none) if it is not that already.
func (pc *pconn) setReadDeadlineLocked(t time.Time) {
	if t.Equal(pc.rdl) || pc.nc == nil {
		return
	}
	pc.rdl = t
	if t.IsZero() {
		pc.rdlNano.Store(0)
	} else {
		pc.rdlNano.Store(t.UnixNano())
	}
	_ = pc.nc.SetReadDeadline(t)
}

// maxLateReads bounds the reads a reader tries again because it started
// them after the read deadline (see connReader).
const maxLateReads = 3

// lateReadGrace is how long a late reader's second look waits (see
// connReader): what is in the socket comes back at once, and a server
// that sent nothing is not given more time.
const lateReadGrace = 10 * time.Millisecond

// connReader is connection gen's reader's view of nc. A read that fails
// on the read deadline although this goroutine started it after that
// deadline had passed says nothing of memcached: the answers may have
// been waiting in the socket all along, and Go fails a read whose
// deadline has passed before looking. This process was late (a busy host
// runs the reader late), so the read looks again, with the deadline moved
// lateReadGrace past now, at most maxLateReads times: what had arrived is
// read (and the rest of it given a fresh Timeout), and a connection breaks
// for a missing answer only when nothing had, so that memcached's answers
// are timed from the write to their arrival, not to when this process
// got round to reading them.
type connReader struct {
	pc    *pconn
	nc    net.Conn
	gen   uint64
	clock bool      // note when each read returned, in last
	last  time.Time // for the round-trip times
}

func (r *connReader) Read(p []byte) (int, error) {
	for late := 0; ; late++ {
		start := time.Now()
		n, err := r.nc.Read(p)
		if r.clock {
			r.last = time.Now()
		}
		if n > 0 && late > 0 {
			r.pc.extendDeadline(r.gen, r.nc, r.pc.c.cfg.Timeout)
		}
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) || late == maxLateReads {
			return n, err
		}
		if dl := r.pc.rdlNano.Load(); dl == 0 || start.UnixNano() < dl || !r.pc.extendDeadline(r.gen, r.nc, lateReadGrace) {
			return n, err
		}
	}
}

// extendDeadline moves connection gen's read deadline to d from now, for
// a reader that was late (see connReader). It reports whether gen is
// still the connection.
func (pc *pconn) extendDeadline(gen uint64, nc net.Conn, d time.Duration) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.gen != gen || pc.nc != nc {
		return false
	}
	pc.setReadDeadlineLocked(time.Now().Add(d))
	return true
}

// readyLocked returns when the connection is up, dialing it if needed
// (one dial at a time; the others wait for it, at most until their ctx
// ends). Within the backoff after a failure it fails at once with the
// last error.
func (pc *pconn) readyLocked(ctx context.Context) error {
	if pc.closed {
		return ErrClientClosed
	}
	for pc.nc == nil {
		if ch := pc.dialing; ch != nil {
			pc.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				pc.mu.Lock()
				return gaveUp(ctx)
			}
			pc.mu.Lock()
			if pc.closed {
				return ErrClientClosed
			}
			continue
		}
		if time.Now().Before(pc.retryAt) {
			return pc.lastErr
		}
		ch := make(chan struct{})
		pc.dialing = ch
		dialed := time.Now()
		pc.mu.Unlock()
		// The dial is bounded by Timeout, not by the request's ctx:
		// the connection serves other requests too.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pc.c.cfg.Timeout)
		nc, err := pc.c.cfg.Dial(dctx, "tcp", pc.s.addr)
		cancel()
		pc.mu.Lock()
		pc.dialing = nil
		close(ch)
		if err != nil {
			pc.lastErr = fmt.Errorf("memcached: %s: %w", pc.s.addr, err)
			pc.backOffLocked()
			return pc.lastErr
		}
		if pc.closed { // closed while dialing
			_ = nc.Close()
			return ErrClientClosed
		}
		pc.nc, pc.answered, pc.dialed, pc.rdl = nc, false, dialed, time.Time{}
		pc.rdlNano.Store(0)
		pc.up.Store(true)
		pc.gen++
		pc.readerDone = make(chan struct{})
		go pc.read(nc, pc.gen, pc.readerDone)
	}
	return nil
}

// backOffLocked schedules the next dial after a failure.
func (pc *pconn) backOffLocked() {
	pc.backoff = pc.redial.NextBackOff()
	pc.retryAt = time.Now().Add(pc.backoff)
}

// breakLocked closes connection gen, if it is still the current one, and
// fails every request queued on it with err. A connection that had
// answered and broke for another reason than a late answer (a server
// restarted) may be redialed at once; otherwise the next dial backs off.
func (pc *pconn) breakLocked(gen uint64, err error) {
	if gen != pc.gen || pc.nc == nil {
		return
	}
	_ = pc.nc.Close()
	pc.nc = nil
	pc.up.Store(false)
	pc.gen++ // its reader, still parsing maybe, sees it gone
	pc.rdl = time.Time{}
	pc.rdlNano.Store(0)
	pc.wbuf, pc.unsent = pc.wbuf[:0], 0
	if errors.Is(err, ErrClientClosed) {
		err = fmt.Errorf("memcached: %s: %w", pc.s.addr, err)
	} else {
		// memcached failed: each request on the connection is a failure
		// of the server, counted here, whether its caller still waits
		// or gave up at its own deadline long ago.
		err = fmt.Errorf("memcached: %s: %w: %w", pc.s.addr, ErrBroken, err)
		if pc.c.cfg.Broken != nil {
			pc.c.cfg.Broken(pc.s.addr, pc.queue.len())
		}
	}
	pc.lastErr = err
	if pc.answered && !errors.Is(err, os.ErrDeadlineExceeded) {
		pc.redial.Reset()
		pc.backoff, pc.retryAt = 0, time.Time{}
	} else {
		pc.backOffLocked()
	}
	for r := pc.queue.pop(); r != nil; r = pc.queue.pop() {
		pc.complete(r, err)
	}
}

// complete hands r back to its caller with err. r must not be touched
// afterwards.
func (pc *pconn) complete(r *request, err error) {
	r.err = err
	pc.pending.Add(-1)
	pc.s.queued.Add(-1)
	r.done <- struct{}{}
}

// answer is what the reader parsed for a request, kept apart from the
// request until it is popped: a concurrent break may fail the request
// meanwhile.
type answer struct {
	num   uint64
	value []byte
	err   error
}

// read is connection gen's reader: it reads the answers in order, each
// for the oldest request queued, until the connection breaks.
func (pc *pconn) read(nc net.Conn, gen uint64, done chan struct{}) {
	defer close(done)
	tr := &connReader{pc: pc, nc: nc, gen: gen, clock: pc.c.cfg.Observe != nil}
	br := bufio.NewReaderSize(tr, readBufferSize)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			pc.fail(gen, readError(err, pc.c.cfg.Timeout))
			return
		}
		pc.mu.Lock()
		if pc.gen != gen {
			pc.mu.Unlock()
			return
		}
		head := pc.queue.peek()
		if head == nil || head.sent.IsZero() {
			pc.breakLocked(gen, fmt.Errorf("answer %q to no request", truncate(line)))
			pc.mu.Unlock()
			return
		}
		v, sent := head.verb, head.sent
		pc.mu.Unlock()
		a, desync := parseAnswer(v, line, br, pc.c.cfg.MaxValue)
		if desync != nil {
			pc.fail(gen, desync)
			return
		}
		if pc.c.cfg.Observe != nil {
			pc.c.cfg.Observe(tr.last.Sub(sent))
		}
		pc.mu.Lock()
		if pc.gen != gen { // broken meanwhile: head has failed
			pc.mu.Unlock()
			return
		}
		r := pc.queue.pop()
		if !pc.answered {
			// The connection serves: the failures in a row are over,
			// and a later one backs off from redialMin again.
			pc.answered, pc.backoff = true, 0
			pc.redial.Reset()
		}
		if next := pc.queue.peek(); next == nil || next.sent.IsZero() {
			pc.setReadDeadlineLocked(time.Time{})
		} else {
			pc.setReadDeadlineLocked(next.sent.Add(pc.c.cfg.Timeout))
		}
		r.num, r.value = a.num, a.value
		pc.complete(r, a.err)
		pc.flushIdleLocked()
		if pc.idleClose && pc.queue.len() == 0 && !pc.closed {
			pc.closeIdleLocked()
			pc.mu.Unlock()
			return
		}
		pc.mu.Unlock()
	}
}

// closeIdleLocked closes the connection, which has nothing queued or under
// way, for being past Idle: no error, no backoff; the next request on it
// dials again.
func (pc *pconn) closeIdleLocked() {
	_ = pc.nc.Close()
	pc.nc = nil
	pc.up.Store(false)
	pc.gen++ // its reader returns
	pc.rdl = time.Time{}
	pc.rdlNano.Store(0)
}

// fail breaks connection gen with err.
func (pc *pconn) fail(gen uint64, err error) {
	pc.mu.Lock()
	pc.breakLocked(gen, err)
	pc.mu.Unlock()
}

// readError names a late answer as such.
func readError(err error, timeout time.Duration) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w within %v: %w", ErrNoAnswer, timeout, err)
	}
	if errors.Is(err, bufio.ErrBufferFull) {
		return errors.New("answer line too long")
	}
	return fmt.Errorf("read: %w", err)
}

// drainAndClose refuses new requests on pc, waits until the requests
// under way are answered or deadline passes, then closes the connection
// (failing what is left) and waits a little for its reader to return.
func (pc *pconn) drainAndClose(deadline time.Time) {
	pc.mu.Lock()
	pc.closed = true
	for pc.queue.len() > 0 && pc.nc != nil && time.Now().Before(deadline) {
		pc.mu.Unlock()
		time.Sleep(time.Millisecond)
		pc.mu.Lock()
	}
	pc.breakLocked(pc.gen, ErrClientClosed)
	done := pc.readerDone
	pc.mu.Unlock()
	if done != nil {
		t := time.NewTimer(50 * time.Millisecond)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}
}

// Answer lines.
var (
	ansStored    = []byte("STORED\r\n")
	ansNotStored = []byte("NOT_STORED\r\n")
	ansExists    = []byte("EXISTS\r\n")
	ansNotFound  = []byte("NOT_FOUND\r\n")
	ansEnd       = []byte("END\r\n")
	ansValue     = []byte("VALUE ")
	ansVersion   = []byte("VERSION ")
	ansClient    = []byte("CLIENT_ERROR ")
	ansServer    = []byte("SERVER_ERROR ")
)

// parseAnswer reads the answer to a request of verb v, whose first line is
// line (more lines are read from br for gets). An answer memcached gives
// (a miss, a conflict, CLIENT_ERROR...) is in a.err; desync is an answer
// that does not fit the request, after which the answers no longer match
// the requests: the connection must be closed. A gets answer's data block
// may be maxValue bytes at most.
func parseAnswer(v verb, line []byte, br *bufio.Reader, maxValue int) (a answer, desync error) {
	if bytes.HasPrefix(line, ansServer) {
		a.err = &ServerError{Msg: string(trimEOL(line[len(ansServer):]))}
		return a, nil
	}
	if bytes.HasPrefix(line, ansClient) {
		a.err = &ClientError{Msg: string(trimEOL(line[len(ansClient):]))}
		if v == verbAdd || v == verbAddNum || v == verbCAS {
			// memcached may have read the data block as a command and
			// answer it too: close the connection to be sure.
			return a, fmt.Errorf("%w (the connection may be out of step)", a.err)
		}
		return a, nil
	}
	switch v {
	case verbIncr, verbDecr:
		if bytes.Equal(line, ansNotFound) {
			a.err = ErrCacheMiss
			return a, nil
		}
		n, ok := parseUint(trimEOL(line))
		if !ok {
			return a, unexpected(v, line)
		}
		a.num = n
		return a, nil
	case verbAdd, verbAddNum, verbCAS:
		switch {
		case bytes.Equal(line, ansStored):
		case bytes.Equal(line, ansNotStored):
			a.err = ErrNotStored
		case bytes.Equal(line, ansExists):
			a.err = ErrExists
		case bytes.Equal(line, ansNotFound):
			a.err = ErrCacheMiss
		default:
			return a, unexpected(v, line)
		}
		return a, nil
	case verbGets:
		return parseGets(line, br, maxValue)
	default:
		if !bytes.HasPrefix(line, ansVersion) {
			return a, unexpected(v, line)
		}
		return a, nil
	}
}

// parseGets reads a gets answer: "END", or "VALUE <key> <flags> <bytes>
// <cas unique>", the data block (maxValue bytes at most) and "END".
func parseGets(line []byte, br *bufio.Reader, maxValue int) (a answer, desync error) {
	if bytes.Equal(line, ansEnd) {
		a.err = ErrCacheMiss
		return a, nil
	}
	if !bytes.HasPrefix(line, ansValue) {
		return a, unexpected(verbGets, line)
	}
	f := bytes.Fields(trimEOL(line[len(ansValue):]))
	if len(f) != 4 {
		return a, unexpected(verbGets, line)
	}
	size, ok1 := parseUint(f[2])
	casID, ok2 := parseUint(f[3])
	if !ok1 || !ok2 || size > uint64(maxValue) {
		return a, unexpected(verbGets, line)
	}
	data := make([]byte, size+2)
	if _, err := io.ReadFull(br, data); err != nil {
		return a, fmt.Errorf("read: %w", err)
	}
	if !bytes.HasSuffix(data, []byte("\r\n")) {
		return a, errors.New("gets: data block not ended by CRLF")
	}
	end, err := br.ReadSlice('\n')
	if err != nil {
		return a, fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(end, ansEnd) {
		return a, unexpected(verbGets, end)
	}
	a.value, a.num = data[:size:size], casID
	return a, nil
}

func unexpected(v verb, line []byte) error {
	return fmt.Errorf("unexpected answer to %s: %q", v, truncate(line))
}

func (v verb) String() string {
	switch v {
	case verbIncr:
		return "incr"
	case verbDecr:
		return "decr"
	case verbAdd, verbAddNum:
		return "add"
	case verbCAS:
		return "cas"
	case verbGets:
		return "gets"
	default:
		return "version"
	}
}

// truncate shortens a line for an error message.
func truncate(line []byte) []byte {
	if len(line) > 64 {
		return line[:64]
	}
	return line
}

func trimEOL(line []byte) []byte { return bytes.TrimSuffix(line, []byte("\r\n")) }

// parseUint parses a decimal uint64 without allocating.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// ring is a FIFO of requests that grows as needed.
type ring struct {
	buf        []*request
	head, size int
}

func (q *ring) len() int { return q.size }

func (q *ring) push(r *request) {
	if q.size == len(q.buf) {
		nb := make([]*request, max(2*len(q.buf), 16))
		for i := range q.size {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = r
	q.size++
}

func (q *ring) peek() *request {
	if q.size == 0 {
		return nil
	}
	return q.buf[q.head]
}

func (q *ring) pop() *request {
	if q.size == 0 {
		return nil
	}
	r := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return r
}

// stampLast sets the sent time of the newest n requests.
func (q *ring) stampLast(n int, t time.Time) {
	for i := q.size - n; i < q.size; i++ {
		q.buf[(q.head+i)%len(q.buf)].sent = t
	}
}
