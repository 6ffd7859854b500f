package memcached

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// The commands a round trip sends, as span names: one command per span,
// although the client pipelines the commands of concurrent requests.
const (
	cmdIncr = "incr"
	cmdDecr = "decr"
	cmdAdd  = "add"
	cmdGets = "gets"
	cmdCAS  = "cas"
)

// Span attributes of a round trip, after OpenTelemetry's database
// conventions.
var (
	attrSystem    = attribute.String("db.system.name", "memcached")
	attrOperation = attribute.Key("db.operation.name")
	// attrAnswer is memcached's answer when it is not a success but not
	// a failure either: a miss, "not stored", "exists" (a cas conflict).
	attrAnswer = attribute.Key("ratelimit.memcached.answer")
	clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	spanNames  = map[string]string{
		cmdIncr: "memcached incr", cmdDecr: "memcached decr", cmdAdd: "memcached add",
		cmdGets: "memcached gets", cmdCAS: "memcached cas",
	}
)

// startSpan starts the span of one round trip sending cmd, a child of the
// span in ctx. It returns nil when Config.Tracer is nil (without even
// looking into ctx) or when the request's own span is not recorded: a
// child of an unsampled span would be dropped anyway.
func (s *Store) startSpan(ctx context.Context, cmd string) trace.Span {
	if s.cfg.Tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return nil
	}
	_, span := s.cfg.Tracer.Start(ctx, spanNames[cmd], clientSpan...)
	span.SetAttributes(attrSystem, attrOperation.String(cmd))
	return span
}

// endSpan ends the span of a round trip, if any, with memcached's answer:
// an answer that is not a success (a miss, not stored, a cas conflict) is
// an attribute, a round trip that failed an error status.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	switch {
	case err == nil:
	case errors.Is(err, mcclient.ErrCacheMiss):
		span.SetAttributes(attrAnswer.String("miss"))
	case errors.Is(err, mcclient.ErrNotStored):
		span.SetAttributes(attrAnswer.String("not_stored"))
	case errors.Is(err, mcclient.ErrExists):
		span.SetAttributes(attrAnswer.String("exists"))
	default:
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
