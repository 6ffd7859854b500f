package listen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// TestAwaitRequest: a call whose request has not come ends grpcWriteStall
// after its headers, or grpcMaxRequestWait after them when its deadline is
// later still; a call whose deadline comes sooner is left to it, and one
// whose request came, or that ended, is not ended.
func TestAwaitRequest(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
		arrives  bool
		want     time.Duration // when it ends; 0: never
	}{
		{"no_deadline", 0, false, grpcWriteStall},
		{"request_came", 0, true, 0},
		{"far_deadline", time.Hour, false, grpcMaxRequestWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := NewStallWatch(stats.NewRegistry(), 0)
				parent := context.Background()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					parent, cancel = context.WithTimeout(parent, tt.deadline)
					defer cancel()
				}
				start := time.Now()
				ctx := w.awaitRequest(parent)
				if tt.arrives {
					time.Sleep(time.Second)
					w.Arrived(ctx)
				}
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Hour):
				}
				// Arrived looks for a call only while one is awaited.
				if n := w.awaited.Load(); n != 0 {
					t.Errorf("%d calls awaited once none is", n)
				}
				if tt.want == 0 {
					if ctx.Err() != nil {
						t.Fatalf("a call whose request came ended: %v", ctx.Err())
					}
					return
				}
				if got := time.Since(start); got != tt.want {
					t.Errorf("ended after %v, want %v", got, tt.want)
				}
				// grpc-go compares Err with ==.
				if ctx.Err() != context.DeadlineExceeded {
					t.Errorf("Err() = %v, want context.DeadlineExceeded", ctx.Err())
				}
				if got, want := deadlineOf(ctx), deadlineOf(parent); got != want {
					t.Errorf("deadline %v, want the caller's, %v", got, want)
				}
				if got := w.callsEnded.Value(); got != 1 {
					t.Errorf("grpc_stalled_calls_ended = %d, want 1", got)
				}
			})
		})
	}
	for _, d := range []time.Duration{time.Second, 30 * time.Second, grpcMaxRequestWait} {
		w := NewStallWatch(stats.NewRegistry(), 0)
		parent, cancel := context.WithTimeout(context.Background(), d)
		if ctx := w.awaitRequest(parent); ctx != parent {
			t.Errorf("a call with a deadline of %v is watched: grpc-go ends it by then", d)
		}
		cancel()
	}
	t.Run("call_reset", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := NewStallWatch(stats.NewRegistry(), 0)
			parent, cancel := context.WithCancel(context.Background())
			ctx := w.awaitRequest(parent)
			cancel() // the client reset the stream
			time.Sleep(2 * grpcMaxRequestWait)
			if !errors.Is(ctx.Err(), context.Canceled) || w.callsEnded.Value() != 0 {
				t.Errorf("a reset call: Err() = %v, %d ended; want Canceled and none", ctx.Err(), w.callsEnded.Value())
			}
		})
	})
}

// TestWholeRequestIsNotWatched: a call whose connection has every request
// it started whole when its tap runs (a request sent with its headers, as
// Envoy and most clients send them) needs no timer; while a request on the
// connection is not whole, or once a stream went untracked, every call
// is watched.
func TestWholeRequestIsNotWatched(t *testing.T) {
	w := NewStallWatch(stats.NewRegistry(), 0)
	wc := w.watch(&fakeConn{})
	ctxOf := func() context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: wc.RemoteAddr()})
	}
	halfSent(t, wc, 1, 1)
	if ctx := ctxOf(); w.awaitRequest(ctx) == ctx {
		t.Error("a call is not watched while a request on its connection is not whole")
	}
	finish(t, wc, 1)
	if ctx := ctxOf(); w.awaitRequest(ctx) != ctx {
		t.Error("a call whose request came with its headers is watched")
	}
	wc.untracked.Store(true)
	if ctx := ctxOf(); w.awaitRequest(ctx) == ctx {
		t.Error("a call is not watched on a connection with untracked streams")
	}
	if wc.RemoteAddr().String() != (&net.TCPAddr{}).String() {
		t.Errorf("the watched connection's address reads %q, want the connection's", wc.RemoteAddr())
	}
}

func deadlineOf(ctx context.Context) string {
	d, ok := ctx.Deadline()
	return fmt.Sprint(d, ok)
}

// slowCodec is the proto codec whose Marshal waits for release: grpc-go's
// client sends a call's headers, then marshals its message, so the server
// sees the headers and then nothing, as from a client on a busy machine
// (issue 36, item 7: a 4 MiB message's marshalling took over 10 s).
type slowCodec struct {
	encoding.CodecV2
	release chan struct{}
}

func (c slowCodec) Marshal(v any) (mem.BufferSlice, error) {
	<-c.release
	return c.CodecV2.Marshal(v)
}

// burnCPU keeps every core busy until the test ends, with GOMAXPROCS
// goroutines that spin (for at most a minute).
func burnCPU(t *testing.T) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			deadline := time.Now().Add(time.Minute)
			for n := 0; ; n++ {
				if n%1024 == 0 {
					select {
					case <-stop:
						return
					default:
					}
					if time.Now().After(deadline) {
						return
					}
				}
			}
		})
	}
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}

// TestSlowRequestEndsItsCallAlone sends, on one connection kept busy by
// other calls, on a machine kept busy, two calls whose messages come late:
// one without a deadline ends alone (DeadlineExceeded) once the watch's
// time has passed, one whose deadline is later waits for its message and
// is served, and every other call on the connection is served. Before,
// the connection was closed and every call on it failed (issue 36,
// item 7: Unavailable, "error reading from server: EOF").
func TestSlowRequestEndsItsCallAlone(t *testing.T) {
	w := NewStallWatch(stats.NewRegistry(), 0)
	w.stall = 300 * time.Millisecond
	cc := dialGRPC(t, serveGRPC(t, w))
	burnCPU(t)
	hc := healthpb.NewHealthClient(cc)
	req := &healthpb.HealthCheckRequest{}
	if _, err := hc.Check(t.Context(), req); err != nil {
		t.Fatal(err)
	}

	slow := func(ctx context.Context, release chan struct{}) <-chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := hc.Check(ctx, req, grpc.ForceCodecV2(slowCodec{encoding.GetCodecV2("proto"), release}))
			errc <- err
		}()
		return errc
	}
	// The call with a later deadline first, alone: it has waited longer
	// than the one without a deadline when the watch ends that one.
	patientRelease, impatientRelease := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	patient := slow(ctx, patientRelease)
	harness.WaitFor(t, 10*time.Second, "the patient call's headers", func() bool { return w.halfSent.Load() == 1 })

	// Other calls on the same connection, until the slow ones are done.
	done := make(chan struct{})
	var others sync.WaitGroup
	var served atomic.Int64
	for range 4 {
		others.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				_, err := hc.Check(ctx, req)
				cancel()
				if err != nil {
					t.Errorf("a call beside the slow ones: %v", err)
					return
				}
				served.Add(1)
			}
		})
	}

	impatient := slow(t.Context(), impatientRelease)
	harness.WaitFor(t, 10*time.Second, "the call without a deadline ended", func() bool { return w.callsEnded.Value() == 1 })
	close(impatientRelease)
	if err := <-impatient; status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a call whose message did not come in time: %v, want DeadlineExceeded", err)
	}
	close(patientRelease)
	if err := <-patient; err != nil {
		t.Errorf("a call whose deadline is later than its message: %v, want it served", err)
	}
	close(done)
	others.Wait()
	if n := w.callsEnded.Value(); n != 1 {
		t.Errorf("grpc_stalled_calls_ended = %d, want 1", n)
	}
	if n := w.closed.Value(); n != 0 {
		t.Errorf("grpc_stalled_connections_closed = %d, want 0: the connection carried other calls", n)
	}
	t.Logf("%d other calls served on the connection meanwhile", served.Load())
}

// serveGRPC serves the health service on 127.0.0.1, every connection and
// call watched by w as the server's are, until the test ends, and returns
// its address.
func serveGRPC(t *testing.T, w *StallWatch) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pass := func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, nil }
	srv := grpc.NewServer(grpc.Creds(w.Credentials(nil)), grpc.InTapHandle(w.Tap(pass)),
		grpc.ChainUnaryInterceptor(w.Unary), grpc.ChainStreamInterceptor(w.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
