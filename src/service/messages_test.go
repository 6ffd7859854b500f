package service_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/service"
)

// TestFailuresTellTheKindOnly: a caller whose request failed for the store
// or the service is told the kind of failure and the store's reason, and
// nothing of the store's addresses, ports or cache keys (issue 24, case
// 10): those stay in the error the log gets.
func TestFailuresTellTheKindOnly(t *testing.T) {
	const secret = "10.0.0.7:6380"
	const key = "test_user_alice_1700000000"
	tests := []struct {
		name string
		give error
		code codes.Code
		want string
	}{
		{"unavailable", fmt.Errorf("redis %s: %w: dial tcp %s: connection refused", secret, limiter.ErrUnavailable, secret),
			codes.Unavailable, "store unavailable"},
		{"breaker_open", fmt.Errorf("redis %s: %w: %w after 5 failures in a row", secret, limiter.ErrUnavailable, limiter.ReasonBreakerOpen),
			codes.Unavailable, "store unavailable: circuit breaker open"},
		{"deadline", fmt.Errorf("redis %s: %w: %w", secret, limiter.ErrUnavailable, context.DeadlineExceeded),
			codes.DeadlineExceeded, "deadline exceeded"},
		{"queue_full", fmt.Errorf("redis %s: %w: 4096 requests wait for Redis already", secret, limiter.ErrOverloaded),
			codes.ResourceExhausted, "store overloaded"},
		{"out_of_memory", fmt.Errorf("redis %s: key %q: %w: %w: OOM command not allowed", secret, key, limiter.ErrOverloaded, limiter.ReasonOutOfMemory),
			codes.ResourceExhausted, "store overloaded: out of memory"},
		{"store_reason", fmt.Errorf("memcached: key %q: %w: %w after 32 attempts", key, limiter.ErrOverloaded, limiter.Reason("item changed by others at every attempt")),
			codes.ResourceExhausted, "store overloaded: item changed by others at every attempt"},
		{"data", fmt.Errorf("redis %s: key %q: %w: WRONGTYPE Operation against a key holding the wrong kind of value", secret, key, limiter.ErrData),
			codes.Internal, "store refused the data"},
		{"impossible_reply", fmt.Errorf("redis %s: key %q: INCRBY answered -3", secret, key),
			codes.Internal, "internal error"},
		{"joined", errors.Join(fmt.Errorf("redis %s: %w", secret, limiter.ErrUnavailable), fmt.Errorf("redis persecond %s: key %q: %w", secret, key, limiter.ErrData)),
			codes.Unavailable, "store unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWithStore(t, service.Config{}, storeFunc(func(context.Context, *limiter.Batch) error { return tt.give }))
			_, err := f.svc.ShouldRateLimit(t.Context(), req(desc("user", "alice")))
			st := status.Convert(err)
			if st.Code() != tt.code || st.Message() != tt.want {
				t.Errorf("ShouldRateLimit with the store failing %q = %v %q, want %v %q", tt.give, st.Code(), st.Message(), tt.code, tt.want)
			}
			if strings.Contains(st.Message(), "10.0.0.7") || strings.Contains(st.Message(), "6380") || strings.Contains(st.Message(), key) {
				t.Errorf("message %q names the store's address or the cache key", st.Message())
			}
		})
	}
}
