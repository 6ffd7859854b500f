package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/settings"
)

// tracerName is the instrumentation scope of every span.
const tracerName = "github.com/ratelimitd/ratelimit"

// tracing is the OpenTelemetry SDK as the TRACING_* settings ask. Spans
// leave through a batch span processor: ending a span only queues it, and
// a background goroutine exports the queue every 5 s or by 512. The queue
// holds at most 2048 spans (OTEL_BSP_MAX_QUEUE_SIZE; a few hundred bytes
// each); past that new spans are dropped, never waited for, so a collector
// that is down or slow costs requests nothing but the spans themselves.
type tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// newTracing sets up tracing, or returns nil when TRACING_ENABLED is
// false. Where spans go is read by the exporter from the OTEL_EXPORTER_OTLP_*
// variables, as in the anchor; neither exporter connects before its first
// export, so a collector that is not there does not delay the start.
func newTracing(ctx context.Context, set *settings.Settings, log *slog.Logger) (*tracing, error) {
	if !set.TracingEnabled {
		return nil, nil
	}
	// The SDK reports failed exports and its own troubles through
	// process-wide hooks that print to stderr in a format of their own;
	// send them to the service's log, in its format (LOG_FORMAT).
	otel.SetErrorHandler(&exportErrors{log: log})
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))

	var exp sdktrace.SpanExporter
	var err error
	switch set.TracingExporterProtocol {
	case settings.TracingGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("server: tracing: %w", err)
	}
	instance := set.TracingServiceInstanceID
	if instance == "" {
		// As the anchor: each process its own instance.
		instance = newUUID()
	}
	attrs := []attribute.KeyValue{
		attribute.String("service.name", set.TracingServiceName),
		attribute.String("service.instance.id", instance),
	}
	if set.TracingServiceNamespace != "" {
		attrs = append(attrs, attribute.String("service.namespace", set.TracingServiceNamespace))
	}
	// OTEL_RESOURCE_ATTRIBUTES adds to the resource; the TRACING_*
	// settings, given last, win over it.
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithAttributes(attrs...))
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES: the rest of the resource
		// is still good.
		log.Warn("tracing: resource attributes from the environment ignored", "err", err)
	}
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		// As the anchor: a request whose caller sent a trace context
		// follows the caller's sampling decision, so that traces are
		// whole; the rate applies to traces that start here.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(set.TracingSamplingRate))),
	)
	log.Info("tracing enabled", "protocol", set.TracingExporterProtocol, "service", set.TracingServiceName,
		"namespace", set.TracingServiceNamespace, "instance", instance, "sampling_rate", set.TracingSamplingRate)
	return &tracing{provider: provider, tracer: provider.Tracer(tracerName)}, nil
}

// Tracer returns the tracer, or nil when tracing is off (t is nil).
func (t *tracing) Tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// flush exports the spans still queued and stops the exporter, within
// ctx: a collector that does not answer costs the shutdown no more than
// what is left of the drain.
func (t *tracing) flush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// exportErrorEvery is the least time between two log lines about failed
// exports: with the collector down, every export fails.
const exportErrorEvery = 10 * time.Second

// exportErrors logs the SDK's errors, at most one line per
// exportErrorEvery, with the number held back.
type exportErrors struct {
	log *slog.Logger
	// mu guards last and held.
	mu   sync.Mutex
	last time.Time
	held int
}

func (e *exportErrors) Handle(err error) {
	e.mu.Lock()
	now := time.Now()
	if !e.last.IsZero() && now.Sub(e.last) < exportErrorEvery {
		e.held++
		e.mu.Unlock()
		return
	}
	held := e.held
	e.last, e.held = now, 0
	e.mu.Unlock()
	e.log.Warn("tracing: spans not exported", "err", err, "suppressed", held)
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
