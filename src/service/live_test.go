package service_test

import (
	"fmt"
	"testing"
	"time"

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
	measure := func(rec *live.Recorder) float64 {
		f := newFixture(t, service.Config{Live: rec})
		// 4,000 calls over 300 users with a limit of 10: within, near, then over.
		reqs := userRequests(300)
		i := 0
		allocs := testing.AllocsPerRun(4000, func() {
			if _, err := f.svc.ShouldRateLimit(t.Context(), reqs[i%len(reqs)]); err != nil {
				t.Fatal(err)
			}
			i++
		})
		return allocs
	}
	off, on := measure(nil), measure(live.New(live.Config{}))
	if on > off {
		t.Fatalf("a decision allocates %v times with the live view, %v without", on, off)
	}
	t.Logf("allocations per decision: %v with the live view, %v without", on, off)
}
