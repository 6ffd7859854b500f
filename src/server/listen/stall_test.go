package listen

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/http2"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// frames builds HTTP/2 frames with x/net's framer.
type frames struct {
	buf bytes.Buffer
	fr  *http2.Framer
}

func newFrames() *frames {
	f := &frames{}
	f.fr = http2.NewFramer(&f.buf, nil)
	return f
}

// take returns the bytes written so far and forgets them.
func (f *frames) take() []byte {
	b := bytes.Clone(f.buf.Bytes())
	f.buf.Reset()
	return b
}

// fakeConn is a connection whose reads return what the test queues and
// whose writes go nowhere.
type fakeConn struct {
	mu     sync.Mutex
	queued [][]byte
	closed bool
}

func (c *fakeConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queued) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.queued[0])
	if c.queued[0] = c.queued[0][n:]; len(c.queued[0]) == 0 {
		c.queued = c.queued[1:]
	}
	return n, nil
}

func (c *fakeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

func (c *fakeConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *fakeConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// fromClient makes wc read b, cut into pieces of cut bytes (0: whole).
func fromClient(t *testing.T, wc *watchedConn, b []byte, cut int) {
	t.Helper()
	fc, ok := wc.Conn.(*fakeConn)
	if !ok {
		fc = wc.Conn.(*limitConn).Conn.(*fakeConn)
	}
	if cut <= 0 {
		cut = len(b)
	}
	for len(b) > 0 {
		n := min(cut, len(b))
		fc.mu.Lock()
		fc.queued = append(fc.queued, b[:n])
		fc.mu.Unlock()
		b = b[n:]
		if _, err := wc.Read(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
}

// fromServer makes wc write b, as grpc-go's writer does.
func fromServer(t *testing.T, wc *watchedConn, b []byte) {
	t.Helper()
	if _, err := wc.Write(b); err != nil {
		t.Fatal(err)
	}
}

func waitingOf(wc *watchedConn) int64 {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.waiting
}

// TestStallWatchCountsWaitingAnswers follows the flow-control windows of
// a connection, its bytes cut anywhere: an answer waits while the client
// grants no window for it (the stream's or the connection's), and stops
// waiting when the window comes or the stream ends.
func TestStallWatchCountsWaitingAnswers(t *testing.T) {
	for _, cut := range []int{0, 1, 3, 7, 10} {
		w := NewStallWatch(stats.NewRegistry(), 0)
		wc := w.watch(&fakeConn{})
		f := newFrames()

		// The client grants streams no window, and opens two.
		f.buf.WriteString(clientPreface)
		_ = f.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}, EndHeaders: true})
		_ = f.fr.WriteData(1, true, []byte("request"))
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x82}, EndHeaders: true, EndStream: true})
		fromClient(t, wc, f.take(), cut)

		// Stream 1's answer starts: its headers go, its message cannot.
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x88}, EndHeaders: true})
		fromServer(t, wc, f.take())
		if got := waitingOf(wc); got != 1 {
			t.Fatalf("cut %d: an answer with no window: %d waiting, want 1", cut, got)
		}
		// Stream 3 is refused with headers alone: nothing waits for it.
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x88}, EndHeaders: true, EndStream: true})
		fromServer(t, wc, f.take())
		if got := waitingOf(wc); got != 1 {
			t.Fatalf("cut %d: after a trailers-only answer: %d waiting, want 1", cut, got)
		}
		// The client grants stream 1 ten bytes: the message goes in part,
		// and waits again once they are spent.
		_ = f.fr.WriteWindowUpdate(1, 10)
		fromClient(t, wc, f.take(), cut)
		if got := waitingOf(wc); got != 0 {
			t.Fatalf("cut %d: with a window: %d waiting, want 0", cut, got)
		}
		_ = f.fr.WriteData(1, false, make([]byte, 10))
		fromServer(t, wc, f.take())
		if got := waitingOf(wc); got != 1 {
			t.Fatalf("cut %d: the window spent: %d waiting, want 1", cut, got)
		}
		// The client raises every stream's window; the answer ends.
		_ = f.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
		fromClient(t, wc, f.take(), cut)
		_ = f.fr.WriteData(1, false, make([]byte, 20))
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x88}, EndHeaders: true, EndStream: true})
		fromServer(t, wc, f.take())
		if got := waitingOf(wc); got != 0 {
			t.Fatalf("cut %d: the answer ended: %d waiting, want 0", cut, got)
		}
		// The connection's own window spent leaves every started answer
		// waiting; a reset stream stops waiting.
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: []byte{0x82}, EndHeaders: true, EndStream: true})
		fromClient(t, wc, f.take(), cut)
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: []byte{0x88}, EndHeaders: true})
		_ = f.fr.WriteData(5, false, make([]byte, 16384))
		_ = f.fr.WriteData(5, false, make([]byte, 16384))
		_ = f.fr.WriteData(5, false, make([]byte, 16384))
		_ = f.fr.WriteData(5, false, make([]byte, 65535-30-3*16384))
		fromServer(t, wc, f.take())
		if got := waitingOf(wc); got != 1 {
			t.Fatalf("cut %d: the connection's window spent: %d waiting, want 1", cut, got)
		}
		_ = f.fr.WriteRSTStream(5, http2.ErrCodeCancel)
		fromClient(t, wc, f.take(), cut)
		if got := waitingOf(wc); got != 0 || w.waiting.Load() != 0 {
			t.Fatalf("cut %d: the stream reset: %d waiting (%d in all), want 0", cut, got, w.waiting.Load())
		}
	}
}

// stalledConn is a watched connection whose client opened a stream with
// no window and got its answer's headers: one answer waits.
func stalledConn(t *testing.T, w *StallWatch, streams int) (*watchedConn, *fakeConn) {
	t.Helper()
	fc := &fakeConn{}
	wc := w.watch(fc)
	f := newFrames()
	f.buf.WriteString(clientPreface)
	_ = f.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	for i := range streams {
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: []byte{0x82}, EndHeaders: true, EndStream: true})
	}
	fromClient(t, wc, f.take(), 0)
	for i := range streams {
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: []byte{0x88}, EndHeaders: true})
	}
	fromServer(t, wc, f.take())
	return wc, fc
}

// TestStalledConnectionIsClosed: a connection that leaves an answer
// waiting for grpcWriteStall is closed and counted; one whose client
// grants the window in time is not.
func TestStalledConnectionIsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch(stats.NewRegistry(), 0)
		_, stuckConn := stalledConn(t, w, 1)
		late, lateConn := stalledConn(t, w, 1)
		time.Sleep(grpcWriteStall / 2)
		f := newFrames()
		_ = f.fr.WriteWindowUpdate(1, 100)
		fromClient(t, late, f.take(), 0)
		time.Sleep(grpcWriteStall)
		synctest.Wait()
		if !stuckConn.isClosed() {
			t.Error("a connection leaving an answer waiting for the stall bound is open")
		}
		if lateConn.isClosed() {
			t.Error("a connection whose client granted the window in time was closed")
		}
		if got := w.closed.Value(); got != 1 {
			t.Errorf("stalled connections closed = %d, want 1", got)
		}
		if got := w.waiting.Load(); got != 0 {
			t.Errorf("answers waiting in all = %d, want 0", got)
		}
	})
}

// TestWaitingBoundClosesTheWorst: when all connections together leave more
// answers waiting than the bound, the one leaving the most is closed at
// once, long before its stall bound.
func TestWaitingBoundClosesTheWorst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch(stats.NewRegistry(), 0)
		w.maxWaiting = 4
		_, small := stalledConn(t, w, 2)
		_, big := stalledConn(t, w, 3)
		synctest.Wait()
		if !big.isClosed() || small.isClosed() {
			t.Errorf("5 answers waiting, bound 4: the connection with 3 closed %v, with 2 closed %v; want only the first", big.isClosed(), small.isClosed())
		}
		if got := w.waiting.Load(); got != 2 {
			t.Errorf("answers waiting in all = %d, want 2", got)
		}
	})
}

// TestWriteDeadlineMoves: a write that blocks gets at least 7/8 of
// grpcWriteStall from its start, however recent the write before it.
func TestWriteDeadlineMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch(stats.NewRegistry(), 0)
		server, client := net.Pipe()
		defer client.Close()
		wc := w.watch(server)
		go func() { _, _ = io.ReadFull(client, make([]byte, 1)) }()
		if _, err := wc.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(grpcWriteStall / 2)
		errc := make(chan error, 1)
		go func() {
			_, err := wc.Write([]byte("an answer nobody reads"))
			errc <- err
		}()
		time.Sleep(grpcWriteStall * 7 / 8)
		synctest.Wait()
		if len(errc) > 0 || w.closed.Value() != 0 {
			t.Fatal("a write was cut before 7/8 of the stall bound from its start")
		}
		time.Sleep(grpcWriteStall / 8)
		synctest.Wait()
		if len(errc) == 0 || w.closed.Value() != 1 {
			t.Error("a write nobody reads still blocks after the stall bound")
		}
	})
}

// TestUnreadSocketIsClosed: a write to a client that does not read its
// socket gets grpcWriteStall, then the connection is closed and counted.
func TestUnreadSocketIsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch(stats.NewRegistry(), 0)
		server, client := net.Pipe()
		defer client.Close()
		wc := w.watch(server)
		errc := make(chan error, 1)
		go func() {
			_, err := wc.Write([]byte("an answer nobody reads"))
			errc <- err
		}()
		time.Sleep(grpcWriteStall + time.Second)
		synctest.Wait()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("a write nobody reads succeeded")
			}
		default:
			t.Fatal("a write nobody reads still blocks after the stall bound")
		}
		if got := w.closed.Value(); got != 1 {
			t.Errorf("stalled connections closed = %d, want 1", got)
		}
		if _, err := client.Write([]byte("x")); err == nil {
			t.Error("the connection is still open")
		}
	})
}

// halfSent opens streams on wc whose requests do not end: headers only.
func halfSent(t *testing.T, wc *watchedConn, first uint32, n int) {
	t.Helper()
	f := newFrames()
	if first == 1 {
		f.buf.WriteString(clientPreface)
	}
	for i := range n {
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: first + uint32(2*i), BlockFragment: []byte{0x83}, EndHeaders: true})
	}
	fromClient(t, wc, f.take(), 0)
}

// finish ends the request of stream id on wc: its message, END_STREAM.
func finish(t *testing.T, wc *watchedConn, id uint32) {
	t.Helper()
	f := newFrames()
	_ = f.fr.WriteData(id, true, []byte("message"))
	fromClient(t, wc, f.take(), 0)
}

// TestHalfSentBoundClosesTheWorst: past the bound of requests not whole,
// all connections together, the one holding the most is closed at once.
func TestHalfSentBoundClosesTheWorst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch(stats.NewRegistry(), 0)
		w.maxHalfSent = 4
		small := w.watch(&fakeConn{})
		halfSent(t, small, 1, 2)
		big := w.watch(&fakeConn{})
		halfSent(t, big, 1, 3)
		synctest.Wait()
		if !big.Conn.(*fakeConn).isClosed() || small.Conn.(*fakeConn).isClosed() {
			t.Errorf("5 requests not whole, bound 4: the connection with 3 closed %v, with 2 closed %v; want only the first",
				big.Conn.(*fakeConn).isClosed(), small.Conn.(*fakeConn).isClosed())
		}
		if got := w.halfSent.Load(); got != 2 {
			t.Errorf("requests not whole in all = %d, want 2", got)
		}
		// The small connection's requests come whole: nothing is left.
		finish(t, small, 1)
		finish(t, small, 3)
		if got := w.halfSent.Load(); got != 0 {
			t.Errorf("after they came whole: %d, want 0", got)
		}
	})
}

// TestUseIsWholeMessages: a connection is in use when its client's
// messages come whole, on any stream, however cut and padded; headers, a
// message in part and other frames are not use (issue 36, item 1). Use is
// told to the connection's slot for the listener's choice at its cap.
func TestUseIsWholeMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewStallWatch(stats.NewRegistry(), 0)
		slot := &limitConn{Conn: &fakeConn{}}
		wc := w.watch(slot)
		start := time.Now()
		step := func(what string, b []byte, want time.Time) {
			t.Helper()
			time.Sleep(time.Second)
			fromClient(t, wc, b, 3)
			wc.mu.Lock()
			used := wc.used
			wc.mu.Unlock()
			if !used.Equal(want) {
				t.Errorf("after %s: used at %v, want %v", what, used.Sub(start), want.Sub(start))
			}
			// The slot knew its connection from its accept until a message.
			if got := slot.idleSince.Load(); want.After(start) && got != want.UnixNano() {
				t.Errorf("after %s: the slot idle since %v, want %v", what, time.Unix(0, got).Sub(start), want.Sub(start))
			}
		}
		f := newFrames()
		f.buf.WriteString(clientPreface)
		_ = f.fr.WriteSettings()
		_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x83}, EndHeaders: true})
		_ = f.fr.WritePing(false, [8]byte{})
		step("headers and a ping", f.take(), start)
		msg := grpcMessage(20)
		_ = f.fr.WriteDataPadded(1, false, msg[:3], make([]byte, 4))
		step("a message in part", f.take(), start)
		_ = f.fr.WriteData(1, false, msg[3:])
		step("the rest of it", f.take(), start.Add(3*time.Second))
		// Two messages in one frame, then one of none.
		_ = f.fr.WriteData(1, false, append(grpcMessage(2), grpcMessage(1)...))
		step("two messages", f.take(), start.Add(4*time.Second))
		_ = f.fr.WriteData(1, false, grpcMessage(0))
		step("an empty message", f.take(), start.Add(5*time.Second))
	})
}

// TestUnfinishedFramesAreCut: a connection whose client leaves a frame,
// or a header block, not whole for grpcWriteStall is closed and counted,
// however it trickles the rest (issue 36, item 6); one whose frames and
// blocks come whole in time, however cut, is not.
func TestUnfinishedFramesAreCut(t *testing.T) {
	opened := func(f *frames) {
		f.buf.WriteString(clientPreface)
		_ = f.fr.WriteSettings()
	}
	tests := []struct {
		name string
		// send writes the frames of second i (0 to 29) to f.
		send func(f *frames, i int)
		cut  bool
	}{
		{"two_bytes_of_a_frame_header", func(f *frames, i int) {
			if i == 0 {
				opened(f)
				f.buf.Write([]byte{0, 0})
			}
		}, true},
		{"continuation_trickled", func(f *frames, i int) {
			if i == 0 {
				opened(f)
				_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}, EndStream: true})
			}
			_ = f.fr.WriteContinuation(1, false, []byte{0x84})
		}, true},
		{"data_frame_trickled", func(f *frames, i int) {
			if i == 0 {
				opened(f)
				_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}, EndHeaders: true})
				f.buf.Write([]byte{0, 0, 30, frameData, 0, 0, 0, 0, 1})
			}
			f.buf.WriteByte(0)
		}, true},
		{"block_whole_in_time", func(f *frames, i int) {
			switch i {
			case 0:
				opened(f)
				_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}, EndStream: true})
			case 5:
				_ = f.fr.WriteContinuation(1, true, []byte{0x84})
			}
		}, false},
		{"frame_whole_in_time", func(f *frames, i int) {
			switch i {
			case 0:
				opened(f)
				f.buf.Write([]byte{0, 0, 8})
			case 5:
				f.buf.Write([]byte{0x6, 0, 0, 0, 0, 0})
			case 9:
				f.buf.Write(make([]byte, 8)) // a PING
			}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := NewStallWatch(stats.NewRegistry(), 0)
				fc := &fakeConn{}
				wc := w.watch(fc)
				f := newFrames()
				start := time.Now()
				for i := range 30 {
					tt.send(f, i)
					if b := f.take(); len(b) > 0 {
						fromClient(t, wc, b, 1)
					}
					time.Sleep(time.Second)
					synctest.Wait()
					if fc.isClosed() {
						break
					}
				}
				if fc.isClosed() != tt.cut {
					t.Errorf("closed: %v, want %v", fc.isClosed(), tt.cut)
				}
				if took := time.Since(start); tt.cut && took > grpcWriteStall+time.Second {
					t.Errorf("closed after %v, want within %v", took, grpcWriteStall+time.Second)
				}
				if got, want := w.closed.Value(), map[bool]uint64{true: 1}[tt.cut]; got != want {
					t.Errorf("stalled connections closed = %d, want %d", got, want)
				}
			})
		})
	}
}

// grpcMessage is a gRPC message of n bytes with its prefix.
func grpcMessage(n int) []byte {
	m := make([]byte, grpcPrefix+n)
	binary.BigEndian.PutUint32(m[1:], uint32(n))
	return m
}

// TestRequestsFollowedUntilWhole: a request is not whole until its first
// message has come, however cut into DATA frames and padded, or its
// client ended it; one whose message stops short of the length its
// prefix names still is. A stream (RLQS) never ends its side: once its
// first message has come it is no longer counted.
func TestRequestsFollowedUntilWhole(t *testing.T) {
	w := NewStallWatch(stats.NewRegistry(), 0)
	stream := w.watch(&fakeConn{})
	halfSent(t, stream, 1, 1)
	f := newFrames()
	msg := grpcMessage(40)
	// The prefix cut over three frames, one of them padded.
	_ = f.fr.WriteData(1, false, msg[:2])
	_ = f.fr.WriteDataPadded(1, false, msg[2:4], make([]byte, 7))
	_ = f.fr.WriteData(1, false, msg[4:30])
	fromClient(t, stream, f.take(), 1)
	if got := w.halfSent.Load(); got != 1 {
		t.Fatalf("30 of 45 bytes come: requests not whole = %d, want 1", got)
	}
	_ = f.fr.WriteData(1, false, msg[30:])
	// A second message, after the first, changes nothing.
	_ = f.fr.WriteData(1, false, grpcMessage(3)[:4])
	fromClient(t, stream, f.take(), 0)
	if got := w.halfSent.Load(); got != 0 {
		t.Fatalf("the first message whole: requests not whole = %d, want 0", got)
	}

	short := w.watch(&fakeConn{})
	halfSent(t, short, 1, 2)
	_ = f.fr.WriteData(1, false, msg[:len(msg)-1])
	// Stream 3 ends its request with no message.
	_ = f.fr.WriteData(3, true, nil)
	fromClient(t, short, f.take(), 0)
	if got := short.halfSent; got != 1 {
		t.Errorf("one request a byte short, one ended: requests not whole = %d, want 1", got)
	}
}

// BenchmarkStallWatchCall is what watching costs one unary call: the
// client's headers and message read, the server's headers, message and
// trailers written.
func BenchmarkStallWatchCall(b *testing.B) {
	w := NewStallWatch(stats.NewRegistry(), 0)
	wc := w.watch(&fakeConn{})
	f := newFrames()
	f.buf.WriteString(clientPreface)
	_ = f.fr.WriteSettings()
	wc.in.feed(f.take(), wc.fromClient, wc.payload)
	// One call's frames, whose stream IDs are set for each call.
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: make([]byte, 40), EndHeaders: true})
	_ = f.fr.WriteData(1, true, make([]byte, 60))
	in := f.take()
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: make([]byte, 10), EndHeaders: true})
	_ = f.fr.WriteData(1, false, make([]byte, 30))
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: make([]byte, 12), EndHeaders: true, EndStream: true})
	out := f.take()
	setIDs := func(b []byte, id uint32) {
		for len(b) >= 9 {
			binary.BigEndian.PutUint32(b[5:9], id)
			b = b[9+(int(b[0])<<16|int(b[1])<<8|int(b[2])):]
		}
	}
	id := uint32(1)
	b.ReportAllocs()
	for b.Loop() {
		setIDs(in, id)
		setIDs(out, id)
		wc.mu.Lock()
		wc.readFrom(in)
		wc.mu.Unlock()
		wc.wrote(out)
		id += 2
	}
	if len(wc.streams) != 0 || wc.waiting != 0 {
		b.Fatalf("%d streams left, %d waiting", len(wc.streams), wc.waiting)
	}
}

// TestSlowlorisFramesAreCut tries the two slowloris variants of issue 36,
// item 6, over the wire: HEADERS with END_STREAM but not END_HEADERS, then
// CONTINUATION frames of a byte each, one after another; and two bytes of
// a frame header, then nothing. Each connection is closed once the
// watch's time has passed (300 ms here), and counted. Before, grpc-go's
// reader waited for the rest, and the connection held its slot until
// GRPC_MAX_CONNECTION_IDLE (5 min).
func TestSlowlorisFramesAreCut(t *testing.T) {
	w := NewStallWatch(stats.NewRegistry(), 0)
	w.stall = 300 * time.Millisecond
	addr := serveGRPC(t, w)
	tests := []struct {
		name string
		// send writes what the client sends, until the connection fails.
		send func(c net.Conn, fr *http2.Framer) error
	}{
		{"continuation_trickled", func(_ net.Conn, fr *http2.Framer) error {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x83, 0x86}, EndStream: true}); err != nil {
				return err
			}
			// A literal header field whose name and value never end.
			if err := fr.WriteContinuation(1, false, []byte{0x00, 0x7f, 0xff, 0x7f}); err != nil {
				return err
			}
			for range 200 {
				time.Sleep(25 * time.Millisecond) // the trickle, on the clock the server measures
				if err := fr.WriteContinuation(1, false, []byte{'a'}); err != nil {
					return err
				}
			}
			return nil
		}},
		{"two_bytes_of_a_frame_header", func(c net.Conn, _ *http2.Framer) error {
			_, err := c.Write([]byte{0, 0})
			return err
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fr := http2.NewFramer(c, c)
			if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
				t.Fatal(err)
			}
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			go func() { _ = tt.send(c, fr) }()
			// The trickle above goes on for 5 s, the watch's time is 300 ms.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the connection is still open after 5 s")
			}
			if got := w.closed.Value(); got != uint64(i+1) {
				t.Errorf("grpc_stalled_connections_closed = %d, want %d", got, i+1)
			}
		})
	}
}
