package server

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimit/harness"
)

const (
	envoyTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	envoySpanID  = "00f067aa0ba902b7"
)

// tracingEnv is the environment of a server that sends its spans to rcv
// over protocol.
func tracingEnv(rcv *harness.OTLPReceiver, protocol string) map[string]string {
	endpoint := rcv.HTTPURL
	if protocol == "grpc" {
		endpoint = "http://" + rcv.GRPCAddr
	}
	return map[string]string{
		"TRACING_ENABLED":             "true",
		"TRACING_EXPORTER_PROTOCOL":   protocol,
		"TRACING_SERVICE_NAME":        "envoy-ratelimit",
		"TRACING_SERVICE_NAMESPACE":   "gateway",
		"TRACING_SERVICE_INSTANCE_ID": "pod-1",
		"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
	}
}

// TestTracingExports: with TRACING_ENABLED, a request is a span under the
// caller's, sent over the protocol TRACING_EXPORTER_PROTOCOL names to the
// endpoint of OTEL_EXPORTER_OTLP_ENDPOINT, as the resource the
// TRACING_SERVICE_* settings name; the spans still queued at shutdown are
// sent before Run returns (the batch processor would wait 5 s).
func TestTracingExports(t *testing.T) {
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			rcv := harness.StartOTLP(t)
			srv, _, stop := startStoppable(t, serverRules, tracingEnv(rcv, protocol))
			c := rlsv3.NewRateLimitServiceClient(dial(t, srv))
			ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+envoyTraceID+"-"+envoySpanID+"-01")
			if _, err := c.ShouldRateLimit(ctx, userRequest("web", "alice")); err != nil {
				t.Fatal(err)
			}
			stop()
			spans := rcv.Spans()
			if len(spans) != 1 {
				t.Fatalf("%d spans received by the end of Run, want 1: %v", len(spans), spans)
			}
			s := spans[0]
			if s.Protocol != protocol || s.TraceID != envoyTraceID || s.ParentSpanID != envoySpanID {
				t.Errorf("span over %s, trace %s, parent %s; want over %s under %s/%s", s.Protocol, s.TraceID, s.ParentSpanID, protocol, envoyTraceID, envoySpanID)
			}
			for k, want := range map[string]string{"service.name": "envoy-ratelimit", "service.namespace": "gateway", "service.instance.id": "pod-1"} {
				if s.Resource[k] != want {
					t.Errorf("resource %s = %v, want %s", k, s.Resource[k], want)
				}
			}
			if s.Attributes["domain"] != "web" || s.Attributes["ratelimit.overall_code"] != "OK" {
				t.Errorf("attributes %v, want domain web, overall code OK", s.Attributes)
			}
		})
	}
}

// TestTracingInstanceID: without TRACING_SERVICE_INSTANCE_ID each process
// names itself with a random UUID, as the anchor does.
func TestTracingInstanceID(t *testing.T) {
	rcv := harness.StartOTLP(t)
	env := tracingEnv(rcv, "http")
	env["TRACING_SERVICE_INSTANCE_ID"] = ""
	env["TRACING_SERVICE_NAMESPACE"] = ""
	srv, _, stop := startStoppable(t, serverRules, env)
	if _, err := rlsv3.NewRateLimitServiceClient(dial(t, srv)).ShouldRateLimit(t.Context(), userRequest("web", "bob")); err != nil {
		t.Fatal(err)
	}
	stop()
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	id, _ := spans[0].Resource["service.instance.id"].(string)
	if len(id) != 36 || strings.Count(id, "-") != 4 || id[14] != '4' {
		t.Errorf("service.instance.id = %q, want a random UUID", id)
	}
	if _, ok := spans[0].Resource["service.namespace"]; ok {
		t.Errorf("service.namespace set while TRACING_SERVICE_NAMESPACE is empty")
	}
}

// TestTracingSamplingRateZero: with TRACING_SAMPLING_RATE=0 no request
// that starts its trace here, or whose caller did not sample it, is
// exported.
func TestTracingSamplingRateZero(t *testing.T) {
	rcv := harness.StartOTLP(t)
	env := tracingEnv(rcv, "grpc")
	env["TRACING_SAMPLING_RATE"] = "0"
	srv, _, stop := startStoppable(t, serverRules, env)
	c := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	unsampled := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+envoyTraceID+"-"+envoySpanID+"-00")
	for i := range 20 {
		ctx := t.Context()
		if i%2 == 1 {
			ctx = unsampled
		}
		if _, err := c.ShouldRateLimit(ctx, userRequest("web", "carol")); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if spans := rcv.Spans(); len(spans) != 0 {
		t.Errorf("%d spans exported at rate 0, want none: %v", len(spans), spans)
	}
}

// TestTracingCollectorDown: a collector that is not there, or that
// accepts and never answers, fails no request, even past the span queue's
// bound (2048), costs the shutdown no more than the drain, and is logged.
func TestTracingCollectorDown(t *testing.T) {
	for _, tt := range []struct {
		name, protocol string
		addr           func(testing.TB) string
	}{
		{"closed_http", "http", harness.ClosedPort},
		{"stalled_http", "http", harness.SilentServer},
		{"stalled_grpc", "grpc", harness.SilentServer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{
				"TRACING_ENABLED":             "true",
				"TRACING_EXPORTER_PROTOCOL":   tt.protocol,
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + tt.addr(t),
				// Exports every 10 ms, so that several are stuck
				// or failing while the requests run.
				"OTEL_BSP_SCHEDULE_DELAY": "10",
			}
			var logs strings.Builder
			var mu sync.Mutex
			srv, _ := build(t, serverRules, env, writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return logs.Write(p)
			}))
			srv.drain = time.Second
			stop := run(t, srv)
			c := rlsv3.NewRateLimitServiceClient(dial(t, srv))
			ctx := metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+envoyTraceID+"-"+envoySpanID+"-01")
			const n = 3000
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for w := range 8 {
				wg.Go(func() {
					for i := w; i < n; i += 8 {
						// A generous bound, so that a request held by an
						// export fails instead of hanging the test.
						cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						_, err := c.ShouldRateLimit(cctx, userRequest("web", "u"+string(rune('a'+i%26))))
						cancel()
						if err != nil {
							errs <- err
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("a request failed with the collector down: %v", err)
			}
			began := time.Now()
			stop()
			if d := time.Since(began); d > srv.drain+2*time.Second {
				t.Errorf("shutdown took %v with a %v drain and the collector down", d, srv.drain)
			}
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(logs.String(), "spans not exported") {
				t.Errorf("no warning about the spans that could not be sent:\n%s", logs.String())
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
