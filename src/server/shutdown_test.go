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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestShutdownWithinDrain: with a store whose close never returns, a gRPC
// call and an HTTP request in flight, Run returns once the drain time is
// over.
func TestShutdownWithinDrain(t *testing.T) {
	srv, _ := build(t, serverRules, nil, io.Discard)
	srv.drain = time.Second
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	closeStore := srv.store.close
	srv.store.close = func() { <-hang; closeStore() }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	a := srv.Addrs()
	eventually(t, "healthy", func() bool { c, _ := get(t, "http://"+a.HTTP.String()+"/healthcheck"); return c == 200 })

	// A /json request whose body never ends keeps its connection active.
	c, err := net.Dial("tcp", a.HTTP.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	// A streaming health watch keeps a gRPC call in flight.
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	if _, err := rls.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "drain"}},
	}}}); err != nil {
		t.Fatal(err)
	}
	watch, err := healthpb.NewHealthClient(dial(t, srv)).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(srv.drain + 10*time.Second):
		t.Fatalf("Run still running %v after the end of a %v drain", 10*time.Second, srv.drain)
	}
	// Generous for a loaded machine; without the bound it takes 10 s for
	// gRPC, 10 s for HTTP and forever for the store.
	if d := time.Since(began); d > srv.drain+3*time.Second {
		t.Errorf("shutdown took %v with a %v drain", d, srv.drain)
	}
}
