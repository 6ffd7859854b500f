package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// newTracer returns a tracer that exports each span as it ends over
// OTLP/gRPC to a real receiver.
func newTracer(t *testing.T) (*sdktrace.TracerProvider, *harness.OTLPReceiver) {
	t.Helper()
	rcv := harness.StartOTLP(t)
	exp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpoint(rcv.GRPCAddr), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rcv
}

// TestRoundTripSpans: with a Tracer, each round trip of a traced request
// to each Redis is a client span under the request's span, with its
// commands, the pipeline it shared and when it left; a request whose span
// is not recorded adds none.
func TestRoundTripSpans(t *testing.T) {
	t.Parallel()
	main := harness.StartRedis(t, harness.RedisOptions{})
	second := harness.StartRedis(t, harness.RedisOptions{})
	tp, rcv := newTracer(t)
	s := newStore(t, Config{URL: main.Addr, PerSecond: &Config{URL: second.Addr}, Tracer: tp.Tracer("redis")})

	// Untraced first: its round trips must not show up among the spans
	// that the traced request's wait below collects.
	b := &limiter.Batch{Ops: []limiter.Op{{Key: "trace_untraced", Limit: 5, Window: time.Minute, Hits: 1}}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatal(err)
	}

	ctx, parent := tp.Tracer("test").Start(t.Context(), "request")
	b = &limiter.Batch{Ops: []limiter.Op{
		{Key: "trace_minute", Limit: 5, Window: time.Minute, Hits: 1},
		{Key: "trace_sliding", Algorithm: rules.SlidingWindow, Limit: 5, Window: time.Minute, Hits: 1},
		{Key: "trace_second", Limit: 5, Window: time.Second, Hits: 1, PerSecond: true},
	}}
	if err := s.Do(ctx, b); err != nil {
		t.Fatal(err)
	}
	parent.End()
	spans := rcv.WaitSpans(t, 3, 10*time.Second, nil)
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the request's and one per Redis: %v", len(spans), spans)
	}
	pid := parent.SpanContext().SpanID().String()
	want := map[string]int64{"redis pipeline": 3, "redis persecond pipeline": 2} // INCRBY+EXPIRE, EVALSHA; INCRBY+EXPIRE
	for _, sp := range spans {
		if sp.SpanID == pid {
			continue
		}
		cmds, ok := want[sp.Name]
		if !ok {
			t.Errorf("unexpected span %q", sp.Name)
			continue
		}
		delete(want, sp.Name)
		if sp.ParentSpanID != pid || sp.Kind != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("%s: parent %s kind %v, want parent %s, kind client", sp.Name, sp.ParentSpanID, sp.Kind, pid)
		}
		if sp.Attributes["db.system.name"] != "redis" || sp.Attributes["db.operation.batch.size"] != cmds {
			t.Errorf("%s: attributes %v, want db.system.name redis and %d commands", sp.Name, sp.Attributes, cmds)
		}
		if n, _ := sp.Attributes["ratelimit.redis.pipeline.requests"].(int64); n < 1 {
			t.Errorf("%s: pipeline.requests = %v, want at least 1", sp.Name, sp.Attributes["ratelimit.redis.pipeline.requests"])
		}
		if n, _ := sp.Attributes["ratelimit.redis.pipeline.commands"].(int64); n < cmds {
			t.Errorf("%s: pipeline.commands = %v, want at least %d", sp.Name, sp.Attributes["ratelimit.redis.pipeline.commands"], cmds)
		}
		if len(sp.Events) != 1 || sp.Events[0] != "sent" {
			t.Errorf("%s: events %v, want [sent]", sp.Name, sp.Events)
		}
	}
	if len(want) > 0 {
		t.Errorf("no span for %v", want)
	}
}

// TestRoundTripSpanOfAFailure: a round trip that fails is an error span,
// and the request's error is unchanged.
func TestRoundTripSpanOfAFailure(t *testing.T) {
	t.Parallel()
	tp, rcv := newTracer(t)
	s := newStore(t, Config{URL: harness.ClosedPort(t), Timeout: time.Second, Tracer: tp.Tracer("redis")})
	ctx, parent := tp.Tracer("test").Start(t.Context(), "request")
	err := s.Do(ctx, &limiter.Batch{Ops: []limiter.Op{{Key: "k", Limit: 5, Window: time.Minute, Hits: 1}}})
	parent.End()
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("Do with Redis down = %v, want ErrUnavailable", err)
	}
	sp := rcv.WaitSpans(t, 1, 10*time.Second, func(s harness.Span) bool { return s.Name == "redis pipeline" })[0]
	if sp.StatusCode != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("span of a failed round trip: status %v, want error", sp.StatusCode)
	}
}
