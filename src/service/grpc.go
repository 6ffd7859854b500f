package service

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Tap is a gRPC tap handle (grpc.InTapHandle) that applies
// Config.MaxConcurrent to ShouldRateLimit before its message is read, so
// that requests past the bound cost neither a goroutine nor the memory of
// their message: while that many decisions are under way, a new one is
// refused at once with ResourceExhausted and counted as load_shed, and so
// is a call whose deadline is too short for the wait behind the calls in
// flight (see overloaded). It takes no place itself: ShouldRateLimit does
// once the message has come, so that a call whose message never comes
// (its headers alone, for as long as its caller's deadline, or for ever)
// holds none, as a /json body still arriving holds none (issue 24: 4,096
// such calls refused every other one, which Envoy's default
// failure_mode_deny: false admits).
func (s *Service) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if s.cfg.MaxConcurrent <= 0 || info.FullMethodName != rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
		return ctx, nil
	}
	n := s.inFlight.Load()
	if n >= int64(s.cfg.MaxConcurrent) {
		return nil, s.shed()
	}
	if n+1 < loadMinInFlight {
		return ctx, nil // as overloaded would, without reading the clock
	}
	if err := s.overloaded(ctx, n+1, time.Now()); err != nil {
		return nil, err
	}
	return ctx, nil
}

// acquire takes a place among the Config.MaxConcurrent decisions in flight.
func (s *Service) acquire() bool {
	if s.inFlight.Add(1) > int64(s.cfg.MaxConcurrent) {
		s.inFlight.Add(-1)
		return false
	}
	return true
}

// release gives back a place taken by acquire once its decision
// has finished, and counts it for the rate overloaded reads.
func (s *Service) release() {
	s.inFlight.Add(-1)
	s.load.finished(time.Now())
}

// shed counts a request refused for load and returns its error.
func (s *Service) shed() error {
	s.loadShed.Inc()
	s.cfg.Log.Debug("request shed", "reason", "MAX_CONCURRENT_REQUESTS reached", "limit", s.cfg.MaxConcurrent)
	return status.Errorf(codes.ResourceExhausted, "service: %d requests in flight already (MAX_CONCURRENT_REQUESTS)", s.cfg.MaxConcurrent)
}

// InFlight returns the number of decisions under way that count against
// Config.MaxConcurrent (0 when it is not set).
func (s *Service) InFlight() int64 { return s.inFlight.Load() }
