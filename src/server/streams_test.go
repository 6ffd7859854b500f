package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/server/listen"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// TestLongStreamsBounded: health watches are bounded in all, over the
// wire, and a closed one gives its place back (issue 36: each open Watch
// held a goroutine and 12 KB, and nothing counted them).
func TestLongStreamsBounded(t *testing.T) {
	srv, _ := start(t, serverRules, nil)
	srv.streams.mu.Lock()
	srv.streams.max = 2
	srv.streams.mu.Unlock()
	hc := healthpb.NewHealthClient(dial(t, srv))
	watch := func() (context.CancelFunc, error) {
		ctx, cancel := context.WithCancel(t.Context())
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			cancel()
		}
		return cancel, err
	}
	first, err := watch()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch(); err != nil {
		t.Fatal(err)
	}
	if _, err := watch(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a third watch with a bound of 2: %v, want ResourceExhausted", err)
	}
	if n := srv.stats.Counter("ratelimit.server.streams_refused").Value(); n != 1 {
		t.Errorf("streams_refused = %d, want 1", n)
	}
	first()
	eventually(t, "the closed watch's place to come back", func() bool { _, err := watch(); return err == nil })
}

// TestLongStreamsPerPeer: one client IP address holds at most its share;
// loopback clients (a sidecar forwarding many) share the total only.
func TestLongStreamsPerPeer(t *testing.T) {
	b := newStreamBound(stats.NewRegistry())
	b.max, b.maxPerPeer = 10, 2
	var leaves []func()
	for i := range 2 {
		leave, err := b.enter(fmt.Sprintf("192.0.2.1:%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, leave)
	}
	if _, err := b.enter("192.0.2.1:9"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a third stream from one address: %v, want ResourceExhausted", err)
	}
	if _, err := b.enter("[2001:db8::1]:1"); err != nil {
		t.Errorf("another address: %v", err)
	}
	for i := range 7 {
		if _, err := b.enter(fmt.Sprintf("127.0.0.6:%d", i)); err != nil {
			t.Fatalf("loopback stream %d: %v", i, err)
		}
	}
	if _, err := b.enter("127.0.0.6:99"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("past the total: %v, want ResourceExhausted", err)
	}
	leaves[0]()
	if _, err := b.enter("192.0.2.1:9"); err != nil {
		t.Errorf("after one left: %v", err)
	}
}

// dialFrom is dial, from the loopback address local (127.0.0.x): another
// client address of the same machine.
func dialFrom(t *testing.T, srv *Server, local string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	cc, err := grpc.NewClient(srv.Addrs().GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// watchHealth opens a health watch on cc and reads its first status: the
// stream then stays open, silent. Its end is sent on the channel.
func watchHealth(t *testing.T, cc *grpc.ClientConn) <-chan error {
	t.Helper()
	w, err := healthpb.NewHealthClient(cc).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if err != nil {
		t.Fatal(err)
	}
	// A change of the serving status is a message, not the end: the
	// server may turn SERVING just after the first answer.
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := w.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	return ended
}

// TestSilentStreamsGiveUpTheirSlots: four client addresses hold every slot
// of GRPC_MAX_CONNECTIONS (4, a share of 1 each), each connection with a
// health watch and nothing else. A fifth address gets a connection once
// the one idle longest has carried no message for the bound (200 ms
// here; grpcEvictIdle, 10 s, by default): that one is closed for it and
// counted (issue 36, item 1). Before, the fifth waited until a watch
// ended: GRPC_MAX_CONNECTION_AGE and its grace, 25 h by default.
func TestSilentStreamsGiveUpTheirSlots(t *testing.T) {
	srv, _ := build(t, serverRules, map[string]string{"GRPC_MAX_CONNECTIONS": "4"}, io.Discard)
	srv.grpcLn.(*listen.Listener).MinIdle = 200 * time.Millisecond
	run(t, srv)
	var watches []<-chan error
	for i := range 4 {
		watches = append(watches, watchHealth(t, dialFrom(t, srv, fmt.Sprintf("127.0.0.%d", 2+i))))
	}
	rls := rlsv3.NewRateLimitServiceClient(dialFrom(t, srv, "127.0.0.1"))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "fifth"}},
	}}}
	if _, err := rls.ShouldRateLimit(ctx, req, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a fifth client address with every slot held by silent watches: %v", err)
	}
	t.Logf("served after %v", time.Since(start))
	if n := srv.stats.Counter("ratelimit.server.connections_evicted").Value(); n != 1 {
		t.Errorf("connections_evicted = %d, want 1", n)
	}
	if err := <-watches[0]; status.Code(err) != codes.Unavailable {
		t.Errorf("the watch of the connection idle longest: %v, want Unavailable (closed)", err)
	}
	for i, w := range watches[1:] {
		select {
		case err := <-w:
			t.Errorf("watch %d ended: %v; want only the one idle longest closed", i+1, err)
		default:
		}
	}
}

// TestSilentStreamsAreIdle: a connection whose only use is a health watch
// is closed after GRPC_MAX_CONNECTION_IDLE (1 s here), and counted; one
// whose client calls meanwhile keeps its watch (issue 36, item 1). Before,
// grpc-go counted a connection with an open stream as busy, however
// silent, and kept it until GRPC_MAX_CONNECTION_AGE.
func TestSilentStreamsAreIdle(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"GRPC_MAX_CONNECTION_IDLE": "1s"})
	busy := dialFrom(t, srv, "127.0.0.2")
	busyWatch := watchHealth(t, busy)
	stop := make(chan struct{})
	calls := make(chan error, 1)
	go func() {
		hc := healthpb.NewHealthClient(busy)
		for {
			select {
			case <-stop:
				calls <- nil
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
				calls <- err
				return
			}
		}
	}()
	// Watched after the busy one: closed once the busy one has been
	// looked at, and found in use.
	select {
	case err := <-watchHealth(t, dialFrom(t, srv, "127.0.0.3")):
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a watch alone on its connection: %v, want Unavailable (closed)", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a watch alone on its connection is still open after 10 s")
	}
	close(stop)
	if err := <-calls; err != nil {
		t.Errorf("calls beside a watch: %v", err)
	}
	select {
	case err := <-busyWatch:
		t.Errorf("the watch of a connection in use ended: %v", err)
	default:
	}
	if n := srv.stats.Counter("ratelimit.server.grpc_idle_connections_closed").Value(); n != 1 {
		t.Errorf("grpc_idle_connections_closed = %d, want 1", n)
	}
}
