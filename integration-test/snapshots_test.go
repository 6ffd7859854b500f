package integration

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// heapAfterGC is the service's heap after a garbage collection, from its
// debug listener's heap profile (gc=1 collects first; debug=1 ends with
// the runtime's MemStats).
func (p *proc) heapAfterGC(t *testing.T) int64 {
	t.Helper()
	_, body := p.get(t, "http://"+p.debug+"/debug/pprof/heap?gc=1&debug=1")
	m := regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no HeapAlloc in the heap profile")
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// TestSnapshotsAreNotKept loads 300 rule snapshots over xDS, as
// Envoy Gateway pushes one per route change, with a decision over a limit
// under each (the live view records it): the heap after GC stays where it
// was after the first fifty. The live view used to keep every replaced
// snapshot alive (49 -> 306 MB).
func TestSnapshotsAreNotKept(t *testing.T) {
	slow(t)
	busyParallel(t)
	xds := harness.StartXDS(t, harness.XDSOptions{})
	snapshot := func(i int) *rlsconfv3.RateLimitConfig {
		cfg := &rlsconfv3.RateLimitConfig{Name: "web", Domain: "web"}
		// 400 rules with 200-byte names: about 200 KB of rules a snapshot.
		for j := range 400 {
			cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{
				Key: fmt.Sprintf("k%03d", j),
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: uint32(1 + i%2),
					Name: fmt.Sprintf("n%03d%s", j, strings.Repeat("x", 200))},
			})
		}
		return cfg
	}
	xds.SetConfigs(t, egNode, snapshot(0))
	p := launchWith(t, launchOpts{binary: plainBinary(t)}, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr,
		"CONFIG_GRPC_XDS_NODE_ID="+egNode, "REQUEST_TIMEOUT=2s")
	p.waitHealth(t, http.StatusOK)
	c := p.client(t)
	load := func(i int) {
		xds.SetConfigs(t, egNode, snapshot(i))
		want := fmt.Sprintf("requests_per_unit=%d,", 1+i%2)
		eventually(t, "snapshot "+strconv.Itoa(i), 10*time.Second, func() bool {
			_, body := p.get(t, "http://"+p.debug+"/rlconfig")
			return strings.Contains(body, want)
		})
		key := fmt.Sprintf("k%03d", i%400)
		for range 3 { // over a limit of 1 or 2
			if _, err := c.ShouldRateLimit(callCtx(t), request("web", key, strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 1; i <= 50; i++ {
		load(i)
	}
	base := p.heapAfterGC(t)
	for i := 51; i <= 300; i++ {
		load(i)
	}
	after := p.heapAfterGC(t)
	t.Logf("heap after GC: %d MB after 50 snapshots, %d MB after 300", base>>20, after>>20)
	if after > base+16<<20 {
		t.Errorf("heap after GC went from %d MB to %d MB over 250 snapshots: replaced snapshots are kept", base>>20, after>>20)
	}
}
