package harness

import (
	"encoding/json"
	"strings"
	"sync"
)

// Serving is what the service's "serving" log line says it bound: each
// listener's address, Prometheus's empty when it has none. Tests start the
// service on port 0 and read where it listens from this line, so that no
// port is picked in advance, where another process could take it first.
type Serving struct {
	GRPC       string `json:"grpc"`
	HTTP       string `json:"http"`
	Debug      string `json:"debug"`
	Prometheus string `json:"prometheus"`
}

// ParseServing finds the "serving" line in the service's logs, text or
// JSON (slog's "msg" or the anchor's "@message"), and reports whether
// there was one.
func ParseServing(logs string) (Serving, bool) {
	for _, line := range strings.Split(logs, "\n") {
		var sl struct {
			Serving
			Msg     string `json:"msg"`
			Message string `json:"@message"`
		}
		if strings.HasPrefix(line, "{") {
			if json.Unmarshal([]byte(line), &sl) == nil && (sl.Msg == "serving" || sl.Message == "serving") {
				return sl.Serving, true
			}
			continue
		}
		if !strings.Contains(line, " msg=serving ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "grpc":
				sl.GRPC = v
			case "http":
				sl.HTTP = v
			case "debug":
				sl.Debug = v
			case "prometheus":
				sl.Prometheus = v
			}
		}
		return sl.Serving, true
	}
	return Serving{}, false
}

// Log collects a process's output while a test reads it.
type Log struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
