package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

// shadowRules try a stricter limit beside the one in force (user), and
// a first limit on a descriptor that has none yet (path).
const shadowRules = `
domain: test
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 3}
      - {unit: minute, requests_per_unit: 1, algorithm: sliding_window, shadow_mode: true, name: strict}
  - key: path
    rate_limits:
      - {unit: hour, requests_per_unit: 2, shadow_mode: true}
`

func newShadowFixture(t *testing.T, cfg service.Config) *fixture {
	t.Helper()
	f := newFixture(t, cfg)
	rc, err := rules.Parse([]rules.File{{Name: "s.yaml", Data: []byte(shadowRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	return f
}

// shadowOver returns the names in the response's "shadowOverLimit"
// metadata, or nil.
func shadowOver(resp *rlsv3.RateLimitResponse) []string {
	v := resp.GetDynamicMetadata().GetFields()["shadowOverLimit"]
	if v == nil {
		return nil
	}
	var names []string
	for _, n := range v.GetListValue().GetValues() {
		names = append(names, n.GetStringValue())
	}
	return names
}

// TestShadowLimitNeverRefuses: the enforced limit decides as alone; the
// shadow limit counts what it would refuse (shadow_over_limit), names it
// in the dynamic metadata, with or without RESPONSE_DYNAMIC_METADATA, and
// is no policy in the headers; a descriptor with shadow limits only is
// answered as one without a rule.
func TestShadowLimitNeverRefuses(t *testing.T) {
	for _, md := range []bool{false, true} {
		f := newShadowFixture(t, service.Config{DynamicMetadata: md, Headers: service.Headers{Enabled: true, Style: service.HeadersIETF}})
		for i := range 4 {
			resp := f.call(t, req(desc("user", "alice"), desc("path", "/x")))
			wantOver := i >= 3
			if got := resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT; got != wantOver {
				t.Errorf("md=%t: hit %d: %v, want over %t (the enforced limit of 3 alone)", md, i+1, resp.GetOverallCode(), wantOver)
			}
			st := resp.GetStatuses()[0]
			if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 3 {
				t.Errorf("md=%t: hit %d: current_limit %v, want the enforced limit's", md, i+1, l)
			}
			if st := resp.GetStatuses()[1]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
				t.Errorf("md=%t: hit %d: path status %v, want OK without a limit", md, i+1, st)
			}
			var want []string
			if i >= 1 {
				want = append(want, "test.user.strict")
			}
			if i >= 2 {
				want = append(want, "test.path.hour_shadow")
			}
			if got := shadowOver(resp); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("md=%t: hit %d: shadowOverLimit %q, want %q", md, i+1, got, want)
			}
			if md {
				if _, ok := resp.GetDynamicMetadata().GetFields()["domain"]; !ok {
					t.Errorf("md=%t: hit %d: metadata %v lacks the request's summary", md, i+1, resp.GetDynamicMetadata())
				}
			}
			if p := headerMap(resp.GetResponseHeadersToAdd())["RateLimit-Policy"]; p != `"user.minute";q=3;w=60` {
				t.Errorf("md=%t: hit %d: RateLimit-Policy %q, want the enforced limit only", md, i+1, p)
			}
		}
		snap := f.reg.Snapshot()
		for name, want := range map[string]uint64{
			"ratelimit.service.rate_limit.test.user.total_hits":                    4,
			"ratelimit.service.rate_limit.test.user.over_limit":                    1,
			"ratelimit.service.rate_limit.test.user.minute.over_limit":             1,
			"ratelimit.service.rate_limit.test.user.minute.shadow_over_limit":      0,
			"ratelimit.service.rate_limit.test.user.strict.total_hits":             4,
			"ratelimit.service.rate_limit.test.user.strict.within_limit":           1,
			"ratelimit.service.rate_limit.test.user.strict.over_limit":             0,
			"ratelimit.service.rate_limit.test.user.strict.shadow_over_limit":      3,
			"ratelimit.service.rate_limit.test.path.hour_shadow.total_hits":        4,
			"ratelimit.service.rate_limit.test.path.hour_shadow.shadow_over_limit": 2,
			"ratelimit.service.rate_limit.test.path.total_hits":                    0,
			"ratelimit.service.rate_limit.test.path.over_limit":                    0,
		} {
			if got := snap[name]; got != want {
				t.Errorf("md=%t: %s = %d, want %d", md, name, got, want)
			}
		}
		if _, ok := snap["ratelimit.service.rate_limit.test.user.shadow_over_limit"]; ok {
			t.Errorf("md=%t: the descriptor's own key has shadow_over_limit: only a list's limits have it", md)
		}
		_, body := scrapeMetrics(t, f.reg)
		if want := `ratelimit_service_rate_limit_shadow_over_limit{domain="test",key1="user",key2="strict"} 3`; !strings.Contains(body, want) {
			t.Errorf("md=%t: /metrics lacks %s", md, want)
		}
	}
}

// TestShadowMetadataWithoutOthers: with RESPONSE_DYNAMIC_METADATA off,
// the shadow mark is the only key, and a response with nothing to mark
// has no metadata at all.
func TestShadowMetadataWithoutOthers(t *testing.T) {
	f := newShadowFixture(t, service.Config{})
	if resp := f.call(t, req(desc("user", "bob"))); resp.GetDynamicMetadata() != nil {
		t.Errorf("first hit: metadata %v, want none", resp.GetDynamicMetadata())
	}
	resp := f.call(t, req(desc("user", "bob")))
	want, _ := structpb.NewStruct(map[string]any{"shadowOverLimit": []any{"test.user.strict"}})
	if got := resp.GetDynamicMetadata(); got.String() != want.String() {
		t.Errorf("second hit: metadata %v, want %v", got, want)
	}
}

// TestShadowLimitInTheLiveView: the service tells the live view each
// shadow limit's own status, apart from the decision, which counts under
// the enforced limit.
func TestShadowLimitInTheLiveView(t *testing.T) {
	rec := live.New(live.Config{Now: func() time.Time { return epoch }})
	f := newShadowFixture(t, service.Config{Live: rec})
	rec.Tick(epoch)
	r := req(desc("user", "eve"), desc("path", "/x"))
	r.HitsAddend = 3 // within 3 a minute; over strict's 1 and path's 2
	f.call(t, r)
	rec.Tick(epoch.Add(time.Second))
	tr := rec.Traffic(1)
	if got := tr.Rules["test.user.strict"]; fmt.Sprint(got.Decisions, got.OverLimit) != "[1] [1]" {
		t.Errorf("test.user.strict: %+v, want 1 decision it would refuse", got)
	}
	if got := tr.Rules["test.user.minute"]; fmt.Sprint(got.Decisions, got.OverLimit) != "[1] [0]" {
		t.Errorf("test.user.minute: %+v, want 1 decision, admitted", got)
	}
	if got := tr.Totals; fmt.Sprint(got.Decisions, got.OverLimit) != "[1] [0]" {
		t.Errorf("totals: %+v, want the one decision of the limit in force", got)
	}
	// A fixed window keeps the hits it would refuse, so the key is over
	// until the hour ends. (A continuous algorithm records none of them:
	// such a key is at once no longer over.)
	keys := rec.TopKeys(5)["test"]
	if len(keys) == 0 || keys[0].RuleID != "test.path.hour_shadow" || !keys[0].Over || keys[0].Entries[0].Value != "/x" {
		t.Errorf("top keys: %+v, want first /x, over the shadow limit", keys)
	}
}
