package server

import (
	"sync"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// Bounds of the long-lived calls besides the quota service's, which has
// bounds of its own (RLQS_MAX_STREAMS and its per-peer share): health's
// Watch and reflection's stream. Each holds a goroutine and about 12 KB
// until its client leaves, and neither MAX_CONCURRENT_REQUESTS nor the
// half-sent bound counts them (issue 36: 102,400 Watch streams from one
// address took the process from 23 to 1,259 MB). Envoy uses neither;
// health checkers poll Check, a unary call.
const (
	maxLongStreams        = 1024
	maxLongStreamsPerPeer = 16
)

// streamBound counts the long-lived calls open, in all and per client IP
// address (wire.PeerHost: a loopback or unix-socket client has no share of
// its own, only of the total). It is safe for concurrent use.
type streamBound struct {
	// mu guards open and byPeer, and max and maxPerPeer, which tests lower.
	mu              sync.Mutex
	open            int
	byPeer          map[string]int
	max, maxPerPeer int
	refused         *stats.Counter
}

func newStreamBound(reg *stats.Registry) *streamBound {
	return &streamBound{
		byPeer:     map[string]int{},
		max:        maxLongStreams,
		maxPerPeer: maxLongStreamsPerPeer,
		refused:    reg.Counter("ratelimit.server.streams_refused"),
	}
}

// enter takes a place for a stream of the client at addr, or says which
// bound is reached.
func (b *streamBound) enter(addr string) (leave func(), err error) {
	host := wire.PeerHost(addr)
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.open >= b.max:
		b.refused.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "server: %d long-lived calls (health watches, reflection) open already", b.max)
	case host != "" && b.byPeer[host] >= b.maxPerPeer:
		b.refused.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "server: %d long-lived calls (health watches, reflection) open already from this address", b.maxPerPeer)
	}
	b.open++
	if host != "" {
		b.byPeer[host]++
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.open--
		if host != "" {
			if b.byPeer[host]--; b.byPeer[host] == 0 {
				delete(b.byPeer, host)
			}
		}
	}, nil
}

// intercept applies the bound to every streaming call but the quota
// service's.
func (b *streamBound) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod == rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName {
		return handler(srv, ss)
	}
	var addr string
	if p, ok := peer.FromContext(ss.Context()); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	leave, err := b.enter(addr)
	if err != nil {
		return err
	}
	defer leave()
	return handler(srv, ss)
}
