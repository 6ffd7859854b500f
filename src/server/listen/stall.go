// Package listen hardens the server's listeners against clients that hold
// what they do not use: connection caps (Limit, TrackRequests), the stall
// watch of gRPC connections and calls (StallWatch), the protocol check
// (NewProtocolCheck), plaintext and TLS on one port (Sniff), Unix sockets
// and the debug listener's Host check (AllowHosts). Package server wires
// them.
//
// The stall watch is written here because grpc-go's own bounds (keepalive,
// MaxConnectionIdle, the handshake's ConnectionTimeout) take any frame or
// ping as life: a client that sends a frame a byte at a time, or a call's
// headers and never its message, holds its stream and its place for ever
// (TestSlowlorisFramesAreCut, TestSlowRequestEndsItsCallAlone). It costs
// 426 ns and no allocation per call (BenchmarkStallWatchCall).
package listen

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// Bounds of the answers a gRPC client does not let out (issue 24, case 5).
// A client that never reads (it grants no HTTP/2 flow-control window, or
// does not read its socket) leaves each call's answer queued in grpc-go
// once the call is done: grpc-go keeps the stream until its last frame is
// written, so the only bound was GRPC_MAX_CONCURRENT_STREAMS per
// connection times GRPC_MAX_CONNECTIONS, a few KB each (24,576 such calls
// kept 57 MB live in the heap, about 2.3 KB each, RSS about twice that;
// 300 connections took RSS from 21 to 575 MB).
const (
	// grpcWriteStall is how long a connection may leave answers waiting
	// on the client's flow control, or a write to its socket unfinished,
	// before it is closed.
	grpcWriteStall = 10 * time.Second
	// grpcMaxWaitingAnswers bounds the answers waiting on their clients'
	// flow control, all connections together: past it the connection
	// holding the most is closed at once.
	grpcMaxWaitingAnswers = 4096
	// grpcMaxHalfSent bounds the calls whose request has not come whole
	// (headers sent, the message not ended), all connections together:
	// past it the connection holding the most is closed at once. Each
	// holds a goroutine of grpc-go's waiting for the message, which
	// nothing else bounded but connections × streams (10,000 × 1,024). A
	// call whose request is not whole grpcWriteStall after its headers
	// came ends alone (awaitRequest).
	grpcMaxHalfSent = 4096
)

// HTTP/2 frame types and flags the watch reads (RFC 9113, section 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8

	// grpcPrefix is the length of the prefix of a gRPC message: a
	// compressed flag and the message's length, 4 bytes big-endian.
	grpcPrefix = 5

	settingInitialWindowSize = 0x4

	// h2DefaultWindow is the flow-control window before any SETTINGS or
	// WINDOW_UPDATE, for the connection and for each stream.
	h2DefaultWindow = 65535
	// h2MaxPayloadKept bounds the payload of a SETTINGS or WINDOW_UPDATE
	// frame the watch keeps to read: grpc-go refuses frames larger than
	// 16 KiB anyway.
	h2MaxPayloadKept = 16 << 10
	// h2MaxStreams bounds the streams a connection's watch tracks: far
	// above GRPC_MAX_CONCURRENT_STREAMS, past which grpc-go refuses them.
	h2MaxStreams = 1 << 16
)

// clientPreface starts every HTTP/2 connection from a client.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// StallWatch watches every gRPC connection's HTTP/2 frames, both ways, to
// tell when the client keeps the server's answers from going out: the
// answers waiting on the client's flow-control window (the connection's
// or the stream's) are counted, and a connection is closed when it leaves
// some waiting for grpcWriteStall, when a write to its socket takes that
// long, or, the one holding the most, when all connections together leave
// more than maxWaiting. It also closes a connection whose client leaves a
// frame, or a header block (HEADERS and its CONTINUATION frames), not
// whole for grpcWriteStall: grpc-go reads a connection's frames in turn,
// so until it is whole no call on the connection goes on, and nothing
// else bounds it but GRPC_MAX_CONNECTION_IDLE (issue 36, item 6: HEADERS
// continued by CONTINUATION frames sent one at a time, or two bytes of a
// frame header, held a connection 5 min). And it tells when a connection
// is in use, its client's messages coming whole, which
// GRPC_MAX_CONNECTION_IDLE and the listener's choice at its cap go by. It
// reads frame headers only (and the payloads of SETTINGS and
// WINDOW_UPDATE, and the prefixes of the client's messages), never a
// message. It is safe for concurrent use.
type StallWatch struct {
	stall time.Duration
	// maxWait is grpcMaxRequestWait (awaitRequest).
	maxWait     time.Duration
	maxWaiting  int64
	maxHalfSent int64
	waiting     atomic.Int64 // answers waiting, all connections
	halfSent    atomic.Int64 // requests not whole, all connections
	awaited     atomic.Int64 // calls whose request is awaited (awaitRequest)
	start       time.Time    // when the watch began: writes' deadlines count from it
	closed      *stats.Counter
	// callsEnded counts the calls ended for a request late (awaitRequest).
	callsEnded *stats.Counter
	// idle is GRPC_MAX_CONNECTION_IDLE (0: never): a connection whose
	// client sent no whole message for that long is closed, calls open or
	// not (see checkIdle); idleClosed counts them.
	idle       time.Duration
	idleClosed *stats.Counter

	// mu guards conns.
	mu    sync.Mutex
	conns map[*watchedConn]struct{}
}

// NewStallWatch returns a watch that counts in reg; idle is
// GRPC_MAX_CONNECTION_IDLE.
func NewStallWatch(reg *stats.Registry, idle time.Duration) *StallWatch {
	w := &StallWatch{
		idle:        idle,
		stall:       grpcWriteStall,
		maxWait:     grpcMaxRequestWait,
		maxWaiting:  grpcMaxWaitingAnswers,
		maxHalfSent: grpcMaxHalfSent,
		closed:      reg.Counter("ratelimit.server.grpc_stalled_connections_closed"),
		callsEnded:  reg.Counter("ratelimit.server.grpc_stalled_calls_ended"),
		idleClosed:  reg.Counter("ratelimit.server.grpc_idle_connections_closed"),
		conns:       map[*watchedConn]struct{}{},
		start:       time.Now(),
	}
	reg.GaugeFunc("ratelimit.server.grpc_answers_waiting", w.waiting.Load)
	return w
}

// Credentials wraps a listener's transport credentials (nil: plaintext)
// so that every connection they hand grpc-go is watched.
func (w *StallWatch) Credentials(inner credentials.TransportCredentials) credentials.TransportCredentials {
	if inner == nil {
		inner = insecure.NewCredentials()
	}
	return watchCreds{TransportCredentials: inner, w: w}
}

type watchCreds struct {
	credentials.TransportCredentials
	w *StallWatch
}

// ServerHandshake watches the connection the inner handshake returns.
func (c watchCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	return c.w.watch(conn), info, nil
}

// Clone keeps the watch.
func (c watchCreds) Clone() credentials.TransportCredentials {
	return watchCreds{TransportCredentials: c.TransportCredentials.Clone(), w: c.w}
}

func (w *StallWatch) watch(c net.Conn) *watchedConn {
	wc := &watchedConn{
		Conn: c, w: w,
		in:      frameParser{skip: len(clientPreface)},
		initWin: h2DefaultWindow, connWin: h2DefaultWindow,
		streams: map[uint32]h2Stream{},
		slot:    limitConnOf(c),
		used:    time.Now(),
	}
	if w.idle > 0 {
		wc.mu.Lock()
		wc.idleTimer = time.AfterFunc(w.idle, wc.checkIdle)
		wc.mu.Unlock()
	}
	w.mu.Lock()
	w.conns[wc] = struct{}{}
	w.mu.Unlock()
	return wc
}

// closeMost closes the connection with the most of what count counts,
// when all connections together (total) are still past bound.
func (w *StallWatch) closeMost(total *atomic.Int64, bound int64, count func(*watchedConn) int64) {
	if total.Load() <= bound {
		return
	}
	w.mu.Lock()
	var worst *watchedConn
	var most int64
	for c := range w.conns {
		if m := count(c); m > most {
			worst, most = c, m
		}
	}
	w.mu.Unlock()
	if worst != nil {
		worst.closeStalled()
	}
}

// watchedConn is a gRPC connection whose frames the watch reads.
type watchedConn struct {
	net.Conn
	w    *StallWatch
	once sync.Once
	// slot is the connection's slot of GRPC_MAX_CONNECTIONS, nil if none:
	// its idleSince is used, for the listener's choice of a connection to
	// close at its cap.
	slot *limitConn

	// waitingNow is the answers this connection leaves waiting, and
	// halfSentNow its requests not whole, for the watch's choice of the
	// connection holding the most.
	waitingNow, halfSentNow atomic.Int64
	// untracked: a stream was opened past h2MaxStreams, uncounted.
	untracked atomic.Bool
	// writeBy is the write deadline last set, in nanoseconds of the
	// monotonic clock from the watch's start. A write moves it only once
	// an eighth of grpcWriteStall has passed: a deadline costs a timer's
	// change, and one per write cost a twentieth of the watch's work on a
	// call.
	writeBy atomic.Int64

	// mu guards the fields below: the reader's and the writer's
	// goroutines both parse.
	mu       sync.Mutex
	in, out  frameParser
	initWin  int64 // the client's SETTINGS_INITIAL_WINDOW_SIZE
	connWin  int64 // what the client lets the server send on the connection
	streams  map[uint32]h2Stream
	lastID   uint32 // the highest stream the client opened
	answered int    // streams whose answer started and did not end
	starved  int    // of those, with no window of their own left
	waiting  int64  // answers waiting on flow control: answered or starved
	// stallGen counts the stalls, so that the timer of one that ended
	// does nothing.
	stallGen uint64
	timer    *time.Timer
	// halfSent is the streams whose request has not come whole.
	halfSent int
	// used is when the client last sent a whole message (a unary call,
	// an RLQS report, a health watch's request), or when the connection
	// came: idle means no such use, not no stream open, since a stream
	// such as a health watch stays open with no message at all (issue 36,
	// item 1). gotMessage is set when one came in the bytes read now.
	// idleTimer looks at it GRPC_MAX_CONNECTION_IDLE later.
	used       time.Time
	gotMessage bool
	idleTimer  *time.Timer
	// blockSince is when the client's header block still open began (a
	// HEADERS frame without END_HEADERS, which CONTINUATION frames go
	// on), and partialSince when its frame still partly read did (the
	// first bytes of frame number partialFrame came in a read that ended
	// before it); zero when there is none. frameTimer looks at them
	// grpcWriteStall later; frameArmed while it is set.
	blockSince, partialSince time.Time
	partialFrame             uint64
	frameTimer               *time.Timer
	frameArmed               bool
	closed                   bool
}

// h2Stream is a stream the client opened and the server has not ended.
type h2Stream struct {
	win      int64 // what the client lets the server send on it
	answered bool  // the server's headers went out
	// sending holds until the request's first message has come whole,
	// or the client ends its side (END_STREAM): a unary call then runs,
	// and a stream (RLQS) is a stream, bounded on its own.
	sending bool
	// prefix holds the gRPC prefix of the message coming as it comes
	// (nprefix bytes), and left is how many bytes of that message are
	// still to come once the prefix has.
	prefix  [grpcPrefix]byte
	nprefix int
	left    int64
}

// connAddr is a watched connection's remote address as grpc-go gives it
// to a call (peer.Peer.Addr): it leads the call's tap to its connection.
type connAddr struct {
	net.Addr
	c *watchedConn
}

func (c *watchedConn) RemoteAddr() net.Addr { return connAddr{c.Conn.RemoteAddr(), c} }

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.readFrom(p[:n])
		c.mu.Unlock()
	}
	return n, err
}

// readFrom follows the bytes b the client sent. c.mu is held.
func (c *watchedConn) readFrom(b []byte) {
	c.in.feed(b, c.fromClient, c.payload)
	if c.gotMessage {
		c.gotMessage = false
		c.used = time.Now()
		if c.slot != nil {
			c.slot.idleSince.Store(c.used.UnixNano())
		}
	}
	c.partial()
	c.update()
}

// partial notes, after a read, whether the client left a frame partly
// read, and since when, and has the frames looked at in grpcWriteStall
// if a frame or a header block is not whole. c.mu is held.
func (c *watchedConn) partial() {
	switch {
	case !c.in.partial():
		c.partialSince = time.Time{}
	case c.partialSince.IsZero() || c.partialFrame != c.in.frames:
		c.partialSince, c.partialFrame = time.Now(), c.in.frames
	}
	if c.frameArmed || c.closed || c.partialSince.IsZero() && c.blockSince.IsZero() {
		return
	}
	c.frameArmed = true
	if c.frameTimer == nil {
		c.frameTimer = time.AfterFunc(c.w.stall, c.checkFrames)
	} else {
		c.frameTimer.Reset(c.w.stall)
	}
}

// checkFrames closes the connection if the client's frame or header block
// not whole is grpcWriteStall old, and looks again when it would be.
func (c *watchedConn) checkFrames() {
	c.mu.Lock()
	since := c.partialSince
	if since.IsZero() || !c.blockSince.IsZero() && c.blockSince.Before(since) {
		since = c.blockSince
	}
	if c.closed || since.IsZero() {
		c.frameArmed = false
		c.mu.Unlock()
		return
	}
	if left := c.w.stall - time.Since(since); left > 0 {
		c.frameTimer.Reset(left)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.closeStalled()
}

func (c *watchedConn) Write(p []byte) (int, error) {
	// A client that does not read its socket blocks the write: it too
	// gets grpcWriteStall, less at most an eighth (writeBy).
	now := time.Now()
	if by := int64(now.Sub(c.w.start) + c.w.stall); by-c.writeBy.Load() >= int64(c.w.stall/8) {
		c.writeBy.Store(by)
		_ = c.Conn.SetWriteDeadline(now.Add(c.w.stall))
	}
	n, err := c.Conn.Write(p)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.closeStalled()
	}
	c.wrote(p[:n])
	return n, err
}

// wrote follows the bytes b the server wrote.
func (c *watchedConn) wrote(b []byte) {
	if len(b) == 0 {
		return
	}
	c.mu.Lock()
	c.out.feed(b, c.fromServer, nil)
	c.update()
	c.mu.Unlock()
}

// Close closes the connection and takes its answers out of the count.
func (c *watchedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		if c.timer != nil {
			c.timer.Stop()
		}
		if c.frameTimer != nil {
			c.frameTimer.Stop()
		}
		if c.idleTimer != nil {
			c.idleTimer.Stop()
		}
		n, h := c.waiting, int64(c.halfSent)
		c.waiting, c.halfSent = 0, 0
		c.waitingNow.Store(0)
		c.halfSentNow.Store(0)
		c.mu.Unlock()
		c.w.waiting.Add(-n)
		c.w.halfSent.Add(-h)
		c.w.mu.Lock()
		delete(c.w.conns, c)
		c.w.mu.Unlock()
	})
	return err
}

// closeStalled closes the connection for leaving answers waiting, or a
// frame unfinished, once.
func (c *watchedConn) closeStalled() { c.closeFor(c.w.closed) }

// closeFor closes the connection and counts it in why, once.
func (c *watchedConn) closeFor(why *stats.Counter) {
	c.mu.Lock()
	done := c.closed
	c.closed = true
	c.mu.Unlock()
	if !done {
		why.Inc()
	}
	c.Close()
}

// checkIdle closes the connection if its client sent no whole message
// for GRPC_MAX_CONNECTION_IDLE while calls are open on it, and looks
// again when it could be so. grpc-go closes a connection without calls
// itself, gracefully (GOAWAY), but counts one with a stream open as busy
// however long the stream is silent: four client addresses holding every
// slot of GRPC_MAX_CONNECTIONS with a health watch each kept them until
// GRPC_MAX_CONNECTION_AGE and its grace, 25 h by default.
func (c *watchedConn) checkIdle() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	left := c.w.idle - time.Since(c.used)
	if left > 0 || len(c.streams) == 0 {
		if left <= 0 {
			left = c.w.idle
		}
		c.idleTimer.Reset(left)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.closeFor(c.w.idleClosed)
}

// fromClient applies a frame the client sent. c.mu is held.
func (c *watchedConn) fromClient(f frame) {
	switch {
	case f.typ == frameHeaders && f.flags&flagEndHeaders == 0:
		c.blockSince = time.Now()
	case f.typ == frameContinuation && f.flags&flagEndHeaders != 0:
		c.blockSince = time.Time{}
	}
	switch f.typ {
	case frameHeaders:
		_, ok := c.streams[f.stream]
		if !ok && f.stream > c.lastID && len(c.streams) >= h2MaxStreams {
			c.untracked.Store(true)
		}
		if !ok && f.stream > c.lastID && f.stream%2 == 1 && len(c.streams) < h2MaxStreams {
			c.lastID = f.stream
			s := h2Stream{win: c.initWin}
			if f.flags&flagEndStream == 0 {
				s.sending = true
				c.addHalfSent(1)
			}
			c.streams[f.stream] = s
			return
		}
		c.sent(f)
	case frameData:
		c.sent(f)
	case frameRSTStream:
		c.end(f.stream)
	case frameWindowUpdate:
		if len(f.payload) != 4 {
			return
		}
		inc := int64(binary.BigEndian.Uint32(f.payload) & 0x7fffffff)
		if f.stream == 0 {
			c.connWin += inc
		} else if s, ok := c.streams[f.stream]; ok {
			c.setWindow(&s, s.win+inc)
			c.streams[f.stream] = s
		}
	case frameSettings:
		if f.stream != 0 || f.flags&flagAck != 0 {
			return
		}
		for p := f.payload; len(p) >= 6; p = p[6:] {
			if binary.BigEndian.Uint16(p) != settingInitialWindowSize {
				continue
			}
			v := int64(binary.BigEndian.Uint32(p[2:]))
			delta := v - c.initWin
			c.initWin = v
			for id, s := range c.streams {
				c.setWindow(&s, s.win+delta)
				c.streams[id] = s
			}
		}
	}
}

// fromServer applies a frame the server wrote. c.mu is held.
func (c *watchedConn) fromServer(f frame) {
	s, ok := c.streams[f.stream]
	switch f.typ {
	case frameData:
		c.connWin -= int64(f.length)
		if ok {
			c.setWindow(&s, s.win-int64(f.length))
			c.streams[f.stream] = s
		}
	case frameHeaders:
		if ok && !s.answered {
			s.answered = true
			c.streams[f.stream] = s
			c.answered++
			if s.win <= 0 {
				c.starved++
			}
		}
	case frameRSTStream:
		c.end(f.stream)
		return
	}
	if f.flags&flagEndStream != 0 && (f.typ == frameData || f.typ == frameHeaders) {
		c.end(f.stream)
	}
}

// setWindow changes a stream's window, keeping the count of starved ones.
func (c *watchedConn) setWindow(s *h2Stream, win int64) {
	if s.answered && (s.win <= 0) != (win <= 0) {
		if win <= 0 {
			c.starved++
		} else {
			c.starved--
		}
	}
	s.win = win
}

// payload follows the messages in b, bytes of the payload of f, a DATA
// frame from the client, that start at offset off in it: its pad length
// and padding are left out. c.mu is held.
func (c *watchedConn) payload(f *frame, off int, b []byte) {
	if f.flags&flagPadded != 0 {
		if off == 0 {
			if len(b) == 0 {
				return
			}
			f.pad = int(b[0])
			off, b = 1, b[1:]
		}
		// Past the payload's end is padding (a pad longer than the frame
		// is grpc-go's to refuse: nothing is data).
		end := f.length - f.pad
		if off >= end {
			return
		}
		b = b[:min(len(b), end-off)]
	}
	if s, ok := c.streams[f.stream]; ok && len(b) > 0 {
		c.messages(&s, b)
		c.streams[f.stream] = s
	}
}

// messages follows the messages of stream s in b, data the client sent on
// it: a request is whole once its first message has come, and the
// connection is in use while messages come whole. c.mu is held.
func (c *watchedConn) messages(s *h2Stream, b []byte) {
	for {
		if s.nprefix < grpcPrefix {
			n := copy(s.prefix[s.nprefix:], b)
			s.nprefix += n
			b = b[n:]
			if s.nprefix < grpcPrefix {
				return
			}
			s.left = int64(binary.BigEndian.Uint32(s.prefix[1:]))
		}
		n := min(int64(len(b)), s.left)
		s.left -= n
		b = b[n:]
		if s.left > 0 {
			return
		}
		s.nprefix = 0
		c.gotMessage = true
		if s.sending {
			s.sending = false
			c.addHalfSent(-1)
		}
		if len(b) == 0 {
			return
		}
	}
}

// sent notes the end of a client's request (a frame with END_STREAM).
// c.mu is held.
func (c *watchedConn) sent(f frame) {
	if f.flags&flagEndStream == 0 {
		return
	}
	if s, ok := c.streams[f.stream]; ok && s.sending {
		s.sending = false
		c.streams[f.stream] = s
		c.addHalfSent(-1)
	}
}

// addHalfSent counts requests that started or stopped being incomplete
// and, past the bound of all connections, has the connection holding the
// most closed. c.mu is held.
func (c *watchedConn) addHalfSent(delta int) {
	if c.closed {
		return // Close took the connection's out of the count
	}
	c.halfSent += delta
	c.halfSentNow.Store(int64(c.halfSent))
	if c.w.halfSent.Add(int64(delta)) > c.w.maxHalfSent && delta > 0 {
		go c.w.closeMost(&c.w.halfSent, c.w.maxHalfSent, func(c *watchedConn) int64 { return c.halfSentNow.Load() })
	}
}

// end forgets a stream.
func (c *watchedConn) end(id uint32) {
	s, ok := c.streams[id]
	if !ok {
		return
	}
	if s.sending {
		c.addHalfSent(-1)
	}
	if s.answered {
		c.answered--
		if s.win <= 0 {
			c.starved--
		}
	}
	delete(c.streams, id)
}

// update recounts the answers waiting on flow control and starts or stops
// the connection's stall timer. c.mu is held.
func (c *watchedConn) update() {
	waiting := int64(c.starved)
	if c.connWin <= 0 {
		waiting = int64(c.answered)
	}
	delta := waiting - c.waiting
	if delta == 0 || c.closed {
		return
	}
	was := c.waiting
	c.waiting = waiting
	c.waitingNow.Store(waiting)
	switch {
	case was == 0:
		c.stallGen++
		gen := c.stallGen
		c.timer = time.AfterFunc(c.w.stall, func() {
			c.mu.Lock()
			still := c.stallGen == gen && c.waiting > 0
			c.mu.Unlock()
			if still {
				c.closeStalled()
			}
		})
	case waiting == 0:
		c.stallGen++
		c.timer.Stop()
	}
	// Past the bound, the watch closes the connection holding the most,
	// aside: closing takes c.mu.
	if c.w.waiting.Add(delta) > c.w.maxWaiting && delta > 0 {
		go c.w.closeMost(&c.w.waiting, c.w.maxWaiting, func(c *watchedConn) int64 { return c.waitingNow.Load() })
	}
}

// frame is what the watch reads of an HTTP/2 frame.
type frame struct {
	typ, flags byte
	stream     uint32
	length     int
	// payload is kept for SETTINGS and WINDOW_UPDATE only.
	payload []byte
	// pad is a padded DATA frame's pad length, once read.
	pad int
}

// frameParser reads the frames of one direction of a connection from the
// bytes as they come, whatever their cut.
type frameParser struct {
	skip int // preface bytes still to pass over
	hdr  [9]byte
	nhdr int
	cur  frame
	left int  // payload bytes of cur still to come
	keep bool // cur's payload is kept
	// broken is set on a frame the watch cannot follow; it then reads no
	// more (grpc-go closes such a connection itself).
	broken bool
	// frames counts the frames read whole.
	frames uint64
}

// partial reports whether a frame has come in part: its header, or its
// payload, not all read yet.
func (fp *frameParser) partial() bool { return fp.nhdr > 0 && !fp.broken }

// feed reads p and calls apply for each frame whose payload is complete,
// and data, unless nil, with the payload of DATA frames as it comes (b,
// from offset off of the payload of f).
func (fp *frameParser) feed(p []byte, apply func(frame), data func(f *frame, off int, b []byte)) {
	for len(p) > 0 && !fp.broken {
		if fp.skip > 0 {
			n := min(fp.skip, len(p))
			fp.skip -= n
			p = p[n:]
			continue
		}
		if fp.nhdr < len(fp.hdr) {
			n := copy(fp.hdr[fp.nhdr:], p)
			fp.nhdr += n
			p = p[n:]
			if fp.nhdr < len(fp.hdr) {
				return
			}
			length := int(fp.hdr[0])<<16 | int(fp.hdr[1])<<8 | int(fp.hdr[2])
			fp.cur = frame{typ: fp.hdr[3], flags: fp.hdr[4], stream: binary.BigEndian.Uint32(fp.hdr[5:]) & 0x7fffffff, length: length}
			fp.left = length
			fp.keep = fp.cur.typ == frameSettings || fp.cur.typ == frameWindowUpdate
			if fp.keep && length > h2MaxPayloadKept {
				fp.broken = true
				return
			}
		}
		n := min(fp.left, len(p))
		if fp.keep {
			fp.cur.payload = append(fp.cur.payload, p[:n]...)
		} else if data != nil && fp.cur.typ == frameData {
			data(&fp.cur, fp.cur.length-fp.left, p[:n])
		}
		fp.left -= n
		p = p[n:]
		if fp.left == 0 {
			apply(fp.cur)
			fp.nhdr = 0
			fp.cur = frame{}
			fp.frames++
		}
	}
}
