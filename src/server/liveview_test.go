package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestLiveViewOnDebugListener: the live view is on by default, on the
// debug listener only, reports the rules' source and the store, and
// counts the decisions of the running service.
func TestLiveViewOnDebugListener(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"USE_STATSD": "false", "LOCAL_CACHE_SIZE_IN_BYTES": "65536"})
	debug := "http://" + srv.Addrs().Debug.String()
	if code, body := get(t, debug+"/ui/"); code != http.StatusOK || !strings.Contains(body, "app.js") {
		t.Fatalf("/ui/: %d %.80q", code, body)
	}
	if code, _ := get(t, "http://"+srv.Addrs().HTTP.String()+"/ui/"); code != http.StatusNotFound {
		t.Fatalf("/ui/ on the service port: %d, want 404", code)
	}
	if _, body := get(t, debug+"/"); !strings.Contains(body, "/ui/") {
		t.Errorf("the debug index does not name /ui/: %q", body)
	}
	var rules struct {
		Source  struct{ Kind, Location string }
		Domains []struct {
			Domain string
			Rules  []struct{ ID string }
		}
	}
	_, body := get(t, debug+"/api/v1/rules")
	if err := json.Unmarshal([]byte(body), &rules); err != nil || rules.Source.Kind != "files" ||
		len(rules.Domains) != 1 || rules.Domains[0].Rules[0].ID != "web.user" {
		t.Fatalf("/api/v1/rules: %v %s", err, body)
	}

	c := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	for range 3 {
		if _, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	var traffic struct {
		Rules map[string]struct{ Decisions []int }
		Store struct {
			Backend   string
			Healthy   bool
			NearCache *struct{ Entries int } `json:"near_cache"`
		}
	}
	eventually(t, "the decisions in /api/v1/traffic", func() bool {
		_, body := get(t, debug+"/api/v1/traffic?seconds=10")
		if err := json.Unmarshal([]byte(body), &traffic); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, v := range traffic.Rules["web.user"].Decisions {
			n += v
		}
		return n == 3
	})
	if traffic.Store.Backend != "memory" || !traffic.Store.Healthy || traffic.Store.NearCache == nil {
		t.Fatalf("store: %+v", traffic.Store)
	}
}

func TestLiveViewOff(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"USE_STATSD": "false", "LIVE_VIEW_ENABLED": "false"})
	debug := "http://" + srv.Addrs().Debug.String()
	for _, path := range []string{"/ui/", "/api/v1/rules"} {
		if code, body := get(t, debug+path); code != http.StatusNotFound {
			t.Errorf("%s with LIVE_VIEW_ENABLED=false: %d %q", path, code, body)
		}
	}
	if srv.live != nil || srv.svc == nil {
		t.Error("a recorder with LIVE_VIEW_ENABLED=false")
	}
}

// TestShutdownEndsLiveStreams: a stream never ends by itself; a graceful
// shutdown ends it instead of waiting the whole drain time for it.
func TestShutdownEndsLiveStreams(t *testing.T) {
	srv, _, stop := startStoppable(t, serverRules, map[string]string{"USE_STATSD": "false"})
	r := openDebug(t, srv, "/api/v1/stream", "retry:")
	stopSoon(t, stop, "a stream open")
	for {
		if _, err := r.ReadString('\n'); err != nil {
			break // the stream ended
		}
	}
}

// openDebug GETs path on srv's debug listener, for at most 20 s, and
// returns the body once its first line starts with prefix.
func openDebug(t *testing.T, srv *Server, path, prefix string) *bufio.Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addrs().Debug.String()+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, prefix) {
		t.Fatalf("%s: %q %v", path, line, err)
	}
	return r
}

// stopSoon stops the server and fails when that took half the drain time:
// a graceful shutdown must end what never ends by itself (with).
func stopSoon(t *testing.T, stop func(), with string) {
	t.Helper()
	begin := time.Now()
	stop()
	if d := time.Since(begin); d > shutdownDrain/2 {
		t.Fatalf("shutdown took %v with %s", d, with)
	}
}
