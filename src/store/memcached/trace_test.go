package memcached

import (
	"context"
	"errors"
	"slices"
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

// children returns the names of the spans under parent, sorted, after
// waiting for n of them.
func children(t *testing.T, rcv *harness.OTLPReceiver, parent string, n int) []harness.Span {
	t.Helper()
	return rcv.WaitSpans(t, n, 10*time.Second, func(s harness.Span) bool { return s.ParentSpanID == parent })
}

func names(spans []harness.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

// TestRoundTripSpans: with a Tracer, each round trip of a traced request
// is a client span under the request's span, named after its command, with
// memcached's answer when it is neither a success nor a failure; an
// untraced request adds none.
func TestRoundTripSpans(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	tp, rcv := newTracer(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}, Tracer: tp.Tracer("memcached")})
	fixed, sliding := uniqueKey(t, "fixed"), uniqueKey(t, "sliding")

	// Untraced first: it writes the fixed window's key, so that the
	// traced request's incr finds it.
	b := &limiter.Batch{Ops: []limiter.Op{{Key: fixed, Limit: 5, Window: time.Minute, Hits: 1}}}
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatal(err)
	}

	ctx, parent := tp.Tracer("test").Start(t.Context(), "request")
	b = &limiter.Batch{Ops: []limiter.Op{
		{Key: fixed, Limit: 5, Window: time.Minute, Hits: 1},
		{Key: sliding, Algorithm: rules.SlidingWindow, Limit: 5, Window: time.Minute, Hits: 1},
	}}
	if err := s.Do(ctx, b); err != nil {
		t.Fatal(err)
	}
	parent.End()
	pid := parent.SpanContext().SpanID().String()
	// incr of the key written above; gets of the sliding window's new
	// key (a miss), then add.
	spans := children(t, rcv, pid, 3)
	if got, want := names(spans), []string{"memcached add", "memcached gets", "memcached incr"}; !slices.Equal(got, want) {
		t.Fatalf("round trip spans %v, want %v", got, want)
	}
	for _, sp := range spans {
		if sp.Kind != tracepb.Span_SPAN_KIND_CLIENT || sp.TraceID != parent.SpanContext().TraceID().String() || sp.Attributes["db.system.name"] != "memcached" {
			t.Errorf("%s: kind %v, trace %s, attributes %v; want a memcached client span in the request's trace", sp.Name, sp.Kind, sp.TraceID, sp.Attributes)
		}
		wantAnswer := map[string]any{"memcached gets": "miss"}[sp.Name]
		if got := sp.Attributes["ratelimit.memcached.answer"]; got != wantAnswer {
			t.Errorf("%s: answer %v, want %v", sp.Name, got, wantAnswer)
		}
		if sp.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s: error status for an answer", sp.Name)
		}
	}
	if n := len(rcv.Spans()); n != 4 {
		t.Errorf("%d spans, want the request's and its 3 round trips (none for the untraced request)", n)
	}

	// An all-or-nothing request refused by its second op: add of the
	// first op's new key, incr of the second's (over its limit of 1, and
	// counted all the same), a decr taking each hit back, and a gets of
	// each key for the answer's Remaining.
	over := uniqueKey(t, "over")
	do(t, s, false, time.Time{}, limiter.Op{Key: over, Limit: 1, Window: time.Minute, Hits: 1})
	ctx, parent = tp.Tracer("test").Start(t.Context(), "refused")
	b = &limiter.Batch{AllOrNothing: true, Ops: []limiter.Op{
		{Key: uniqueKey(t, "first"), Limit: 5, Window: time.Minute, Hits: 1},
		{Key: over, Limit: 1, Window: time.Minute, Hits: 1},
	}}
	if err := s.Do(ctx, b); err != nil {
		t.Fatal(err)
	}
	parent.End()
	if b.Results[1].Allowed {
		t.Fatal("second op allowed over its limit")
	}
	got := names(children(t, rcv, parent.SpanContext().SpanID().String(), 6))
	if want := []string{"memcached add", "memcached decr", "memcached decr", "memcached gets", "memcached gets", "memcached incr"}; !slices.Equal(got, want) {
		t.Errorf("round trips of a refused all-or-nothing request %v, want %v", got, want)
	}
}

// TestRoundTripSpanOfAFailure: a round trip that fails is an error span,
// and the request's error is unchanged.
func TestRoundTripSpanOfAFailure(t *testing.T) {
	t.Parallel()
	addr := harness.ClosedPort(t)
	tp, rcv := newTracer(t)
	s := newStore(t, Config{Addrs: []string{addr}, Timeout: time.Second, Tracer: tp.Tracer("memcached")})
	ctx, parent := tp.Tracer("test").Start(t.Context(), "request")
	err := s.Do(ctx, &limiter.Batch{Ops: []limiter.Op{{Key: "k", Limit: 5, Window: time.Minute, Hits: 1}}})
	parent.End()
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("Do with memcached down = %v, want ErrUnavailable", err)
	}
	sp := children(t, rcv, parent.SpanContext().SpanID().String(), 1)[0]
	if sp.StatusCode != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("span of a failed round trip %s: status %v, want error", sp.Name, sp.StatusCode)
	}
}
