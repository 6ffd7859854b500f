package server

import (
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// statsdSink listens for statsd datagrams on a loopback UDP port and hands
// over their lines.
func statsdSink(t *testing.T) (port string, lines <-chan string) {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			for _, l := range strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n") {
				ch <- l
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return strconv.Itoa(conn.LocalAddr().(*net.UDPAddr).Port), ch
}

// TestStatsdFlushOnShutdown: with a flush interval longer than the test,
// the counts of the requests served reach statsd at shutdown, after the
// drain, under the anchor's names.
func TestStatsdFlushOnShutdown(t *testing.T) {
	port, lines := statsdSink(t)
	srv, _, stop := startStoppable(t, serverRules, map[string]string{
		"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": port,
		"STATSD_PROTOCOL": "udp", "STATS_FLUSH_INTERVAL": "1h",
	})
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	for range 3 {
		if _, err := rls.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	stop()

	want := map[string]bool{
		"ratelimit.service.rate_limit.web.user.total_hits:3|c":   true,
		"ratelimit.service.rate_limit.web.user.within_limit:2|c": true,
		"ratelimit.service.rate_limit.web.user.over_limit:1|c":   true,
		"ratelimit.service.rate_limit.web.user.near_limit:1|c":   true,
		"ratelimit_server.ShouldRateLimit.total_requests:3|c":    true,
		"ratelimit.service.config_load_success:1|c":              true,
	}
	// One decision in eight is timed, standing for eight: the first.
	timed, goStats := 0, false
	deadline := time.After(10 * time.Second)
	for len(want) > 0 || timed < 8 || !goStats {
		select {
		case l := <-lines:
			delete(want, l)
			if strings.HasPrefix(l, "ratelimit_server.ShouldRateLimit.response_time:") {
				n := 1
				if _, rate, ok := strings.Cut(l, "|@"); ok {
					r, err := strconv.ParseFloat(rate, 64)
					if err != nil {
						t.Fatalf("line %q: %v", l, err)
					}
					n = int(1 / r)
				}
				timed += n
			}
			goStats = goStats || strings.HasPrefix(l, "ratelimit.go.numGoroutine:")
		case <-deadline:
			t.Fatalf("after shutdown, missing %v; %d response times (want 8); Go runtime stats: %v", want, timed, goStats)
		}
	}
	if timed != 8 {
		t.Errorf("%d response times, want 8 (the first of the 3 decisions, standing for 8)", timed)
	}
}

// TestDisableStats: DISABLE_STATS sends nothing and opens no Prometheus
// listener, as in the anchor, while the debug port keeps answering.
func TestDisableStats(t *testing.T) {
	srv, _ := build(t, serverRules, map[string]string{
		"DISABLE_STATS": "true", "USE_STATSD": "true", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0",
	}, io.Discard)
	t.Cleanup(func() {
		for _, l := range []net.Listener{srv.grpcLn, srv.httpLn, srv.debugLn} {
			l.Close()
		}
	})
	if srv.statsd != nil {
		t.Error("statistics are sent with DISABLE_STATS=true")
	}
	if srv.promLn != nil {
		t.Errorf("a Prometheus listener is open on %v with DISABLE_STATS=true", srv.promLn.Addr())
	}
	run(t, srv)
	if code, body := get(t, "http://"+srv.Addrs().Debug.String()+"/stats"); code != 200 || !strings.Contains(body, "config_load_success: 1") {
		t.Errorf("/stats = %d:\n%s", code, body)
	}
}
