package server

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

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
