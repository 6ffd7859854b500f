package service_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/wire"
	"github.com/ratelimitd/ratelimit/src/wire/wiretest"
)

// The caller's span, as Envoy sends it.
const (
	parentTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpanID  = "00f067aa0ba902b7"
)

// tracer returns a tracer that exports every span, as it ends, over
// OTLP/gRPC to a real receiver, with the sampler the server uses
// (parent-based, rate for new traces).
func tracer(t testing.TB, rate float64) (*sdktrace.TracerProvider, *harness.OTLPReceiver) {
	t.Helper()
	return tracerWith(t, rate, sdktrace.WithSyncer)
}

// tracerWith is tracer with the span processor process makes.
func tracerWith(t testing.TB, rate float64, process func(sdktrace.SpanExporter) sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, *harness.OTLPReceiver) {
	t.Helper()
	rcv := harness.StartOTLP(t)
	exp, err := otlptracegrpc.New(t.Context(), otlptracegrpc.WithEndpoint(rcv.GRPCAddr), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(process(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(rate))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rcv
}

// grpcClient serves f's service on an in-memory gRPC connection.
func grpcClient(t *testing.T, f *fixture) rlsv3.RateLimitServiceClient {
	t.Helper()
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, f.svc)
	return rlsv3.NewRateLimitServiceClient(wiretest.Client(t, srv))
}

// TestTracingSpanPerRequest: each ShouldRateLimit call is one server span,
// the child of the span whose context Envoy sent in the gRPC metadata
// (traceparent from its OpenTelemetry tracer, b3 headers from its Zipkin
// one), with the domain, the descriptor count and the outcome, and none
// of the descriptors' values.
func TestTracingSpanPerRequest(t *testing.T) {
	tests := []struct {
		name     string
		md       []string
		give     *rlsv3.RateLimitRequest
		wantCode string
		noParent bool
	}{
		{
			name:     "traceparent",
			md:       []string{"traceparent", "00-" + parentTraceID + "-" + parentSpanID + "-01"},
			give:     req(desc("user", "alice")),
			wantCode: "OK",
		},
		{
			name:     "b3_single_header",
			md:       []string{"b3", parentTraceID + "-" + parentSpanID + "-1"},
			give:     req(desc("user", "bob")),
			wantCode: "OK",
		},
		{
			name: "b3_multiple_headers",
			md: []string{"x-b3-traceid", parentTraceID, "x-b3-spanid", parentSpanID, "x-b3-sampled", "1",
				"x-b3-parentspanid", "05e3ac9a4f6e3b90"},
			give:     req(desc("user", "carol"), desc("ip", "10.0.0.1")),
			wantCode: "OK",
		},
		{
			name:     "over_limit",
			md:       []string{"traceparent", "00-" + parentTraceID + "-" + parentSpanID + "-01"},
			give:     req(desc("user", "erin"), desc("tier", "basic"), desc("tier", "basic")),
			wantCode: "OVER_LIMIT",
		},
		{
			name:     "no_parent",
			give:     req(desc("user", "dave")),
			wantCode: "OK",
			noParent: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp, rcv := tracer(t, 1)
			f := newFixture(t, service.Config{Tracer: tp.Tracer("test"), Propagator: service.Propagator()})
			c := grpcClient(t, f)
			ctx := metadata.AppendToOutgoingContext(t.Context(), tt.md...)
			resp, err := c.ShouldRateLimit(ctx, tt.give)
			if err != nil {
				t.Fatal(err)
			}
			spans := rcv.WaitSpans(t, 1, 10*time.Second, nil)
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1: %v", len(spans), spans)
			}
			s := spans[0]
			if tt.noParent {
				if s.ParentSpanID != "" || s.TraceID == parentTraceID {
					t.Errorf("span without a caller: trace %s parent %q, want a new trace", s.TraceID, s.ParentSpanID)
				}
			} else if s.TraceID != parentTraceID || s.ParentSpanID != parentSpanID {
				t.Errorf("span trace %s parent %s, want trace %s parent %s", s.TraceID, s.ParentSpanID, parentTraceID, parentSpanID)
			}
			if s.Name != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || s.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("span %q of kind %v, want the RPC's name, kind server", s.Name, s.Kind)
			}
			want := map[string]any{
				"domain":                           "test",
				"ratelimit.descriptors":            int64(len(tt.give.GetDescriptors())),
				"ratelimit.overall_code":           tt.wantCode,
				"ratelimit.descriptors_over_limit": int64(countOver(resp)),
				"rpc.system":                       "grpc",
				"rpc.method":                       "ShouldRateLimit",
				"rpc.grpc.status_code":             int64(0),
			}
			for k, v := range want {
				if s.Attributes[k] != v {
					t.Errorf("attribute %s = %v (%T), want %v (%T)", k, s.Attributes[k], s.Attributes[k], v, v)
				}
			}
			if resp.GetOverallCode().String() != tt.wantCode {
				t.Errorf("overall code %v, want %s", resp.GetOverallCode(), tt.wantCode)
			}
			for k, v := range s.Attributes {
				for _, d := range tt.give.GetDescriptors() {
					for _, e := range d.GetEntries() {
						if str, ok := v.(string); ok && strings.Contains(str, e.GetValue()) {
							t.Errorf("attribute %s = %q holds the descriptor value %q", k, str, e.GetValue())
						}
					}
				}
			}
		})
	}
}

func countOver(resp *rlsv3.RateLimitResponse) int {
	n := 0
	for _, st := range resp.GetStatuses() {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			n++
		}
	}
	return n
}

// TestTracingRefusedRequest: a refused request's span carries the gRPC
// code and an error status, and no domain that breaks the bounds.
func TestTracingRefusedRequest(t *testing.T) {
	tp, rcv := tracer(t, 1)
	f := newFixture(t, service.Config{Tracer: tp.Tracer("test"), Propagator: service.Propagator()})
	long := strings.Repeat("d", wire.MaxDomainLen+1)
	if _, err := f.svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: long, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "x")}}); err == nil {
		t.Fatal("a domain over the bound was accepted")
	}
	s := rcv.WaitSpans(t, 1, 10*time.Second, nil)[0]
	if s.StatusCode != tracepb.Status_STATUS_CODE_ERROR || s.Attributes["rpc.grpc.status_code"] != int64(3) {
		t.Errorf("span status %v, rpc.grpc.status_code %v; want error, 3 (InvalidArgument)", s.StatusCode, s.Attributes["rpc.grpc.status_code"])
	}
	if _, ok := s.Attributes["domain"]; ok {
		t.Errorf("a domain over the bound was recorded")
	}
}

// TestTracingJSON: a /json request is a server span too, whose parent is
// read from the HTTP headers, with the HTTP status it got.
func TestTracingJSON(t *testing.T) {
	tp, rcv := tracer(t, 1)
	f := newFixture(t, service.Config{Tracer: tp.Tracer("test"), Propagator: service.Propagator()})
	body := `{"domain":"test","descriptors":[{"entries":[{"key":"tier","value":"basic"}]}]}`
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		r := httptest.NewRequest(http.MethodPost, "/json", bytes.NewBufferString(body))
		r.Header.Set("Traceparent", "00-"+parentTraceID+"-"+parentSpanID+"-01")
		w := httptest.NewRecorder()
		f.svc.ServeJSON(w, r)
		if w.Code != want {
			t.Fatalf("request %d: status %d, want %d", i, w.Code, want)
		}
		s := rcv.WaitSpans(t, i+1, 10*time.Second, nil)[i]
		if s.Name != "POST /json" || s.TraceID != parentTraceID || s.ParentSpanID != parentSpanID {
			t.Errorf("request %d: span %q trace %s parent %s, want POST /json under the caller's span", i, s.Name, s.TraceID, s.ParentSpanID)
		}
		if s.Attributes["http.response.status_code"] != int64(want) {
			t.Errorf("request %d: http.response.status_code = %v, want %d", i, s.Attributes["http.response.status_code"], want)
		}
	}
}

// TestTracingSamplingRate: with a rate of 0 a request that starts its
// trace here, or whose caller did not sample it, exports nothing; a
// caller that sampled its span gets the child it expects, as the anchor's
// parent-based sampler does.
func TestTracingSamplingRate(t *testing.T) {
	tp, rcv := tracer(t, 0)
	f := newFixture(t, service.Config{Tracer: tp.Tracer("test"), Propagator: service.Propagator()})
	c := grpcClient(t, f)
	for _, md := range [][]string{
		nil,
		{"traceparent", "00-" + parentTraceID + "-" + parentSpanID + "-00"},
		{"x-b3-traceid", parentTraceID, "x-b3-spanid", parentSpanID, "x-b3-sampled", "0"},
	} {
		if _, err := c.ShouldRateLimit(metadata.AppendToOutgoingContext(t.Context(), md...), req(desc("ip", "10.0.0.9"))); err != nil {
			t.Fatal(err)
		}
	}
	// Then one sampled by its caller, so that the receiver has something
	// to wait for: spans are exported as they end, in order.
	sampled := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if _, err := c.ShouldRateLimit(metadata.AppendToOutgoingContext(t.Context(), "traceparent", sampled), req(desc("ip", "10.0.0.9"))); err != nil {
		t.Fatal(err)
	}
	spans := rcv.WaitSpans(t, 1, 10*time.Second, nil)
	if len(spans) != 1 || spans[0].TraceID != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("spans %v, want only the one whose caller sampled it", spans)
	}
}

// TestShouldRateLimitAllocsTracingOff: with tracing off a decision
// allocates what it did before tracing existed (the response and its
// statuses, pooled with the decision's scratch space).
func TestShouldRateLimitAllocsTracingOff(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race")
	}
	f := newFixture(t, service.Config{})
	r := req(desc("ip", "10.0.0.1"))
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("traceparent", "00-"+parentTraceID+"-"+parentSpanID+"-01"))
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := f.svc.ShouldRateLimit(ctx, r); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("ShouldRateLimit: %v allocs per call with tracing off, want at most 2", allocs)
	}
}

// BenchmarkShouldRateLimitTracing is BenchmarkShouldRateLimit with
// tracing off; on at rate 0 under an unsampled W3C parent, as from an
// Envoy that samples little ("unsampled": the cost of reading the caller's
// context and deciding); and on under a sampled parent, every span
// recorded and sent in batches to a real OTLP receiver in the same
// process, whose CPU counts too (it counts the spans without keeping
// them). In "sampled" the batch processor is the service's, which drops
// the spans its queue (2048) cannot hold: at full speed on a loaded
// machine it sends only part of them, reported as exported/op. In
// "exported" it waits for room instead, so that every span is sent: the
// whole cost of a sampled decision, receiver included. Compare the
// variants in one run, taking turns.
func BenchmarkShouldRateLimitTracing(b *testing.B) {
	for _, v := range []struct {
		name    string
		tracing bool
		flags   string
		// block makes the batch processor wait for room in its queue.
		block bool
	}{{"off", false, "00", false}, {"unsampled", true, "00", false}, {"sampled", true, "01", false}, {"exported", true, "01", true}} {
		b.Run(v.name, func(b *testing.B) {
			const users = 10_000
			cfg := service.Config{}
			var tp *sdktrace.TracerProvider
			var rcv *harness.OTLPReceiver
			if v.tracing {
				tp, rcv = benchTracer(b, v.block)
				cfg.Tracer, cfg.Propagator = tp.Tracer("bench"), service.Propagator()
			}
			f := newFixture(b, cfg)
			reqs := make([]*rlsv3.RateLimitRequest, users)
			for i := range reqs {
				reqs[i] = &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0." + strconv.Itoa(i)}},
				}}}
			}
			ctx := metadata.NewIncomingContext(b.Context(), metadata.Pairs("traceparent", "00-"+parentTraceID+"-"+parentSpanID+"-"+v.flags))
			var next atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := f.svc.ShouldRateLimit(ctx, reqs[next.Add(1)%users]); err != nil {
						b.Fatal(err)
					}
				}
			})
			if tp != nil {
				// The share of the decisions whose span reached the
				// receiver.
				b.StopTimer()
				_ = tp.ForceFlush(b.Context())
				b.ReportMetric(float64(rcv.Count())/float64(b.N), "exported/op")
			}
		})
	}
}

// benchTracer is tracer at rate 0 with the batch processor, and a
// receiver that keeps no span; with block the processor waits for room in
// its queue rather than dropping spans.
func benchTracer(b *testing.B, block bool) (*sdktrace.TracerProvider, *harness.OTLPReceiver) {
	b.Helper()
	var opts []sdktrace.BatchSpanProcessorOption
	if block {
		opts = append(opts, sdktrace.WithBlocking())
	}
	tp, rcv := tracerWith(b, 0, func(e sdktrace.SpanExporter) sdktrace.TracerProviderOption { return sdktrace.WithBatcher(e, opts...) })
	rcv.Discard()
	return tp, rcv
}
