// An OpenTelemetry trace receiver for tests (StartOTLP): a real
// OTLP/gRPC server and a real OTLP/HTTP server on 127.0.0.1 that decode
// what exporters send and keep the spans for the test to read. It speaks
// the protocol with the OTLP project's own message and service types, so
// an exporter cannot tell it from a collector, without the collector's
// hundreds of packages.

package harness

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// Span is one received span, flattened for assertions. IDs are in
// lower-case hex, as W3C traceparent writes them; ParentSpanID is "" for a
// root span.
type Span struct {
	TraceID, SpanID, ParentSpanID string
	Name                          string
	Kind                          tracepb.Span_SpanKind
	// Attributes holds string, int64, bool or float64 values; other
	// kinds are written with fmt.
	Attributes map[string]any
	// Resource is the attributes of the exporting process's resource.
	Resource map[string]any
	// Events are the names of the span's events, in order.
	Events []string
	// StatusCode is the span's status: unset, ok or error.
	StatusCode tracepb.Status_StatusCode
	// Start and End are the span's times.
	Start, End time.Time
	// Protocol is "grpc" or "http": how the span arrived.
	Protocol string
}

// OTLPReceiver is a running receiver. It is safe for concurrent use.
type OTLPReceiver struct {
	// GRPCAddr is the OTLP/gRPC listener, host:port (for
	// OTEL_EXPORTER_OTLP_ENDPOINT, as http://GRPCAddr).
	GRPCAddr string
	// HTTPURL is the OTLP/HTTP base URL, http://host:port; exporters post
	// to HTTPURL/v1/traces.
	HTTPURL string

	// mu guards spans, exports, count, discard and changed.
	mu      sync.Mutex
	spans   []Span
	exports int
	// count is the spans received, kept or not.
	count int
	// discard, set by Discard, keeps no span.
	discard bool
	// changed is closed and replaced whenever spans arrive.
	changed chan struct{}
}

// StartOTLP starts a receiver on two free ports of 127.0.0.1 and stops it in
// tb's cleanup.
func StartOTLP(tb testing.TB) *OTLPReceiver {
	tb.Helper()
	r := &OTLPReceiver{changed: make(chan struct{})}

	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("harness: %v", err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, traceService{r: r})
	r.GRPCAddr = gl.Addr().String()
	go func() { _ = gs.Serve(gl) }()

	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		gs.Stop()
		tb.Fatalf("harness: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	r.HTTPURL = "http://" + hl.Addr().String()
	go func() { _ = hs.Serve(hl) }()

	tb.Cleanup(func() {
		gs.Stop()
		_ = hs.Close()
	})
	return r
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *OTLPReceiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(req, "grpc")
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveHTTP takes an export in the binary protobuf encoding, which Go's
// otlptracehttp sends, gzipped or not (OTEL_EXPORTER_OTLP_COMPRESSION).
func (r *OTLPReceiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "harness: content type "+ct+" not supported", http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg, "http")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *OTLPReceiver) add(req *coltracepb.ExportTraceServiceRequest, protocol string) {
	r.mu.Lock()
	discard := r.discard
	r.mu.Unlock()
	if discard {
		// Counted only: flattening would add the receiver's own work to
		// the benchmark's figures.
		n := 0
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
		r.mu.Lock()
		r.exports++
		r.count += n
		r.mu.Unlock()
		return
	}
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attributes(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{
					TraceID:      hex.EncodeToString(sp.GetTraceId()),
					SpanID:       hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
					Name:         sp.GetName(),
					Kind:         sp.GetKind(),
					Attributes:   attributes(sp.GetAttributes()),
					Resource:     res,
					StatusCode:   sp.GetStatus().GetCode(),
					Start:        time.Unix(0, int64(sp.GetStartTimeUnixNano())),
					End:          time.Unix(0, int64(sp.GetEndTimeUnixNano())),
					Protocol:     protocol,
				}
				for _, e := range sp.GetEvents() {
					s.Events = append(s.Events, e.GetName())
				}
				got = append(got, s)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports++
	r.count += len(got)
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
}

func attributes(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = x.IntValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = x.BoolValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = x.DoubleValue
		default:
			m[kv.GetKey()] = fmt.Sprint(v)
		}
	}
	return m
}

// Spans returns the spans received so far, in the order they arrived.
func (r *OTLPReceiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Discard makes the receiver count the spans it receives from now on
// without keeping them, for benchmarks: a million spans kept would make
// the garbage collector's work, and so the figures, grow with the run.
func (r *OTLPReceiver) Discard() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.discard = true
}

// Count returns the number of spans received so far, kept or not.
func (r *OTLPReceiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Exports returns the number of export calls received, over both
// protocols.
func (r *OTLPReceiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// WaitSpans waits until spans for which match is true have arrived, n of
// them at least, and returns all those matching. It fails tb after
// timeout.
func (r *OTLPReceiver) WaitSpans(tb testing.TB, n int, timeout time.Duration, match func(Span) bool) []Span {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var got []Span
		for _, s := range r.spans {
			if match == nil || match(s) {
				got = append(got, s)
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("harness: %d matching spans after %v, want %d; received: %v", len(got), timeout, n, r.Spans())
			return nil
		}
	}
}
