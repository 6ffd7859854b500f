package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/capture"
)

// TestCaptureOnDebugListener: /api/v1/capture is served on the debug
// listener only, with or without the live view, records the requests the
// running service decides, and a graceful shutdown ends it with its last
// line instead of waiting the drain time for it.
func TestCaptureOnDebugListener(t *testing.T) {
	for _, liveView := range []string{"true", "false"} {
		t.Run("live_view="+liveView, func(t *testing.T) {
			srv, _, stop := startStoppable(t, serverRules, map[string]string{"USE_STATSD": "false", "LIVE_VIEW_ENABLED": liveView})
			if code, _ := get(t, "http://"+srv.Addrs().HTTP.String()+"/api/v1/capture?seconds=1"); code != http.StatusNotFound {
				t.Fatalf("/api/v1/capture on the service port: %d, want 404", code)
			}
			if _, body := get(t, "http://"+srv.Addrs().Debug.String()+"/"); !strings.Contains(body, "/api/v1/capture") {
				t.Errorf("the debug index does not name /api/v1/capture: %q", body)
			}
			br := openDebug(t, srv, "/api/v1/capture?seconds=3600", `{"capture":1,`)
			c := rlsv3.NewRateLimitServiceClient(dial(t, srv))
			for range 3 {
				if _, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
				}}}); err != nil {
					t.Fatal(err)
				}
			}
			stopSoon(t, stop, "a capture running")
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatal(err)
			}
			rd, err := capture.NewReader(strings.NewReader(`{"capture":1}` + "\n" + string(rest)))
			if err != nil {
				t.Fatal(err)
			}
			var r capture.Request
			n := 0
			for ; rd.Next(&r) == nil; n++ {
				if r.Domain != "web" || r.Descriptors[0].Entries[0].Value != "alice" {
					t.Errorf("recorded %+v", r)
				}
			}
			if s := rd.Summary(); n != 3 || s == nil || s.Requests != 3 || s.Reason != "shutdown" {
				t.Errorf("%d requests, summary %+v; want 3, ended by the shutdown", n, s)
			}
		})
	}
}

func TestCaptureOff(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"USE_STATSD": "false", "CAPTURE_ENABLED": "false"})
	if code, body := get(t, "http://"+srv.Addrs().Debug.String()+"/api/v1/capture"); code != http.StatusNotFound || !strings.Contains(body, "CAPTURE_ENABLED=false") {
		t.Errorf("/api/v1/capture with CAPTURE_ENABLED=false: %d %q", code, body)
	}
	if srv.capture != nil {
		t.Error("a recorder with CAPTURE_ENABLED=false")
	}
}

// TestCaptureHidesValuesAsTheLiveView: with LIVE_VIEW_VALUES=hashed a
// capture holds keyed hashes of the values, one per value, never the
// values.
func TestCaptureHidesValuesAsTheLiveView(t *testing.T) {
	srv, _, stop := startStoppable(t, serverRules, map[string]string{"USE_STATSD": "false", "LIVE_VIEW_VALUES": "hashed"})
	br := openDebug(t, srv, "/api/v1/capture?seconds=3600&requests=3", `{"capture":1,`)
	c := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	for _, user := range []string{"alice", "bob", "alice"} {
		if _, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if strings.Contains(string(rest), "alice") || strings.Contains(string(rest), "bob") {
		t.Fatalf("a capture with hashed values holds a value:\n%s", rest)
	}
	rd, err := capture.NewReader(strings.NewReader(`{"capture":1}` + "\n" + string(rest)))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	var r capture.Request
	for rd.Next(&r) == nil {
		seen = append(seen, r.Descriptors[0].Entries[0].Value)
	}
	if len(seen) != 3 || !strings.HasPrefix(seen[0], "#") || seen[0] != seen[2] || seen[0] == seen[1] {
		t.Errorf("values captured %q, want alice's hash twice and bob's once", seen)
	}
}
