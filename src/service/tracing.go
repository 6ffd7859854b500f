package service

import (
	"context"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/wire"
)

// The spans of one request: a server span per decision, named as the
// OpenTelemetry RPC and HTTP conventions name them, so that tracing
// backends group them with the caller's client span.
const (
	grpcSpanName = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	jsonSpanName = "POST /json"
)

// Span attributes. domain is the anchor's name for it, kept so that
// queries written for the anchor's traces still find it. Descriptor keys
// and values are never recorded: they carry client addresses, user IDs
// and API keys (the anchor records the whole request as a string).
const (
	attrDomain      = attribute.Key("domain")
	attrDescriptors = attribute.Key("ratelimit.descriptors")
	attrOverLimit   = attribute.Key("ratelimit.descriptors_over_limit")
	attrOverall     = attribute.Key("ratelimit.overall_code")
	attrDegraded    = attribute.Key("ratelimit.degraded")
	attrGRPCStatus  = attribute.Key("rpc.grpc.status_code")
	attrHTTPStatus  = attribute.Key("http.response.status_code")
)

// The attributes that say what was called. They are set once a span is
// known to be recorded: the sampler does not read them, and giving them
// to Start would copy them for every span, sampled or not.
var (
	grpcAttributes = []attribute.KeyValue{
		attribute.String("rpc.system", "grpc"),
		attribute.String("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
		attribute.String("rpc.method", "ShouldRateLimit"),
	}
	jsonAttributes = []attribute.KeyValue{
		attribute.String("http.request.method", "POST"),
		attribute.String("http.route", "/json"),
	}
	// serverSpan is a slice made once: a variadic argument list would be
	// made, and escape, at every call.
	serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
)

// Propagator returns the propagator that reads the trace context Envoy
// sends: W3C trace context (traceparent), from its OpenTelemetry tracer,
// or else B3 (the b3 header, or X-B3-TraceId and the others), from its
// Zipkin tracer. The first that finds a valid context wins. The anchor
// reads W3C only, so a Zipkin-traced Envoy's spans and its own were two
// traces there.
func Propagator() propagation.TextMapPropagator {
	return envoyPropagator{w3c: propagation.TraceContext{}, b3: b3.New()}
}

type envoyPropagator struct{ w3c, b3 propagation.TextMapPropagator }

func (p envoyPropagator) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	if out := p.w3c.Extract(ctx, c); trace.SpanContextFromContext(out).IsRemote() {
		return out
	}
	// B3's extractor adds to the context even when it finds nothing (it
	// records a deferred sampling decision): ask it only when there is
	// something to find.
	if c.Get("b3") == "" && c.Get("x-b3-traceid") == "" {
		return ctx
	}
	return p.b3.Extract(ctx, c)
}

func (p envoyPropagator) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	p.w3c.Inject(ctx, c)
	p.b3.Inject(ctx, c)
}

func (p envoyPropagator) Fields() []string {
	return append(p.w3c.Fields(), p.b3.Fields()...)
}

// incomingCarrier reads a trace context from the gRPC metadata of ctx,
// where Envoy puts traceparent (its OpenTelemetry tracer) or the b3
// headers (its Zipkin tracer). It looks up one key at a time: the
// propagators ask for a handful, mostly absent, and
// metadata.FromIncomingContext would copy every key and value of every
// request first.
type incomingCarrier struct{ ctx context.Context }

func (c *incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set is never called: the service extracts, and injects nowhere.
func (c *incomingCarrier) Set(string, string) {}

func (c *incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	return keys
}

// startSpan starts the span of one decision as a child of the trace
// context carrier holds, if any. Only called with a Tracer.
func (s *Service) startSpan(ctx context.Context, carrier propagation.TextMapCarrier, name string, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	if s.cfg.Propagator != nil {
		ctx = s.cfg.Propagator.Extract(ctx, carrier)
	}
	ctx, span := s.cfg.Tracer.Start(ctx, name, serverSpan...)
	if span.IsRecording() {
		span.SetAttributes(attrs...)
	}
	return ctx, span
}

// endSpan records the outcome of the decision on its span: what the
// request asked for in outline and what it got. It does not end it.
func endSpan(span trace.Span, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse, err error) {
	if !span.IsRecording() {
		return
	}
	// The domain comes from the client: only a valid one is recorded,
	// so that a hostile request cannot make spans large.
	if d := req.GetDomain(); len(d) <= wire.MaxDomainLen && utf8.ValidString(d) {
		span.SetAttributes(attrDomain.String(d))
	}
	span.SetAttributes(attrDescriptors.Int(len(req.GetDescriptors())))
	if err != nil {
		st := status.Convert(err)
		span.SetAttributes(attrGRPCStatus.Int(int(st.Code())))
		span.SetStatus(otelcodes.Error, st.Message())
		return
	}
	over := 0
	for _, st := range resp.GetStatuses() {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			over++
		}
	}
	span.SetAttributes(
		attrGRPCStatus.Int(0),
		attrOverall.String(resp.GetOverallCode().String()),
		attrOverLimit.Int(over),
	)
}

// markDegraded records on the request's span that its decision came from
// Config.Fallback. Only called with a Tracer: it reads ctx.
func markDegraded(ctx context.Context) {
	trace.SpanFromContext(ctx).SetAttributes(attrDegraded.Bool(true))
}
