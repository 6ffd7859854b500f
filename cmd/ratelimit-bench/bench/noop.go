package bench

import (
	"context"
	"fmt"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// NoopServer is an RLS v3 server that answers OK to every request at once,
// with one OK status per descriptor. It runs with grpc-go's default options,
// so a benchmark against it measures the ceiling of gRPC itself on the
// machine: no rate-limit service can answer faster.
type NoopServer struct {
	srv  *grpc.Server
	lis  net.Listener
	done chan error
}

// StartNoop starts a NoopServer on addr; "127.0.0.1:0" picks a free port.
func StartNoop(addr string) (*NoopServer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bench: no-op server: %w", err)
	}
	s := &NoopServer{srv: grpc.NewServer(), lis: lis, done: make(chan error, 1)}
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
