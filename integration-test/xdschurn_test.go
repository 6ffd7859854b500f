package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestXDSChurn drives the built binary with a real go-control-plane xDS
// server misbehaving in the ways that used to cost it: two invalid
// snapshots alternating (724 NACKs a second, each logged), an update over
// XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES (a warning only, uncounted), and one
// update with thousands of problems (a log line and /rlconfig of
// megabytes).
func TestXDSChurn(t *testing.T) {
	slow(t)
	xds := harness.StartXDS(t, harness.XDSOptions{})
	xds.SetConfigs(t, egNode, xdsWeb(3, 100))
	// No jitter: the NACKs' pace is the back-off's, 200 ms, exactly.
	p := launch(t, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s", "XDS_CLIENT_BACKOFF_JITTER=false",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=65536")
	p.waitHealth(t, http.StatusOK)
	loadErrors := func() int64 { return p.stats(t)["ratelimit.service.config_load_error"] }
	logLines := func(s string) int { return strings.Count(p.logs(), s) }

	t.Run("alternating", func(t *testing.T) {
		bad := func(limit uint32) *rlsconfv3.RateLimitConfig {
			cfg := xdsWeb(limit, 100)
			cfg.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit(9)
			return cfg
		}
		from := len(xds.Requests())
		began := time.Now()
		for i := 0; time.Since(began) < 2*time.Second; i++ {
			xds.SetConfigs(t, egNode, bad(uint32(1+i%2)))
			time.Sleep(5 * time.Millisecond) // the churn's pace, on the service's real clock
		}
		took := time.Since(began)
		nacks := 0
		for _, r := range xds.Requests()[from:] {
			if r.NACK() {
				nacks++
			}
		}
		// The first at once, then one per 200 ms at most.
		if most := int(took/(200*time.Millisecond)) + 2; nacks > most {
			t.Errorf("%d NACKs in %v, want at most %d", nacks, took, most)
		}
		if got := loadErrors(); got != 2 {
			t.Errorf("config_load_error = %d, want 2 (one per distinct snapshot)", got)
		}
		if n := logLines("refused (NACK)"); n != 2 {
			t.Errorf("%d refusals logged, want 2", n)
		}
	})

	t.Run("too_large", func(t *testing.T) {
		before := loadErrors()
		big := xdsWeb(3, 100)
		for i := range 3000 {
			big.Descriptors = append(big.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("key-%05d-%s", i, strings.Repeat("x", 20)),
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1}})
		}
		xds.SetConfigs(t, egNode, big)
		eventually(t, "the oversized update refused", 15*time.Second, func() bool { return loadErrors() == before+1 })
		// Fetched again at each reconnection, on the back-off: still one.
		opened := xds.StreamsOpened()
		eventually(t, "two more fetches", 30*time.Second, func() bool { return xds.StreamsOpened() >= opened+2 })
		if got := loadErrors(); got != before+1 {
			t.Errorf("config_load_error went up by %d after more fetches, want 1", got-before)
		}
		if !strings.Contains(p.logs(), "update over XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
			t.Errorf("the refusal is not logged:\n%s", p.logs())
		}
		if code := p.healthCode(); code != http.StatusOK {
			t.Errorf("/healthcheck %d, want 200: the rules in use serve", code)
		}
	})

	t.Run("many_problems", func(t *testing.T) {
		before := loadErrors()
		bad := xdsWeb(3, 100)
		for i := range 2000 {
			bad.Descriptors = append(bad.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("k%d", i),
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit(9), RequestsPerUnit: 1}})
		}
		xds.SetConfigs(t, egNode, bad)
		eventually(t, "the update refused", 15*time.Second, func() bool { return loadErrors() == before+1 })
		eventually(t, "the refusal logged", 10*time.Second, func() bool { return strings.Contains(p.logs(), "1980 more problems") })
		for _, line := range strings.Split(p.logs(), "\n") {
			if len(line) > 16<<10 {
				t.Errorf("a log line of %d bytes", len(line))
			}
		}
		_, body := p.get(t, "http://"+p.debug+"/rlconfig")
		if len(body) > 16<<10 || !strings.Contains(body, "1980 more problems (2000 in all") {
			t.Errorf("/rlconfig is %d bytes and should show the count of the problems left out", len(body))
		}
	})
}

// TestRemovedDomainsStatisticsGo: domains renamed by one snapshot after
// another leave no statistics behind once they have been idle for
// STATS_IDLE_EXPIRY, in /stats and in Prometheus alike (a 30 s xDS storm
// used to leave 28,649 lines in /stats); the domain in use keeps its own.
func TestRemovedDomainsStatisticsGo(t *testing.T) {
	slow(t)
	xds := harness.StartXDS(t, harness.XDSOptions{})
	domain := func(i int) *rlsconfv3.RateLimitConfig {
		cfg := xdsWeb(3, 100)
		cfg.Name, cfg.Domain = fmt.Sprintf("d%03d", i), fmt.Sprintf("d%03d", i)
		return cfg
	}
	xds.SetConfigs(t, egNode, domain(0))
	p := launch(t, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode,
		"STATS_IDLE_EXPIRY=2s")
	p.waitHealth(t, http.StatusOK)
	c := p.client(t)
	for i := 1; i <= 40; i++ {
		xds.SetConfigs(t, egNode, domain(i))
		p.waitRules(t, fmt.Sprintf("d%03d.user:", i), time.Now())
		if _, err := c.ShouldRateLimit(callCtx(t), request(fmt.Sprintf("d%03d", i), "user", "u")); err != nil {
			t.Fatal(err)
		}
	}
	old := func(text string) int {
		n := 0
		for i := range 40 {
			if strings.Contains(text, fmt.Sprintf("d%03d", i)) {
				n++
			}
		}
		return n
	}
	eventually(t, "the removed domains' statistics gone", 30*time.Second, func() bool {
		_, stats := p.get(t, "http://"+p.debug+"/stats")
		_, metrics := p.get(t, "http://"+p.debug+"/metrics")
		return old(stats) == 0 && old(metrics) == 0
	})
	_, stats := p.get(t, "http://"+p.debug+"/stats")
	if !strings.Contains(stats, "ratelimit.service.rate_limit.d040.user.total_hits: 1") {
		t.Errorf("the domain in use lost its statistics:\n%s", stats)
	}
}
