package service_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

const listRules = `
domain: test
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, name: sustained}
  - key: team
    rate_limits:
      - {unit: minute, requests_per_unit: 3, name: small}
      - {unit: hour, requests_per_unit: 50, name: big}
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: small}]}
  - key: path
    value_regex: /api/v[0-9]+/.*
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func newListFixture(t *testing.T, cfg service.Config) *fixture {
	t.Helper()
	f := newFixture(t, cfg)
	rc, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(listRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	return f
}

// TestRateLimitsStatusAndStatistics: the status is the deciding limit's;
// the descriptor's statistics count each hit once under the rule's key,
// and every limit's under the key plus its name or unit.
func TestRateLimitsStatusAndStatistics(t *testing.T) {
	f := newListFixture(t, service.Config{})
	codes := []rlsv3.RateLimitResponse_Code{}
	var last *rlsv3.RateLimitResponse_DescriptorStatus
	for range 3 {
		resp := f.call(t, req(desc("user", "alice")))
		codes = append(codes, resp.GetOverallCode())
		last = resp.GetStatuses()[0]
	}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	for i := range want {
		if codes[i] != want[i] {
			t.Errorf("hit %d: %v, want %v", i+1, codes[i], want[i])
		}
	}
	if l := last.GetCurrentLimit(); l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || l.GetRequestsPerUnit() != 2 {
		t.Errorf("third hit's current_limit = %v, want the per-second limit that refused it", l)
	}
	if d := last.GetDurationUntilReset().AsDuration(); d != time.Second {
		t.Errorf("third hit's duration_until_reset = %v, want 1s (the second's end)", d)
	}
	f.advance(time.Second)
	resp := f.call(t, req(desc("user", "alice")))
	if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "sustained" || st.GetLimitRemaining() != 1 {
		t.Errorf("hit 4: %v, want the sustained limit with 1 left (1 left in both, it resets last)", st)
	}

	snap := f.reg.Snapshot()
	for name, want := range map[string]uint64{
		"ratelimit.service.rate_limit.test.user.total_hits":             4,
		"ratelimit.service.rate_limit.test.user.over_limit":             1,
		"ratelimit.service.rate_limit.test.user.within_limit":           3,
		"ratelimit.service.rate_limit.test.user.second.total_hits":      4,
		"ratelimit.service.rate_limit.test.user.second.over_limit":      1,
		"ratelimit.service.rate_limit.test.user.second.within_limit":    3,
		"ratelimit.service.rate_limit.test.user.sustained.total_hits":   4,
		"ratelimit.service.rate_limit.test.user.sustained.within_limit": 4,
		"ratelimit.service.rate_limit.test.user.sustained.over_limit":   0,
	} {
		if got := snap[name]; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// TestRateLimitsReplaces: a rule replacing one limit of a list by name
// drops that limit only.
func TestRateLimitsReplaces(t *testing.T) {
	f := newListFixture(t, service.Config{})
	for i := range 5 {
		resp := f.call(t, req(desc("team", "t1"), desc("tier", "gold")))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("hit %d with the small limit replaced: %v, want OK", i+1, resp.GetOverallCode())
		}
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetName() != "big" {
			t.Fatalf("hit %d: status %v, want the big limit's", i+1, st)
		}
	}
	for i := range 4 {
		resp := f.call(t, req(desc("team", "t2")))
		if want := i < 3; (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Errorf("hit %d without the replacing rule: %v, want OK %v", i+1, resp.GetOverallCode(), want)
		}
	}
}

// TestRateLimitsHeaders: the anchor's trio describes the deciding limit;
// the IETF pair lists every limit.
func TestRateLimitsHeaders(t *testing.T) {
	f := newListFixture(t, service.Config{Headers: service.Headers{Enabled: true, Style: service.HeadersIETF}})
	resp := f.call(t, req(desc("user", "alice"), desc("path", "/api/v2/x")))
	got := headerMap(resp.GetResponseHeadersToAdd())
	want := map[string]string{
		"RateLimit-Policy": `"user.second";q=2;w=1, "sustained";q=5;w=60, "path_~/api/v[0-9]+/.*";q=1;w=60`,
		"RateLimit":        `"user.second";r=1;t=1, "sustained";r=4;t=45, "path_~/api/v[0-9]+/.*";r=0;t=45`,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s =\n  %s\nwant\n  %s", k, got[k], v)
		}
	}
	d := newListFixture(t, service.Config{Headers: service.Headers{Enabled: true}})
	d.call(t, req(desc("user", "bob")))
	got = headerMap(d.call(t, req(desc("user", "bob"))).GetResponseHeadersToAdd())
	for k, v := range map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"} {
		if got[k] != v {
			t.Errorf("draft-03 %s = %q, want %q (the per-second limit, 0 left)", k, got[k], v)
		}
	}
}
