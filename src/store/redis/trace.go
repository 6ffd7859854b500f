package redis

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span attributes of a round trip, after OpenTelemetry's database
// conventions where they have a name for it.
var (
	attrSystem       = attribute.String("db.system.name", "redis")
	attrCommands     = attribute.Key("db.operation.batch.size")
	attrPipeRequests = attribute.Key("ratelimit.redis.pipeline.requests")
	attrPipeCommands = attribute.Key("ratelimit.redis.pipeline.commands")
	clientSpan       = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// startSpan starts the span of r's round trip to be, a child of the span
// in ctx. It returns nil, and traces nothing about r, when Config.Tracer
// is nil (without even looking into ctx) or when the request's own span
// is not recorded: a child of an unsampled span would be dropped anyway.
func (s *Store) startSpan(ctx context.Context, be *backend, r *request) trace.Span {
	if s.cfg.Tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return nil
	}
	_, span := s.cfg.Tracer.Start(ctx, be.name+" pipeline", clientSpan...)
	span.SetAttributes(attrSystem, attrCommands.Int(r.ncmds))
	r.traced = true
	return span
}

// endSpan ends the span of r's round trip, if any. seen says the worker
// is done with r, so that what it recorded may be read: the requests and
// commands that shared the pipeline, and when it left (the time before
// it is the wait for a connection).
func endSpan(span trace.Span, r *request, seen bool, err error) {
	if span == nil {
		return
	}
	if seen && !r.sentAt.IsZero() {
		span.AddEvent("sent", trace.WithTimestamp(r.sentAt))
		span.SetAttributes(attrPipeRequests.Int(r.pipeRequests), attrPipeCommands.Int(r.pipeCommands))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
