package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartupLineAtDefaultLevel: at the default LOG_LEVEL (WARN) a healthy
// start prints exactly one line, and it says where the service listens and
// which store and rules it uses, so that an operator sees that it started.
func TestStartupLineAtDefaultLevel(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
		"LOG_LEVEL=WARN")
	var lines []string
	// The line is written before the listeners serve, so it is there once
	// /healthcheck answers; poll a little all the same for the pipe.
	eventually(t, "the startup line", 5*time.Second, func() bool {
		lines = strings.Split(strings.TrimSpace(p.logs()), "\n")
		return len(lines) > 0 && lines[0] != ""
	})
	if len(lines) != 1 {
		t.Fatalf("at LOG_LEVEL=WARN the start printed %d lines, want 1:\n%s", len(lines), p.logs())
	}
	line := lines[0]
	for _, want := range []string{
		"grpc=" + p.grpc,
		"http=" + p.http,
		"store=memory",
		"rules=" + filepath.Join(p.root, "config"),
		"domains=[web]",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("startup line lacks %q:\n%s", want, line)
		}
	}
}
