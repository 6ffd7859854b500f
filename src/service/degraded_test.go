package service_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// storeFunc is a store whose Do is a function: a fake for injecting one
// failure at a time.
type storeFunc func(ctx context.Context, b *limiter.Batch) error

func (f storeFunc) Do(ctx context.Context, b *limiter.Batch) error { return f(ctx, b) }

// localLimiter is a limiter over a fresh memory store, as the server makes
// for STORE_FAILURE_MODE=local.
func localLimiter(t *testing.T) *limiter.Limiter {
	t.Helper()
	m := memory.New(memory.Config{})
	t.Cleanup(m.Close)
	return limiter.New(m, limiter.Config{KeyFormat: limiter.EscapedKeys, NearLimitRatio: 0.8})
}

// isDegraded reports whether a response carries the "degraded" mark.
func isDegraded(resp *rlsv3.RateLimitResponse) bool {
	v, ok := resp.GetDynamicMetadata().GetFields()["degraded"]
	return ok && v.GetBoolValue()
}

// TestFallbackDecidesOutagesOnly: with a fallback, a store error that
// means an outage (ErrUnavailable, however it came: an open breaker, a
// spent budget) is decided from local counts, marked and counted; errors
// that are not outages keep their codes and never reach the fallback.
func TestFallbackDecidesOutagesOnly(t *testing.T) {
	unavailable := fmt.Errorf("redis: %w: connection refused", limiter.ErrUnavailable)
	tests := []struct {
		name     string
		store    storeFunc
		ctx      func(context.Context) context.Context
		want     codes.Code // of every request; OK: decided locally
		degraded bool
	}{
		{"unavailable", func(context.Context, *limiter.Batch) error { return unavailable }, nil, codes.OK, true},
		{"breaker_open", func(context.Context, *limiter.Batch) error {
			return fmt.Errorf("redis 10.0.0.1:6379: %w: circuit breaker open after 5 failures in a row", limiter.ErrUnavailable)
		}, nil, codes.OK, true},
		{"budget_spent", func(ctx context.Context, _ *limiter.Batch) error {
			<-ctx.Done()
			return fmt.Errorf("redis: %w: %w", limiter.ErrUnavailable, ctx.Err())
		}, nil, codes.OK, true},
		{"data", func(context.Context, *limiter.Batch) error {
			return fmt.Errorf("redis: key \"k\": %w: WRONGTYPE", limiter.ErrData)
		}, nil, codes.Internal, false},
		{"overloaded", func(context.Context, *limiter.Batch) error {
			return fmt.Errorf("redis: %w: queue full", limiter.ErrOverloaded)
		}, nil, codes.ResourceExhausted, false},
		{"data_and_unavailable", func(context.Context, *limiter.Batch) error {
			// Mapped as before (Unavailable), but not decided locally: a
			// data error is the request's own.
			return errors.Join(unavailable, fmt.Errorf("redis persecond: %w", limiter.ErrData))
		}, nil, codes.Unavailable, false},
		{"overloaded_and_unavailable", func(context.Context, *limiter.Batch) error {
			return errors.Join(unavailable, fmt.Errorf("redis persecond: %w", limiter.ErrOverloaded))
		}, nil, codes.ResourceExhausted, false},
		{"caller_canceled", func(ctx context.Context, _ *limiter.Batch) error {
			return fmt.Errorf("redis: %w: %w", limiter.ErrUnavailable, ctx.Err())
		}, func(ctx context.Context) context.Context {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return ctx
		}, codes.Canceled, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWithStore(t, service.Config{Fallback: localLimiter(t), Timeout: 20 * time.Millisecond}, tt.store)
			ctx := t.Context()
			if tt.ctx != nil {
				ctx = tt.ctx(ctx)
			}
			// user: 3 per minute. Locally the 4th request is over the limit.
			for i := 1; i <= 4; i++ {
				resp, err := f.svc.ShouldRateLimit(ctx, req(desc("user", "alice")))
				if status.Code(err) != tt.want {
					t.Fatalf("request %d: %v, want %v", i, err, tt.want)
				}
				if err != nil {
					continue
				}
				want := rlsv3.RateLimitResponse_OK
				if i == 4 {
					want = rlsv3.RateLimitResponse_OVER_LIMIT
				}
				if resp.GetOverallCode() != want {
					t.Errorf("request %d decided locally: %v, want %v", i, resp.GetOverallCode(), want)
				}
				if !isDegraded(resp) {
					t.Errorf("request %d decided locally: dynamic metadata %v, want degraded", i, resp.GetDynamicMetadata())
				}
			}
			snap := f.reg.Snapshot()
			wantDegraded := uint64(0)
			if tt.degraded {
				wantDegraded = 4
			}
			if got := snap["ratelimit.service.degraded_decisions"]; got != wantDegraded {
				t.Errorf("degraded_decisions = %d, want %d", got, wantDegraded)
			}
			if tt.degraded {
				if got := snap["ratelimit.service.rate_limit.test.user.over_limit"]; got != 1 {
					t.Errorf("over_limit of the rule = %d, want 1: local decisions count in the rule's statistics", got)
				}
				if got := snap["ratelimit.service.call.should_rate_limit.redis_error"]; got != 0 {
					t.Errorf("redis_error = %d, want 0: the requests were answered", got)
				}
			}
		})
	}
}

// TestFallbackOffKeepsErrors: without a fallback (STORE_FAILURE_MODE=error)
// an outage is Unavailable, as before, and nothing counts as degraded.
func TestFallbackOffKeepsErrors(t *testing.T) {
	f := newFixtureWithStore(t, service.Config{}, storeFunc(func(context.Context, *limiter.Batch) error {
		return fmt.Errorf("redis: %w", limiter.ErrUnavailable)
	}))
	for range 3 {
		if _, err := f.svc.ShouldRateLimit(t.Context(), req(desc("user", "alice"))); status.Code(err) != codes.Unavailable {
			t.Fatalf("outage without a fallback: %v, want Unavailable", err)
		}
	}
	if got := f.reg.Snapshot()["ratelimit.service.degraded_decisions"]; got != 0 {
		t.Errorf("degraded_decisions = %d, want 0", got)
	}
}

// TestFallbackReturnsToTheStore: decisions come from the store while it
// answers, from local counts while it is down, and from the store again
// once it is back; the local counts are not merged into the store.
func TestFallbackReturnsToTheStore(t *testing.T) {
	shared := memory.New(memory.Config{})
	t.Cleanup(shared.Close)
	var down atomic.Bool
	store := storeFunc(func(ctx context.Context, b *limiter.Batch) error {
		if down.Load() {
			return fmt.Errorf("redis: %w: breaker open", limiter.ErrUnavailable)
		}
		return shared.Do(ctx, b)
	})
	f := newFixtureWithStore(t, service.Config{Fallback: localLimiter(t)}, store)
	call := func() *rlsv3.RateLimitResponse {
		t.Helper()
		return f.call(t, req(desc("user", "alice")))
	}
	if resp := call(); isDegraded(resp) || resp.GetStatuses()[0].GetLimitRemaining() != 2 {
		t.Fatalf("store up: %v, want 2 remaining from the store, not degraded", resp)
	}
	down.Store(true)
	for i, want := range []uint32{2, 1} { // local counts start afresh
		if resp := call(); !isDegraded(resp) || resp.GetStatuses()[0].GetLimitRemaining() != want {
			t.Errorf("store down, request %d: %v, want %d remaining, degraded", i+1, resp, want)
		}
	}
	down.Store(false)
	if resp := call(); isDegraded(resp) || resp.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Errorf("store back: %v, want 1 remaining from the store (its own count, nothing merged), not degraded", resp)
	}
}

// TestDegradedMetadata: with RESPONSE_DYNAMIC_METADATA the mark joins the
// request summary; a decision from the store carries no mark.
func TestDegradedMetadata(t *testing.T) {
	var down atomic.Bool
	shared := memory.New(memory.Config{})
	t.Cleanup(shared.Close)
	store := storeFunc(func(ctx context.Context, b *limiter.Batch) error {
		if down.Load() {
			return fmt.Errorf("redis: %w", limiter.ErrUnavailable)
		}
		return shared.Do(ctx, b)
	})
	f := newFixtureWithStore(t, service.Config{Fallback: localLimiter(t), DynamicMetadata: true}, store)
	md := f.call(t, req(desc("backend", "a"))).GetDynamicMetadata().AsMap()
	if _, ok := md["degraded"]; ok || md["domain"] != "test" {
		t.Errorf("from the store: metadata %v, want the summary without degraded", md)
	}
	down.Store(true)
	md = f.call(t, req(desc("backend", "b"))).GetDynamicMetadata().AsMap()
	if md["degraded"] != true || md["domain"] != "test" || md["metadata"] == nil {
		t.Errorf("from local counts: metadata %v, want the summary with degraded: true", md)
	}
}
