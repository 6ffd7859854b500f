package server

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/src/settings"
)

// held binds a loopback port for the test and returns it.
func held(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// TestPortsInUseNamed: a port in use stops the start with an error that
// names the setting of each listener that could not open, every one of
// them at once, and the fix; the listeners that did open are closed.
func TestPortsInUseNamed(t *testing.T) {
	tests := []struct {
		name  string
		taken []string // settings given a port in use
	}{
		{"grpc_and_http", []string{"GRPC_PORT", "PORT"}},
		{"debug", []string{"DEBUG_PORT"}},
		{"prometheus_and_grpc", []string{"PROMETHEUS_ADDR", "GRPC_PORT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "DEBUG_HOST": "127.0.0.1"}
			for _, k := range tt.taken {
				env[k] = fmt.Sprint(held(t))
				if k == "PROMETHEUS_ADDR" {
					env[k] = "127.0.0.1:" + env[k]
				}
			}
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
				t.Fatal(err)
			}
			setTestEnv(t, root, env)
			for _, k := range tt.taken {
				t.Setenv(k, env[k]) // after setTestEnv's port 0
			}
			set, err := settings.Load()
			if err != nil {
				t.Fatal(err)
			}
			_, err = New(t.Context(), set, slog.New(slog.DiscardHandler))
			if err == nil {
				t.Fatal("New with ports in use succeeded")
			}
			for _, k := range tt.taken {
				for _, want := range []string{k + "=", "set " + k + " to a free port"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q lacks %q", err, want)
					}
				}
			}
			if n := strings.Count(err.Error(), "address in use"); n != len(tt.taken) {
				t.Errorf("error names %d listeners in use, want %d: %v", n, len(tt.taken), err)
			}
		})
	}
}
