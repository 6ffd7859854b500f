package integration

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMemoryFloodAtCeiling floods a 1 MiB memory store with ten times what
// it holds in new keys: every request is answered, a client over its
// limit stays over (the flood cannot reset its counter), and /stats counts
// the keys evicted under their limit.
func TestMemoryFloodAtCeiling(t *testing.T) {
	slow(t)
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
	if stats["ratelimit.memory.evicted_under_limit"] < 40_000 || stats["ratelimit.memory.refused_new_keys"] != 0 {
		t.Errorf("/stats: evicted_under_limit %d, refused_new_keys %d; want 40,000 or more and 0",
			stats["ratelimit.memory.evicted_under_limit"], stats["ratelimit.memory.refused_new_keys"])
	}
}

// TestMemorySpentClientOutlivesFloods is issue 24's first case over the
// wire: a client over its 3-an-hour limit stays over it through floods of
// new keys, each several times what a 1 MiB store holds, of every shape
// that puts the flood's own keys over their limit: new values of a
// limit-1 rule, new values of the client's own rule three hits each, and
// hits_addend above the limit. Once only keys over their limit are left,
// new keys are refused with ResourceExhausted, counted in /stats.
func TestMemorySpentClientOutlivesFloods(t *testing.T) {
	const rules = `domain: flood
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	values := func(r int, key string, n, each int) []*ratelimitv3.RateLimitDescriptor {
		var ds []*ratelimitv3.RateLimitDescriptor
		for i := range n {
			for range each {
				ds = append(ds, request("flood", key, fmt.Sprintf("%s%d.%d", key, r, i)).GetDescriptors()...)
			}
		}
		return ds
	}
	tests := []struct {
		name  string
		flood func(r int) *rlsv3.RateLimitRequest
	}{
		{"limit_1_rule", func(r int) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "flood", Descriptors: values(r, "one", 256, 1)}
		}},
		{"own_rule", func(r int) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "flood", Descriptors: values(r, "user", 85, 3)}
		}},
		{"hits_addend", func(r int) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "flood", Descriptors: values(r, "user", 256, 1), HitsAddend: 1000}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := start(t, map[string]string{"flood.yaml": rules}, "MEMORY_MAX_BYTES=1048576")
			c := p.client(t)
			spent := request("flood", "user", "spent")
			for range 3 {
				if resp, err := c.ShouldRateLimit(callCtx(t), spent); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("spending the client: %v, %v", resp.GetOverallCode(), err)
				}
			}
			// 1 MiB holds some 9,000 keys over their limit: 240 requests
			// bring 20,000 to 61,000 new ones.
			refused := 0
			for r := range 240 {
				_, err := c.ShouldRateLimit(callCtx(t), tt.flood(r))
				switch {
				case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "no room for a new key"):
					refused++
				case err != nil:
					t.Fatalf("request %d of the flood: %v, want an answer or ResourceExhausted", r, err)
				}
				if r%20 != 19 {
					continue
				}
				resp, err := c.ShouldRateLimit(callCtx(t), spent)
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("the spent client after %d requests of the flood: %v, %v; want OVER_LIMIT", r+1, resp.GetOverallCode(), err)
				}
			}
			stats := p.stats(t)
			t.Logf("%d of 240 flood requests refused; /stats: %d keys, %d compact, %d compacted, %d refused, %d bytes", refused,
				stats["ratelimit.memory.keys"], stats["ratelimit.memory.compact_keys"], stats["ratelimit.memory.compacted_over_limit"],
				stats["ratelimit.memory.refused_new_keys"], stats["ratelimit.memory.bytes"])
			if refused == 0 || stats["ratelimit.memory.refused_new_keys"] < int64(refused) ||
				stats["ratelimit.memory.compacted_over_limit"] == 0 || stats["ratelimit.service.call.should_rate_limit.load_shed"] < int64(refused) {
				t.Errorf("want some flood requests refused, counted in refused_new_keys and load_shed, and keys compacted")
			}
			if got := stats["ratelimit.memory.bytes"]; got > 1<<20+1<<20/16+256*8192 {
				t.Errorf("ratelimit.memory.bytes = %d, above the ceiling, a sixteenth and a key a shard", got)
			}
		})
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

// TestMemoryCountsArePerInstance proves what the README says of
// BACKEND_TYPE=memory: two instances count apart (a client spread over
// both is admitted up to twice its limit), and a restart starts every
// count afresh.
func TestMemoryCountsArePerInstance(t *testing.T) {
	const rules = `domain: apart
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	admitted := func(p *proc, n int) int {
		t.Helper()
		c, ok := p.client(t), 0
		for range n {
			resp, err := c.ShouldRateLimit(callCtx(t), request("apart", "user", "spread"))
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	a := start(t, map[string]string{"apart.yaml": rules})
	b := start(t, map[string]string{"apart.yaml": rules})
	if got := admitted(a, 3) + admitted(b, 3); got != 4 {
		t.Errorf("a limit of 2 spread over two instances: %d admitted, want 4 (each counts its own)", got)
	}
	a.signal(t, syscall.SIGTERM)
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	restarted := launchWith(t, launchOpts{reuse: a}, nil)
	restarted.waitHealth(t, http.StatusOK)
	if got := admitted(restarted, 3); got != 2 {
		t.Errorf("after a restart: %d of 3 admitted, want 2 (the counts start afresh)", got)
	}
}
