package service

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// DefaultMaxJSONBody bounds a body served by ServeJSON: 64 KiB, the default
// of GRPC_MAX_RECV_MSG_SIZE, so that /json accepts no larger request than
// gRPC does.
const DefaultMaxJSONBody = 64 << 10

// ServeJSON is the HTTP form of ShouldRateLimit (POST /json): the body is a
// RateLimitRequest in protobuf's JSON mapping, the answer a RateLimitResponse.
// As in envoyproxy/ratelimit the status is 200 for OK and 429 for
// OVER_LIMIT; a bad request is 400, a body larger than DefaultMaxJSONBody
// 413, an unavailable store or a request shed for load (Config.MaxConcurrent,
// counted as load_shed) 503, anything else 500.
func (s *Service) ServeJSON(w http.ResponseWriter, r *http.Request) {
	s.serveJSON(w, r, DefaultMaxJSONBody)
}

// JSONHandler returns ServeJSON with bodies bounded to maxBody bytes instead
// of DefaultMaxJSONBody. The server passes GRPC_MAX_RECV_MSG_SIZE, so that
// one setting bounds a request on both paths.
func (s *Service) JSONHandler(maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveJSON(w, r, maxBody) })
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request, maxBody int64) {
	req, done := s.readRequest(w, r, maxBody)
	if req == nil {
		return
	}
	defer done()
	ctx := r.Context()
	var span trace.Span
	if s.cfg.Tracer != nil {
		ctx, span = s.startSpan(ctx, propagation.HeaderCarrier(r.Header), jsonSpanName, jsonAttributes)
		defer span.End()
	}
	resp, err := s.shouldRateLimitJSON(ctx, req)
	if span != nil {
		endSpan(span, req, resp, err)
	}
	if err != nil {
		st, _ := status.FromError(err)
		code := http.StatusInternalServerError
		switch st.Code() {
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
			code = http.StatusServiceUnavailable
		}
		if span != nil {
			span.SetAttributes(attrHTTPStatus.Int(code))
		}
		http.Error(w, st.Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	code := http.StatusOK
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
	}
	if span != nil {
		span.SetAttributes(attrHTTPStatus.Int(code))
	}
	w.WriteHeader(code)
	_, _ = w.Write(out)
}

// readRequest reads a RateLimitRequest posted in protobuf's JSON mapping,
// of at most maxBody bytes, and takes its place among
// Config.MaxConcurrent; done gives the place back. When it cannot, it
// answers the request itself (see readBody; 503 at MaxConcurrent, 400
// for a body that is no request) and returns nil.
func (s *Service) readRequest(w http.ResponseWriter, r *http.Request, maxBody int64) (req *rlsv3.RateLimitRequest, done func()) {
	// The body is read before a slot of MaxConcurrent is taken: a client
	// that sends it slowly (for up to the HTTP server's read timeout) must
	// not hold a slot that gRPC requests need meanwhile.
	body, ok := readBody(w, r, maxBody)
	if !ok {
		return nil, nil
	}
	done = func() {}
	if s.cfg.MaxConcurrent > 0 {
		if !s.acquire() {
			http.Error(w, status.Convert(s.shed()).Message(), http.StatusServiceUnavailable)
			return nil, nil
		}
		done = s.release
	}
	req = &rlsv3.RateLimitRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		done()
		http.Error(w, "invalid request: "+err.Error(), http.StatusBadRequest)
		return nil, nil
	}
	return req, done
}

// readBody reads the body of a POST of at most maxBody bytes; when it
// cannot, it answers the request itself (405, 413 or 400) and returns
// false.
func readBody(w http.ResponseWriter, r *http.Request, maxBody int64) ([]byte, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return nil, false
	}
	// A declared length over the bound is refused before reading a byte;
	// MaxBytesReader stops a chunked body at the bound and makes the HTTP
	// server close the connection instead of reading the rest of it.
	if r.ContentLength > maxBody {
		http.Error(w, fmt.Sprintf("body too large: over %d bytes", maxBody), http.StatusRequestEntityTooLarge)
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, fmt.Sprintf("body too large: over %d bytes", maxBody), http.StatusRequestEntityTooLarge)
			return nil, false
		}
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return body, true
}
