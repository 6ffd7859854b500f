package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimitd/ratelimit/harness"
)

// tracedRules has a limit of one an hour, in the main Redis, and one per
// second, in the per-second Redis: a request for both takes a round trip
// to each.
const tracedRules = `domain: traced
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 100}
`

// What Envoy would send: a trace and span of its own per request, in W3C
// trace context or B3.
const (
	w3cTrace   = "4bf92f3577b34da6a3ce929d0e0e4736"
	w3cSpan    = "00f067aa0ba902b7"
	b3Trace    = "80f198ee56343ba864fe8b2a57d3eff7"
	b3Span     = "e457b5a2e4d86bd1"
	b3Trace2   = "463ac35c9f6413ad48485a3953bb6124"
	b3Span2    = "0020000000000001"
	jsonTrace  = "0af7651916cd43dd8448eb211c80319c"
	jsonSpan   = "b7ad6b7169203331"
	grpcMethod = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// tracingEnv sends the process's spans to rcv over protocol, as the
// process envoy-ratelimit of the namespace gateway, instance pod-1.
func tracingEnv(rcv *harness.OTLPReceiver, protocol string, extra ...string) []string {
	endpoint := rcv.HTTPURL
	if protocol == "grpc" {
		endpoint = "http://" + rcv.GRPCAddr
	}
	return append([]string{
		"TRACING_ENABLED=true",
		"TRACING_EXPORTER_PROTOCOL=" + protocol,
		"TRACING_SERVICE_NAME=envoy-ratelimit",
		"TRACING_SERVICE_NAMESPACE=gateway",
		"TRACING_SERVICE_INSTANCE_ID=pod-1",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
		// The race detector sleeps a second before exiting, which is not
		// the service's time.
		"GORACE=atexit_sleep_ms=0",
	}, extra...)
}

// withMetadata is ctx with the gRPC metadata kv, as Envoy sends it.
func withMetadata(t *testing.T, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(callCtx(t), kv...)
}

// stopAndWait sends SIGTERM and waits for a clean exit within the drain.
func (p *proc) stopAndWait(t *testing.T) time.Duration {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	began := time.Now()
	if code := p.wait(t, drain+2*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	return time.Since(began)
}

// TestTracingOverTheWire: the built binary, with TRACING_ENABLED, makes
// each decision a span under the one Envoy sent, in W3C trace context or
// B3 (single header or several), with a child per Redis round trip, and
// sends them over the protocol TRACING_EXPORTER_PROTOCOL names to a real
// OTLP receiver at OTEL_EXPORTER_OTLP_ENDPOINT. The spans are sent at
// SIGTERM at the latest: the batch processor would wait 5 s, and every
// span must be there when the process has exited.
func TestTracingOverTheWire(t *testing.T) {
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			rcv := harness.StartOTLP(t)
			main := harness.StartRedis(t, harness.RedisOptions{})
			perSecond := harness.StartRedis(t, harness.RedisOptions{})
			env := tracingEnv(rcv, protocol, redisEnv(main,
				"REDIS_PERSECOND=true", "REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_PERSECOND_URL="+perSecond.Addr)...)
			p := start(t, map[string]string{"traced.yaml": tracedRules}, env...)
			c := p.client(t)

			calls := []struct {
				name          string
				md            []string
				req           *rlsv3.RateLimitRequest
				want          rlsv3.RateLimitResponse_Code
				trace, parent string
				// redis are the names of the round trips' spans.
				redis []string
			}{
				{
					name: "w3c", md: []string{"traceparent", "00-" + w3cTrace + "-" + w3cSpan + "-01"},
					req:  twoDescriptors("traced", "user", "alice", "burst", "alice"),
					want: rlsv3.RateLimitResponse_OK, trace: w3cTrace, parent: w3cSpan,
					redis: []string{"redis persecond pipeline", "redis pipeline"},
				},
				{
					// alice's one request an hour is spent.
					name: "b3_single", md: []string{"b3", b3Trace + "-" + b3Span + "-1"},
					req:  request("traced", "user", "alice"),
					want: rlsv3.RateLimitResponse_OVER_LIMIT, trace: b3Trace, parent: b3Span,
					redis: []string{"redis pipeline"},
				},
				{
					name: "b3_multi", md: []string{"x-b3-traceid", b3Trace2, "x-b3-spanid", b3Span2, "x-b3-sampled", "1"},
					req:  request("traced", "user", "bob"),
					want: rlsv3.RateLimitResponse_OK, trace: b3Trace2, parent: b3Span2,
					redis: []string{"redis pipeline"},
				},
			}
			for _, call := range calls {
				resp, err := c.ShouldRateLimit(withMetadata(t, call.md...), call.req)
				if err != nil {
					t.Fatalf("%s: %v", call.name, err)
				}
				if resp.GetOverallCode() != call.want {
					t.Fatalf("%s: %v, want %v", call.name, resp.GetOverallCode(), call.want)
				}
			}
			// /json reads the same headers from HTTP.
			body := `{"domain":"traced","descriptors":[{"entries":[{"key":"user","value":"carol"}]}]}`
			hreq, err := http.NewRequestWithContext(callCtx(t), http.MethodPost, "http://"+p.http+"/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			hreq.Header.Set("Content-Type", "application/json")
			hreq.Header.Set("traceparent", "00-"+jsonTrace+"-"+jsonSpan+"-01")
			hresp, err := http.DefaultClient.Do(hreq)
			if err != nil {
				t.Fatal(err)
			}
			hresp.Body.Close()
			if hresp.StatusCode != http.StatusOK {
				t.Fatalf("/json answered %d", hresp.StatusCode)
			}

			took := p.stopAndWait(t)
			spans := rcv.Spans()
			t.Logf("%d spans received over %s by the exit, %v after SIGTERM", len(spans), protocol, took)

			for _, call := range calls {
				srv := findSpans(spans, func(s harness.Span) bool { return s.Name == grpcMethod && s.TraceID == call.trace })
				if len(srv) != 1 {
					t.Errorf("%s: %d spans of the decision in trace %s, want 1", call.name, len(srv), call.trace)
					continue
				}
				s := srv[0]
				checkServiceSpan(t, call.name, s, protocol, call.parent)
				wantAttrs := map[string]any{
					"domain":                           "traced",
					"ratelimit.descriptors":            int64(len(call.req.GetDescriptors())),
					"ratelimit.overall_code":           call.want.String(),
					"ratelimit.descriptors_over_limit": int64(0),
					"rpc.grpc.status_code":             int64(0),
					"rpc.system":                       "grpc",
				}
				if call.want == rlsv3.RateLimitResponse_OVER_LIMIT {
					wantAttrs["ratelimit.descriptors_over_limit"] = int64(1)
				}
				for k, want := range wantAttrs {
					if got := s.Attributes[k]; got != want {
						t.Errorf("%s: attribute %s = %v (%T), want %v", call.name, k, got, got, want)
					}
				}
				// A child span per round trip, under the decision's span.
				children := findSpans(spans, func(c harness.Span) bool { return c.ParentSpanID == s.SpanID })
				var names []string
				for _, ch := range children {
					names = append(names, ch.Name)
					if ch.TraceID != s.TraceID || ch.Kind != tracepb.Span_SPAN_KIND_CLIENT || ch.Attributes["db.system.name"] != "redis" {
						t.Errorf("%s: child %s: trace %s, kind %v, attributes %v; want a redis client span in trace %s",
							call.name, ch.Name, ch.TraceID, ch.Kind, ch.Attributes, s.TraceID)
					}
					if ch.Start.Before(s.Start) || ch.End.After(s.End) {
						t.Errorf("%s: child %s from %v to %v, outside its parent's %v to %v", call.name, ch.Name, ch.Start, ch.End, s.Start, s.End)
					}
					if !slices.Contains(ch.Events, "sent") {
						t.Errorf("%s: child %s has no sent event: %v", call.name, ch.Name, ch.Events)
					}
				}
				slices.Sort(names)
				if !slices.Equal(names, call.redis) {
					t.Errorf("%s: round trip spans %v, want %v", call.name, names, call.redis)
				}
			}

			js := findSpans(spans, func(s harness.Span) bool { return s.TraceID == jsonTrace && s.ParentSpanID == jsonSpan })
			if len(js) != 1 || js[0].Name != "POST /json" || js[0].Attributes["http.response.status_code"] != int64(200) {
				t.Errorf("/json spans under %s/%s: %v, want one POST /json answered 200", jsonTrace, jsonSpan, js)
			} else {
				checkServiceSpan(t, "/json", js[0], protocol, jsonSpan)
			}

			// 4 decisions, 5 round trips, and nothing else: no span of
			// the start's or the shutdown's own.
			if len(spans) != 9 {
				t.Errorf("%d spans, want 9: %v", len(spans), spans)
			}
			// Descriptor values are never recorded, in any span.
			for _, s := range spans {
				for k, v := range s.Attributes {
					if str, ok := v.(string); ok && (strings.Contains(str, "alice") || strings.Contains(str, "bob") || strings.Contains(str, "carol")) {
						t.Errorf("span %s records a descriptor value: %s=%q", s.Name, k, str)
					}
				}
			}
		})
	}
}

// twoDescriptors is a request of two one-entry descriptors.
func twoDescriptors(domain, k1, v1, k2, v2 string) *rlsv3.RateLimitRequest {
	r := request(domain, k1, v1)
	r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k2, Value: v2}},
	})
	return r
}

func findSpans(spans []harness.Span, match func(harness.Span) bool) []harness.Span {
	var out []harness.Span
	for _, s := range spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// checkServiceSpan checks what every span of a decision carries: the
// resource of tracingEnv, the parent Envoy named, the protocol it came by.
func checkServiceSpan(t *testing.T, name string, s harness.Span, protocol, parent string) {
	t.Helper()
	if s.ParentSpanID != parent || s.Kind != tracepb.Span_SPAN_KIND_SERVER || s.Protocol != protocol {
		t.Errorf("%s: parent %s, kind %v, over %s; want a server span under %s, over %s", name, s.ParentSpanID, s.Kind, s.Protocol, parent, protocol)
	}
	for k, want := range map[string]string{"service.name": "envoy-ratelimit", "service.namespace": "gateway", "service.instance.id": "pod-1"} {
		if got := s.Resource[k]; got != want {
			t.Errorf("%s: resource %s = %v, want %s", name, k, got, want)
		}
	}
}

// TestTracingSamplingRateZero: TRACING_SAMPLING_RATE=0 records no trace
// that starts in the service, nor one whose caller did not sample it;
// a request whose caller sampled its trace is recorded all the same, as
// in the anchor, so that Envoy's traces are whole.
func TestTracingSamplingRateZero(t *testing.T) {
	rcv := harness.StartOTLP(t)
	p := start(t, map[string]string{"traced.yaml": tracedRules}, tracingEnv(rcv, "grpc", "TRACING_SAMPLING_RATE=0")...)
	c := p.client(t)
	for i := range 20 {
		ctx := callCtx(t)
		if i%2 == 1 {
			ctx = withMetadata(t, "traceparent", fmt.Sprintf("00-%s-%016x-00", w3cTrace, i+1))
		}
		if _, err := c.ShouldRateLimit(ctx, request("traced", "burst", "x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.ShouldRateLimit(withMetadata(t, "traceparent", "00-"+w3cTrace+"-"+w3cSpan+"-01"), request("traced", "burst", "x")); err != nil {
		t.Fatal(err)
	}
	p.stopAndWait(t)
	spans := rcv.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans at rate 0, want only the one whose caller sampled it: %v", len(spans), spans)
	}
	checkServiceSpan(t, "sampled parent", spans[0], "grpc", w3cSpan)
	if spans[0].TraceID != w3cTrace {
		t.Errorf("trace %s, want %s", spans[0].TraceID, w3cTrace)
	}
}

// traceFlushMax bounds the last export at shutdown (src/server).
const traceFlushMax = 2 * time.Second

// TestTracingCollectorDown: a collector that is not there (connections
// refused) or that accepts and never answers fails no request of the
// built binary, every one of them traced, past the span queue's 2048;
// the failed exports are logged, and SIGTERM ends the process after at
// most traceFlushMax spent on the spans, not the whole drain.
func TestTracingCollectorDown(t *testing.T) {
	slow(t)
	for _, tt := range []struct {
		name, protocol string
		addr           func(testing.TB) string
	}{
		{"refused_http", "http", harness.ClosedPort},
		{"refused_grpc", "grpc", harness.ClosedPort},
		{"stalled_http", "http", harness.SilentServer},
		{"stalled_grpc", "grpc", harness.SilentServer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := start(t, map[string]string{"traced.yaml": tracedRules},
				"TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL="+tt.protocol,
				"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+tt.addr(t),
				// An export every 50 ms, so that several fail or hang
				// while the requests run.
				"OTEL_BSP_SCHEDULE_DELAY=50", "GORACE=atexit_sleep_ms=0")
			c := p.client(t)
			const n, workers = 1500, 8
			var wg sync.WaitGroup
			var mu sync.Mutex
			var failed []error
			var slowest time.Duration
			began := time.Now()
			for w := range workers {
				wg.Go(func() {
					for i := w; i < n; i += workers {
						// REQUEST_TIMEOUT=2s: a request held by an export
						// past that would fail.
						ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
						ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", fmt.Sprintf("00-%s-%016x-01", w3cTrace, i+1))
						t0 := time.Now()
						_, err := c.ShouldRateLimit(ctx, request("traced", "burst", fmt.Sprint("u", i%50)))
						d := time.Since(t0)
						cancel()
						mu.Lock()
						slowest = max(slowest, d)
						if err != nil {
							failed = append(failed, err)
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(began)
			if len(failed) > 0 {
				t.Fatalf("%d of %d requests failed with the collector down, the first: %v", len(failed), n, failed[0])
			}
			took := p.stopAndWait(t)
			t.Logf("%d traced requests in %v (slowest %v); exited %v after SIGTERM", n, elapsed, slowest, took)
			// The last export has traceFlushMax; the margin is for the
			// -race binary on a loaded machine, and still well short of
			// the drain the export would otherwise take.
			if took > traceFlushMax+3*time.Second {
				t.Errorf("exited %v after SIGTERM with the collector down, want about %v at most", took, traceFlushMax)
			}
			if !strings.Contains(p.logs(), "spans not exported") {
				t.Errorf("no warning about the spans that could not be exported:\n%s", p.logs())
			}
		})
	}
}

// TestTracingMemcachedOverTheWire: with Memcached, each round trip of a
// traced decision is a client span under it, named after its command.
func TestTracingMemcachedOverTheWire(t *testing.T) {
	rcv := harness.StartOTLP(t)
	m := harness.StartMemcached(t)
	p := start(t, map[string]string{"traced.yaml": tracedRules}, tracingEnv(rcv, "http", memcacheEnv(m)...)...)
	c := p.client(t)
	// The first hits of two windows: an add each.
	resp, err := c.ShouldRateLimit(withMetadata(t, "traceparent", "00-"+w3cTrace+"-"+w3cSpan+"-01"),
		twoDescriptors("traced", "user", "alice", "burst", "alice"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v, %v; want OK", resp.GetOverallCode(), err)
	}
	p.stopAndWait(t)
	spans := rcv.Spans()
	srv := findSpans(spans, func(s harness.Span) bool { return s.Name == grpcMethod })
	if len(srv) != 1 {
		t.Fatalf("%d spans of decisions, want 1: %v", len(srv), spans)
	}
	checkServiceSpan(t, "memcached", srv[0], "http", w3cSpan)
	children := findSpans(spans, func(s harness.Span) bool { return s.ParentSpanID == srv[0].SpanID })
	var names []string
	for _, ch := range children {
		names = append(names, ch.Name)
		if ch.TraceID != w3cTrace || ch.Kind != tracepb.Span_SPAN_KIND_CLIENT || ch.Attributes["db.system.name"] != "memcached" {
			t.Errorf("child %s: trace %s, kind %v, attributes %v; want a memcached client span in trace %s", ch.Name, ch.TraceID, ch.Kind, ch.Attributes, w3cTrace)
		}
	}
	if want := []string{"memcached add", "memcached add"}; !slices.Equal(names, want) {
		t.Errorf("round trip spans %v, want %v", names, want)
	}
	if len(spans) != 3 {
		t.Errorf("%d spans, want the decision's and its 2 round trips: %v", len(spans), spans)
	}
}
