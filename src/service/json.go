package service

import (
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// ServeJSON is the HTTP form of ShouldRateLimit (POST /json): the body is a
// RateLimitRequest in protobuf's JSON mapping, the answer a RateLimitResponse.
// As in envoyproxy/ratelimit the status is 200 for OK and 429 for
// OVER_LIMIT; a bad request is 400, an unavailable store or a request shed
// for load (Config.MaxConcurrent, counted as load_shed) 503, anything else 500.
func (s *Service) ServeJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return
	}
	if s.cfg.MaxConcurrent > 0 {
		if !s.acquire() {
			http.Error(w, status.Convert(s.shed()).Message(), http.StatusServiceUnavailable)
			return
		}
		defer s.release()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
	if err != nil {
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxJSONBody {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid request: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		st, _ := status.FromError(err)
		code := http.StatusInternalServerError
		switch st.Code() {
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
			code = http.StatusServiceUnavailable
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
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}
