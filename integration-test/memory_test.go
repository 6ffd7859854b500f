package integration

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestMemoryFloodAtCeiling floods a 1 MiB memory store with ten times what
// it holds in new keys: every request is answered, a client over its
// limit stays over (the flood cannot reset its counter), and /stats counts
// the keys evicted under their limit.
func TestMemoryFloodAtCeiling(t *testing.T) {
	const rules = `domain: flood
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	p := start(t, map[string]string{"flood.yaml": rules}, "MEMORY_MAX_BYTES=1048576")
	c := p.client(t)
	for range 3 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("flood", "user", "spent")); err != nil {
			t.Fatal(err)
		}
	}
	// About 230 bytes a key: 1 MiB holds some 4,500 of them.
	for r := range 180 {
		req := &rlsv3.RateLimitRequest{Domain: "flood"}
		for i := range 256 {
			req.Descriptors = append(req.Descriptors, request("flood", "user", fmt.Sprintf("u%d.%d", r, i)).GetDescriptors()...)
		}
		resp, err := c.ShouldRateLimit(callCtx(t), req)
		if err != nil {
			t.Fatalf("request %d of the flood: %v, want an answer", r, err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d of the flood: %v, want OK for new users", r, resp.GetOverallCode())
		}
	}
	resp, err := c.ShouldRateLimit(callCtx(t), request("flood", "user", "spent"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the spent user after the flood: %v, %v; want OVER_LIMIT still", resp.GetOverallCode(), err)
	}
	stats := p.stats(t)
	if stats["ratelimit.memory.evicted_under_limit"] < 40_000 || stats["ratelimit.memory.evicted_over_limit"] != 0 {
		t.Errorf("/stats: evicted_under_limit %d, evicted_over_limit %d; want 40,000 or more and 0",
			stats["ratelimit.memory.evicted_under_limit"], stats["ratelimit.memory.evicted_over_limit"])
	}
}

// stats reads the debug listener's /stats ("name: value" lines).
func (p *proc) stats(t *testing.T) map[string]int64 {
	t.Helper()
	resp, err := http.Get("http://" + p.debug + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ": ")
		if n, err := strconv.ParseInt(value, 10, 64); ok && err == nil {
			out[name] = n
		}
	}
	return out
}
