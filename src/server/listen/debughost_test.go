package listen

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestAllowHosts(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	tests := []struct {
		name  string
		names []string
		host  string
		want  int
	}{
		{"no_host", nil, "", 200},
		{"localhost", nil, "localhost:6070", 200},
		{"localhost_any_case_and_dot", nil, "LocalHost.:6070", 200},
		{"loopback", nil, "127.0.0.1:6070", 200},
		{"ipv6_loopback", nil, "[::1]:6070", 200},
		{"pod_address", nil, "10.244.1.7:6070", 200},
		{"ipv6_without_port", nil, "[fd00::7]", 200},
		{"rebound_name", nil, "attacker.example:6070", 403},
		{"rebound_name_without_port", nil, "attacker.example", 403},
		{"address_like_name", nil, "127.0.0.1.attacker.example", 403},
		{"subdomain_of_localhost", nil, "x.localhost", 403},
		{"listed_name", []string{"ratelimit.ops.internal"}, "RateLimit.ops.internal:6070", 200},
		{"unlisted_name", []string{"ratelimit.ops.internal"}, "other.internal:6070", 403},
		{"any", []string{"ratelimit.ops.internal", "*"}, "attacker.example", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/stats", nil)
			r.Host = tt.host
			w := httptest.NewRecorder()
			AllowHosts(tt.names, ok).ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Errorf("Host %q with DEBUG_ALLOWED_HOSTS %q: %d, want %d", tt.host, tt.names, w.Code, tt.want)
			}
		})
	}
}
