package server

import (
	"net/http"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/live/web"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// newCapture returns the recorder of /api/v1/capture. Descriptor values
// are written as LIVE_VIEW_VALUES says the debug listener shows them:
// hashed, a capture still tells keys apart (a replay counts them right,
// but rules that name values no longer match them); truncated, it does
// not.
func newCapture(set *settings.Settings) *capture.Recorder {
	values, _ := web.ParseValues(set.LiveViewValues) // validated by settings
	return capture.New(capture.Config{MaxBytes: set.CaptureMaxBytes, Values: values.Shower(), ValuesMode: values.String()})
}

// mountCapture serves /api/v1/capture on the debug mux, or says it is off,
// and returns its line of the debug listener's index. The path is served
// apart from the live view's /api/, with or without it.
func (s *Server) mountCapture(dmux *http.ServeMux) string {
	if s.capture == nil {
		dmux.HandleFunc("/api/v1/capture", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "capture is off (CAPTURE_ENABLED=false)", http.StatusNotFound)
		})
		return ""
	}
	dmux.Handle("/api/v1/capture", s.capture.Handler())
	return "/api/v1/capture?seconds=S&requests=N: the requests decided, as NDJSON (client values; see docs/CHANGING_LIMITS.md)\n"
}
