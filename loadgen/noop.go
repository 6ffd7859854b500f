package loadgen

import (
	"context"
	"fmt"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// NoopServer is an RLS v3 server that answers OK to every request at once,
// with one OK status per descriptor, so a benchmark against it measures the
// ceiling of gRPC itself on the machine: no rate-limit service with the same
// gRPC tuning can answer faster. StartNoop runs it with grpc-go's default
// options; StartNoopTuned with the service's tuning (ServiceTuning), the
// fair ceiling of the service.
type NoopServer struct {
	srv  *grpc.Server
	lis  net.Listener
	done chan error
}

// Tuning is the gRPC tuning of a no-op server.
type Tuning struct {
	// StreamWorkers is the number of goroutines reused to serve streams
	// (grpc.NumStreamWorkers); 0 starts a goroutine per request, grpc-go's
	// default.
	StreamWorkers uint32
}

// ServiceTuning is the service's default gRPC tuning
// (GRPC_NUM_STREAM_WORKERS=64, see docs/BENCHMARKS.md), so that a service
// measured against a no-op server with it cannot pass 100 % of the ceiling
// by tuning alone. The service's other runtime tuning, GC_HEADROOM_BYTES,
// is process-wide: a no-op server in a process of its own (benchrun) sets it
// with gctune; an in-process one (ratelimit-bench -calibrate) shares the
// load generator's garbage collector and does not.
var ServiceTuning = Tuning{StreamWorkers: 64}

// StartNoop starts a NoopServer with grpc-go's default options on addr;
// "127.0.0.1:0" picks a free port.
func StartNoop(addr string) (*NoopServer, error) {
	return StartNoopTuned(addr, Tuning{})
}

// StartNoopTuned starts a NoopServer with tuning t on addr.
func StartNoopTuned(addr string, t Tuning) (*NoopServer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bench: no-op server: %w", err)
	}
	var opts []grpc.ServerOption
	if t.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(t.StreamWorkers))
	}
	s := &NoopServer{srv: grpc.NewServer(opts...), lis: lis, done: make(chan error, 1)}
	rlsv3.RegisterRateLimitServiceServer(s.srv, noop{})
	go func() { s.done <- s.srv.Serve(lis) }()
	return s, nil
}

// Addr returns the host:port the server listens on.
func (s *NoopServer) Addr() string { return s.lis.Addr().String() }

// Stop closes the listener and all connections and waits for Serve to return.
func (s *NoopServer) Stop() {
	s.srv.Stop()
	<-s.done
}

type noop struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noop) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := len(req.GetDescriptors())
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	all := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range all {
		all[i].Code = rlsv3.RateLimitResponse_OK
		statuses[i] = &all[i]
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}, nil
}
