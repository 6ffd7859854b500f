package service_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/service"
)

// TestLiveViewSeesDecisions: the service tells the recorder each
// descriptor's decision with its rule and entries, and each store error.
func TestLiveViewSeesDecisions(t *testing.T) {
	rec := live.New(live.Config{Now: func() time.Time { return epoch }})
	f := newFixture(t, service.Config{Live: rec})
	if rs, _ := rec.Rules(); len(rs) == 0 {
		t.Fatal("SetRules did not reach the recorder")
	}
	rec.Tick(epoch)
	for range 5 { // user's limit is 3 a minute
		f.call(t, req(desc("user", "alice"), desc("ip", "10.0.0.1")))
	}
	rec.Tick(epoch.Add(time.Second))
	tr := rec.Traffic(1)
	if got := tr.Rules["test.user"]; fmt.Sprint(got.Decisions, got.OverLimit, got.NearLimit) != "[5] [2] [1]" {
		t.Fatalf("test.user: %+v", got)
	}
	if got := tr.Rules["test.ip"].Decisions; fmt.Sprint(got) != "[5]" {
		t.Fatalf("test.ip: %v", got)
	}
	keys := rec.TopKeys(5)["test"]
	if len(keys) != 1 || keys[0].RuleID != "test.user" || keys[0].Entries[0].Value != "alice" || keys[0].Used != 3 || keys[0].Capacity != 3 {
		t.Fatalf("top keys: %+v", keys)
	}
	// A refund decides nothing: the live view does not count it.
	f.call(t, req(refund(1, "user", "alice")))
	rec.Tick(epoch.Add(1500 * time.Millisecond))
	if got := rec.Traffic(1).Rules["test.user"]; fmt.Sprint(got.Decisions) != "[5]" {
		t.Fatalf("test.user after a refund: %+v, want the 5 decisions only", got)
	}

	failing := newFixtureWithStore(t, service.Config{Live: rec}, failingStore{fmt.Errorf("redis: %w", limiter.ErrUnavailable)})
	if _, err := failing.svc.ShouldRateLimit(t.Context(), req(desc("user", "bob"))); err == nil {
		t.Fatal("no error from a failing store")
	}
	rec.Tick(epoch.Add(2 * time.Second))
	if _, errs := rec.StoreLatency(); errs != 1 {
		t.Fatalf("store errors = %d, want 1", errs)
	}
}

// TestLiveViewAllocs: the recorder adds no allocation to a decision, within,
// near or over the limit.
func TestLiveViewAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race; make allocs runs this test")
	}
	// 4,000 calls over 300 users with a limit of 10: within, near, then
	// over; and as many that match nothing (an unknown domain, a key no
	// rule has).
	unmatched := make([]*rlsv3.RateLimitRequest, 300)
	for i := range unmatched {
		unmatched[i] = req(desc("usr", fmt.Sprint("u", i)))
		if i%2 == 0 {
			unmatched[i].Domain = fmt.Sprint("domain-", i)
		}
	}
	for _, reqs := range [][]*rlsv3.RateLimitRequest{userRequests(300), unmatched} {
		off, on := measureLiveAllocs(t, nil, reqs), measureLiveAllocs(t, live.New(live.Config{}), reqs)
		if on > off {
			t.Fatalf("a decision allocates %v times with the live view, %v without", on, off)
		}
		t.Logf("allocations per decision: %v with the live view, %v without", on, off)
	}
}

// measureLiveAllocs returns the allocations of a decision of one of reqs
// in turn, with rec.
func measureLiveAllocs(t *testing.T, rec *live.Recorder, reqs []*rlsv3.RateLimitRequest) float64 {
	t.Helper()
	f := newFixture(t, service.Config{Live: rec})
	i := 0
	allocs := testing.AllocsPerRun(4000, func() {
		if _, err := f.svc.ShouldRateLimit(t.Context(), reqs[i%len(reqs)]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	return allocs
}

// TestLiveViewSeesUnmatched: the service tells the recorder the requests
// for an unknown domain and the descriptors that no rule matched, and
// nothing of those that matched.
func TestLiveViewSeesUnmatched(t *testing.T) {
	rec := live.New(live.Config{Now: func() time.Time { return epoch }})
	f := newFixture(t, service.Config{Live: rec})
	other := req(desc("user", "alice"), desc("ip", "10.0.0.1"))
	other.Domain = "tset"
	f.call(t, other)
	f.call(t, req(desc("usr", "alice"), desc("user", "alice"), desc("path", "/x", "verb", "GET")))
	if got := rec.UnknownDomains(10); len(got) != 1 || got[0].Domain != "tset" || got[0].Count != 1 {
		t.Errorf("unknown domains: %+v, want tset once (a request, not its descriptors)", got)
	}
	got := rec.UnmatchedKeys(10)
	var chains []string
	for _, u := range got {
		chains = append(chains, u.Domain+":"+fmt.Sprint(u.Keys))
	}
	slices.Sort(chains)
	if fmt.Sprint(chains) != "[test:[path verb] test:[usr]]" {
		t.Errorf("unmatched key chains: %v, want test's [path verb] and [usr] (those of tset are in the domain's count)", chains)
	}
}
