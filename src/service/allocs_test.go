package service_test

import (
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/service"
)

// TestThreeDescriptorsAllocs: a request of three descriptors (Envoy's
// usual address / path / user chain) on keys the memory store holds
// costs two allocations, the response and the string of the three keys,
// within the limit or over it.
func TestThreeDescriptorsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race; make allocs runs this test")
	}
	f := newFixture(t, service.Config{})
	reqs := make([]*rlsv3.RateLimitRequest, 300)
	for i := range reqs {
		reqs[i] = req(desc("ip", "10.0."+strconv.Itoa(i)), desc("path", "/api", "method", "GET"), desc("user", "u-"+strconv.Itoa(i)))
	}
	// Create the keys first: a new key costs the store its entry.
	for _, r := range reqs {
		if _, err := f.svc.ShouldRateLimit(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	allocs := testing.AllocsPerRun(3000, func() {
		if _, err := f.svc.ShouldRateLimit(t.Context(), reqs[i%len(reqs)]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs > 2 {
		t.Errorf("a decision of three descriptors allocates %v times, want at most 2", allocs)
	}
}
