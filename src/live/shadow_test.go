package live

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

const shadowRules = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 2, algorithm: sliding_window, shadow_mode: true, name: strict}
      - {unit: hour, requests_per_unit: 100}
  - key: ip
    rate_limits:
      - {unit: second, requests_per_unit: 5}
`

// TestShadowLimitSeriesAndTwins: a shadow limit has series of its own,
// its would-refuse decisions as over the limit, left out of the totals
// (the enforced limit that decided counts the decision); its key shows
// among the top keys under its own ID; the limits of its list link to it
// and it to them.
func TestShadowLimitSeriesAndTwins(t *testing.T) {
	r := New(Config{Now: func() time.Time { return epoch }})
	cfg := parse(t, shadowRules)
	r.SetRules(cfg)
	user := cfg.Match("api", []rules.Entry{{Key: "user", Value: "a"}}).Limit
	enforced, strict := user.Limits[0], user.Limits[1]

	rs, _ := r.Rules()
	twins := map[string][]string{}
	for _, rule := range rs {
		twins[rule.ID] = rule.Twins
	}
	want := map[string][]string{
		"api.ip.second":   nil,
		"api.user.minute": {"api.user.strict"},
		"api.user.strict": {"api.user.minute", "api.user.hour"},
		"api.user.hour":   {"api.user.strict"},
	}
	if fmt.Sprint(twins) != fmt.Sprint(want) {
		t.Errorf("twins = %v, want %v", twins, want)
	}

	r.Tick(epoch)
	e := []rules.Entry{{Key: "user", Value: "alice"}}
	ok := okStatus(5, false)
	wouldRefuse := limiter.Status{Limit: strict, Code: limiter.OverLimit, ResetAfter: 30 * time.Second,
		Counts: limiter.Counts{TotalHits: 1, NearLimit: 1, ShadowOverLimit: 1}}
	for range 3 {
		r.Observe("api", e, enforced, &ok, epoch)
		r.Observe("api", e, strict, &wouldRefuse, epoch)
	}
	r.Tick(epoch.Add(time.Second))
	tr := r.Traffic(1)
	if got := tr.Rules["api.user.strict"]; !slices.Equal(got.Decisions, []uint32{3}) || !slices.Equal(got.OverLimit, []uint32{3}) {
		t.Errorf("shadow limit's series = %+v, want 3 decisions, 3 it would refuse", got)
	}
	if got := tr.Totals; !slices.Equal(got.Decisions, []uint32{3}) || !slices.Equal(got.OverLimit, []uint32{0}) {
		t.Errorf("totals = %+v, want the 3 decisions once, none refused", got)
	}
	top := r.TopKeys(10)["api"]
	if len(top) != 1 || top[0].RuleID != "api.user.strict" || !top[0].Over || !top[0].Limit.Shadow {
		t.Errorf("top keys = %+v, want alice under the shadow limit, which would refuse it", top)
	}
}
