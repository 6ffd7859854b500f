// A real xDS management server for tests (StartXDS): the go-control-plane
// server and snapshot cache that Envoy Gateway serves its rate-limit rules
// with, on a loopback port, in plaintext or with mutual TLS. Tests set
// snapshots of RateLimitConfig resources and read the requests the server
// received, ACKs and NACKs included.

package harness

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// XDSOptions says how to run an XDSServer.
type XDSOptions struct {
	// TLS serves TLS 1.3 only and requires a client certificate signed by
	// the generated CA, as Envoy Gateway's rate-limit xDS server does.
	TLS bool
}

// XDSServer is a running xDS management server. Its methods are safe for
// concurrent use.
type XDSServer struct {
	// Addr is the server's loopback host:port. It stays the same across
	// Stop and Restart.
	Addr string
	// TLS names the generated certificate files when XDSOptions.TLS is set;
	// nil otherwise.
	TLS *TLSFiles

	cache cachev3.SnapshotCache
	creds credentials.TransportCredentials

	// mu guards the fields below.
	mu       sync.Mutex
	grpc     *grpc.Server
	served   chan struct{}
	version  int
	requests []XDSRequest
	opened   int
	changed  chan struct{} // closed and replaced at each request
}

// XDSRequest is one DiscoveryRequest the server received, with the gRPC
// metadata of its stream.
type XDSRequest struct {
	*discoveryv3.DiscoveryRequest
	Metadata metadata.MD
}

// NACK reports whether the request refused an update.
func (r XDSRequest) NACK() bool { return r.GetErrorDetail() != nil }

// StartXDS runs a server on a free loopback port until the test ends.
func StartXDS(tb testing.TB, opts XDSOptions) *XDSServer {
	tb.Helper()
	s := &XDSServer{changed: make(chan struct{})}
	if opts.TLS {
		files, err := WriteTLS(tb.TempDir(), "localhost", "xds.test")
		if err != nil {
			tb.Fatal(err)
		}
		cfg, err := files.ServerConfig()
		if err != nil {
			tb.Fatal(err)
		}
		s.TLS, s.creds = files, credentials.NewTLS(cfg)
	}
	// Not an ADS-ordering cache, and keyed by node id, as Envoy Gateway
	// builds its own.
	s.cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	s.serve(ln)
	tb.Cleanup(s.Stop)
	return s
}

// serve starts a gRPC server on ln with a fresh xDS server on the cache.
func (s *XDSServer) serve(ln net.Listener) {
	var opts []grpc.ServerOption
	if s.creds != nil {
		opts = append(opts, grpc.Creds(s.creds))
	}
	g := grpc.NewServer(opts...)
	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			s.mu.Lock()
			s.opened++
			s.mu.Unlock()
			return nil
		},
	}
	xds := serverv3.NewServer(context.Background(), s.cache, callbacks)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, recorder{xds, s})
	served := make(chan struct{})
	s.mu.Lock()
	s.grpc, s.served = g, served
	s.mu.Unlock()
	go func() {
		defer close(served)
		_ = g.Serve(ln)
	}()
}

// recorder records every request of a stream, with the stream's metadata,
// before the xDS server sees it. (The server's own callback does not see
// the metadata.)
type recorder struct {
	discoveryv3.AggregatedDiscoveryServiceServer
	s *XDSServer
}

func (r recorder) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	return r.AggregatedDiscoveryServiceServer.StreamAggregatedResources(recordingStream{stream, r.s, md})
}

type recordingStream struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	s  *XDSServer
	md metadata.MD
}

func (r recordingStream) Recv() (*discoveryv3.DiscoveryRequest, error) {
	req, err := r.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Recv()
	if err == nil {
		r.s.mu.Lock()
		r.s.requests = append(r.s.requests, XDSRequest{proto.Clone(req).(*discoveryv3.DiscoveryRequest), r.md})
		close(r.s.changed)
		r.s.changed = make(chan struct{})
		r.s.mu.Unlock()
	}
	return req, err
}

// Stop stops the server and closes every connection at once, as a crashed
// or restarted management server does. The snapshots stay for Restart.
func (s *XDSServer) Stop() {
	s.mu.Lock()
	g, served := s.grpc, s.served
	s.grpc = nil
	s.mu.Unlock()
	if g == nil {
		return
	}
	g.Stop()
	<-served
}

// Restart serves again on the same address, with the same snapshots, after
// Stop. The port may have been taken meanwhile; Restart retries for a
// while, then fails the test.
func (s *XDSServer) Restart(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", s.Addr)
		if err == nil {
			s.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("harness: restart on %s: %v", s.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SetConfigs publishes a new snapshot for nodeID holding configs, with the
// next version ("1", "2", ...), and returns that version. No configs
// publishes an empty snapshot: no rules at all.
func (s *XDSServer) SetConfigs(tb testing.TB, nodeID string, configs ...*rlsconfv3.RateLimitConfig) string {
	tb.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	s.mu.Lock()
	s.version++
	version := strconv.Itoa(s.version)
	s.mu.Unlock()
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		tb.Fatal(err)
	}
	return version
}

// Requests returns the requests received so far, in order.
func (s *XDSServer) Requests() []XDSRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]XDSRequest(nil), s.requests...)
}

// StreamsOpened counts the ADS streams opened so far.
func (s *XDSServer) StreamsOpened() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened
}

// WaitRequest waits until a request received from now on, or already
// received at index from or later, satisfies ok, and returns it. It fails
// the test after within.
func (s *XDSServer) WaitRequest(tb testing.TB, from int, within time.Duration, what string, ok func(XDSRequest) bool) XDSRequest {
	tb.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for i := from; ; {
		s.mu.Lock()
		reqs, changed := s.requests, s.changed
		s.mu.Unlock()
		for ; i < len(reqs); i++ {
			if ok(reqs[i]) {
				return reqs[i]
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("harness: no %s within %v; requests: %v", what, within, reqs)
			return XDSRequest{}
		}
	}
}

// ACKed reports whether req accepts version for node.
func ACKed(req XDSRequest, node, version string) bool {
	return req.GetNode().GetId() == node && req.GetVersionInfo() == version && req.GetResponseNonce() != "" && !req.NACK()
}
