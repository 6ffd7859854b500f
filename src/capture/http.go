package capture

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Defaults of a capture asked over HTTP.
const (
	defaultSeconds  = 10
	defaultRequests = 100_000
	// writeTimeout bounds each write of a capture to its client, which
	// the listener's own write timeout (60 s on the debug port) would
	// otherwise cut in the middle of a long capture.
	writeTimeout = 10 * time.Second
)

// Handler serves GET /api/v1/capture: it runs one capture (Recorder.Run)
// and streams it as NDJSON. Parameters: seconds (1..3600, default 10),
// requests (1..10,000,000, default 100,000), domain (only that domain's
// requests). A bad parameter gets 400, a capture while another runs 409,
// after Close 503.
func (r *Recorder) Handler() http.Handler { return http.HandlerFunc(r.serve) }

func (r *Recorder) serve(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, "use GET")
		return
	}
	opts, err := parseOptions(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if r.busy.Load() {
		writeError(w, http.StatusConflict, ErrBusy.Error())
		return
	}
	select {
	case <-r.closed:
		writeError(w, http.StatusServiceUnavailable, errClosed.Error())
		return
	default:
	}
	rc := http.NewResponseController(w)
	// The listener's read deadline would end the capture (net/http reads
	// the connection for its end), and its write deadline cut it: each
	// write gets a deadline of its own instead.
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	out := deadlineWriter{w: w, rc: rc}
	_, err = r.Run(req.Context(), opts, out, rc.Flush)
	if errors.Is(err, ErrBusy) || errors.Is(err, errClosed) {
		// Nothing was written yet: another capture won the race, or a
		// shutdown began.
		code := http.StatusConflict
		if errors.Is(err, errClosed) {
			code = http.StatusServiceUnavailable
		}
		writeError(w, code, err.Error())
	}
}

// deadlineWriter gives each write to a capture's client writeTimeout.
type deadlineWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (d deadlineWriter) Write(b []byte) (int, error) {
	if err := d.rc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return 0, err
	}
	return d.w.Write(b)
}

func parseOptions(req *http.Request) (Options, error) {
	opts := Options{Seconds: defaultSeconds, Requests: defaultRequests}
	q := req.URL.Query()
	for name, vs := range q {
		if len(vs) != 1 {
			return opts, fmt.Errorf("%s given %d times", name, len(vs))
		}
		v := vs[0]
		switch name {
		case "seconds":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxSeconds {
				return opts, fmt.Errorf("seconds=%.20q: want 1 to %d", v, MaxSeconds)
			}
			opts.Seconds = n
		case "requests":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxRequests {
				return opts, fmt.Errorf("requests=%.20q: want 1 to %d", v, MaxRequests)
			}
			opts.Requests = n
		case "domain":
			if v == "" || len(v) > 256 {
				return opts, fmt.Errorf("domain: want 1 to 256 bytes, got %d", len(v))
			}
			opts.Domain = v
		default:
			return opts, fmt.Errorf("unknown parameter %.40q (want seconds, requests, domain)", name)
		}
	}
	return opts, nil
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
