package listen

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// grpcMaxRequestWait is the longest a call's own deadline lets it take to
// send its request (see awaitRequest).
const grpcMaxRequestWait = time.Minute

// errRequestLate is why a call ended whose request did not come in time.
var errRequestLate = errors.New("server: the request did not come whole in time")

// Tap wraps the service's tap: every call it lets in is watched until its
// request has come (awaitRequest).
func (w *StallWatch) Tap(next tap.ServerInHandle) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		ctx, err := next(ctx, info)
		if err != nil {
			return ctx, err
		}
		return w.awaitRequest(ctx), nil
	}
}

// awaitRequest bounds the time a call's request may take to come whole
// (its first message, or the end of a request without one), from its
// headers: the call's own deadline, at most grpcMaxRequestWait, or
// grpcWriteStall for a call without one. Past it the call alone ends, with
// DeadlineExceeded, and the goroutine grpc-go keeps for it waiting for the
// message ends with it; the connection and its other calls go on (issue
// 36, item 7: closing the connection failed every call on it, and grpc-go
// clients send their headers before marshalling the message, which on a
// busy machine took longer than grpcWriteStall). A call whose deadline
// comes within grpcMaxRequestWait needs nothing: grpc-go ends it then;
// nor does one whose request came with its headers: the reader's
// goroutine, which parses what it reads before grpc-go does, runs the
// tap, so when every request started on the connection is whole there,
// the call's own is (a fifth of a call's CPU on the memory store, see
// docs/BENCHMARKS.md). ctx is the call's, as the tap gets it.
func (w *StallWatch) awaitRequest(ctx context.Context) context.Context {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(connAddr); ok && a.c.halfSentNow.Load() == 0 && !a.c.untracked.Load() {
			return ctx
		}
	}
	wait := w.stall
	if d, ok := ctx.Deadline(); ok {
		if time.Until(d) <= w.maxWait {
			return ctx
		}
		wait = w.maxWait
	}
	inner, cancel := context.WithCancelCause(ctx)
	w.awaited.Add(1)
	rc := &requestCtx{Context: inner, cancel: cancel, ended: w.callsEnded, awaited: &w.awaited}
	rc.timer = time.AfterFunc(wait, rc.expire)
	// A call that ends first (its client reset it) stops the timer, so
	// that streams opened and reset in a loop leave nothing behind.
	context.AfterFunc(inner, rc.arrived)
	return rc
}

// requestCtx is the context of a call whose request is awaited: it ends
// when the request is late, and says DeadlineExceeded then, which grpc-go
// sends to the client. Its deadline stays the caller's (the service
// derives the call's budget from it).
type requestCtx struct {
	context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	ended  *stats.Counter
	done   atomic.Bool // the request came, or was late
	// awaited is StallWatch.awaited, which counts done not yet set.
	awaited *atomic.Int64
}

// requestKey finds a call's *requestCtx.
type requestKey struct{}

func (c *requestCtx) Value(key any) any {
	if key == (requestKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// Err is DeadlineExceeded once the request was late: grpc-go answers a
// call ended by its context with the code of its Err, and only the
// context package's own errors have a code (any other is Internal).
func (c *requestCtx) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == errRequestLate {
		return context.DeadlineExceeded
	}
	return err
}

// arrived stops the wait: the request came, or the call ended.
func (c *requestCtx) arrived() {
	if c.done.CompareAndSwap(false, true) {
		c.awaited.Add(-1)
		c.timer.Stop()
	}
}

// expire ends the call, unless its request came meanwhile.
func (c *requestCtx) expire() {
	if c.done.CompareAndSwap(false, true) {
		c.awaited.Add(-1)
		c.ended.Inc()
		c.cancel(errRequestLate)
	}
}

// Arrived stops the wait of the call of ctx, if it has one: a unary
// call's handler calls it once the message has come and been decoded. It
// looks for one only while some call is awaited: a walk up a call's
// contexts costs more than the rest of the watch's work on the call.
func (w *StallWatch) Arrived(ctx context.Context) {
	if w.awaited.Load() == 0 {
		return
	}
	if rc, ok := ctx.Value(requestKey{}).(*requestCtx); ok {
		rc.arrived()
	}
}

// Unary is Arrived for a unary call's interceptor: grpc-go calls the
// interceptors once its message has come and been decoded.
func (w *StallWatch) Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	w.Arrived(ctx)
	return handler(ctx, req)
}

// Stream stops the wait of a streaming call at its first message (or the
// end of its request, or any error reading it).
func (w *StallWatch) Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if rc, ok := ss.Context().Value(requestKey{}).(*requestCtx); ok {
		ss = &awaitedStream{ServerStream: ss, rc: rc}
	}
	return handler(srv, ss)
}

// awaitedStream is a streaming call whose first message is awaited.
type awaitedStream struct {
	grpc.ServerStream
	rc *requestCtx
}

func (s *awaitedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	s.rc.arrived()
	return err
}
