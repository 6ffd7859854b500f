package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// getHost is GET url with the Host header host, as a browser sends it for
// a page whose name resolves to the listener's address.
func getHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(callCtx(t), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDebugListenerAnswersItsOwnHostsOnly: a request to the debug listener
// whose Host names another site (a page that rebound its name to
// 127.0.0.1) is refused, on every endpoint; localhost, an address and a
// name of DEBUG_ALLOWED_HOSTS are answered (issue 24, case 9). Before, the
// rules, the top keys and pprof's command line answered any Host. A
// capture, which holds client values, is under the same rules (issue 29).
func TestDebugListenerAnswersItsOwnHostsOnly(t *testing.T) {
	slow(t)
	p := start(t, map[string]string{"web.yaml": webRules}, "DEBUG_ALLOWED_HOSTS=ratelimit.ops.internal")
	port := p.debug[strings.LastIndex(p.debug, ":"):]
	for _, path := range []string{"/", "/rlconfig", "/stats", "/metrics", "/debug/pprof/cmdline", "/ui/", "/api/v1/rules", "/api/v1/topkeys",
		"/api/v1/capture?seconds=1"} {
		url := "http://" + p.debug + path
		for _, host := range []string{"attacker.example" + port, "attacker.example", "127.0.0.1.attacker.example" + port} {
			if code, body := getHost(t, url, host); code != http.StatusForbidden || strings.Contains(body, "web.user") {
				t.Errorf("GET %s with Host %s: %d %.80q, want 403", path, host, code, body)
			}
		}
		for _, host := range []string{"localhost" + port, "127.0.0.1" + port, "[::1]" + port, "ratelimit.ops.internal" + port} {
			if code, _ := getHost(t, url, host); code != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d, want 200", path, host, code)
			}
		}
	}
}

// TestPprofCanBeTurnedOff: profiles are served by default, as by the
// anchor, and PPROF_ENABLED=false leaves them out while the rest of the
// debug listener answers.
func TestPprofCanBeTurnedOff(t *testing.T) {
	on := start(t, map[string]string{"web.yaml": webRules})
	if code, body := on.get(t, "http://"+on.debug+"/debug/pprof/cmdline"); code != http.StatusOK || body == "" {
		t.Errorf("pprof by default: %d %q, want 200 and the command line", code, body)
	}
	off := start(t, map[string]string{"web.yaml": webRules}, "PPROF_ENABLED=false")
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
		if code, _ := off.get(t, "http://"+off.debug+path); code != http.StatusNotFound {
			t.Errorf("GET %s with PPROF_ENABLED=false: %d, want 404", path, code)
		}
	}
	if code, body := off.get(t, "http://"+off.debug+"/"); code != http.StatusOK || strings.Contains(body, "pprof") {
		t.Errorf("the debug index with PPROF_ENABLED=false: %d %q, want 200 without profiles", code, body)
	}
	if code, _ := off.get(t, "http://"+off.debug+"/rlconfig"); code != http.StatusOK {
		t.Errorf("/rlconfig with PPROF_ENABLED=false: %d, want 200", code)
	}
}

// TestLiveViewValuesHashedOrTruncated: with LIVE_VIEW_VALUES=hashed or
// truncated, a request value over its limit shows in the live view's top
// keys, over the API and its stream, but never whole.
func TestLiveViewValuesHashedOrTruncated(t *testing.T) {
	const secret = "sk_live_0123456789abcdef"
	for _, mode := range []string{"hashed", "truncated"} {
		t.Run(mode, func(t *testing.T) {
			p := start(t, map[string]string{"web.yaml": webRules}, "LIVE_VIEW_VALUES="+mode)
			c := p.client(t)
			over := false
			for i := 0; i < 20 && !over; i++ {
				resp, err := c.ShouldRateLimit(callCtx(t), request("web", "user", secret))
				if err != nil {
					t.Fatal(err)
				}
				over = resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if !over {
				t.Fatal("the key never went over its limit")
			}
			code, body := p.get(t, "http://"+p.debug+"/api/v1/topkeys")
			if code != http.StatusOK || !strings.Contains(body, `"key":"user"`) || !strings.Contains(body, `"values":"`+mode+`"`) {
				t.Fatalf("/api/v1/topkeys: %d %s; want the key listed, values %s", code, body, mode)
			}
			if strings.Contains(body, secret) || mode == "truncated" && !strings.Contains(body, `"value":"sk_l…"`) {
				t.Errorf("/api/v1/topkeys with LIVE_VIEW_VALUES=%s shows %s", mode, body)
			}
		})
	}
}
