package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// explain explains r with f's service, failing the test on an error.
func (f *fixture) explain(t *testing.T, r *rlsv3.RateLimitRequest) *service.Explanation {
	t.Helper()
	x, err := f.svc.Explain(t.Context(), r)
	if err != nil {
		t.Fatalf("Explain: %v", err)
	}
	return x
}

// TestExplainSaysWhy: for each way a descriptor is (not) limited, Explain
// names the rule or why none applies, the limits with their counters now,
// and the answer the request would get.
func TestExplainSaysWhy(t *testing.T) {
	f := newFixture(t, service.Config{})
	for range 2 {
		f.call(t, req(desc("user", "alice")))
	}
	for range 3 {
		f.call(t, req(desc("shadow", "x")))
	}
	other := req(desc("user", "alice"))
	other.Domain = "tset"
	tests := []struct {
		name    string
		give    *rlsv3.RateLimitRequest
		want    []string // in the descriptor's JSON
		code    string   // the descriptor's
		overall string
	}{
		{"room_left", req(desc("user", "alice")), []string{`"rule":"test.user"`, `"by":"key"`, `"remaining":1`, `"would":"OK"`}, "OK", "OK"},
		{"hits_past_the_limit", req(withHits(desc("user", "alice"), 2)), []string{`"remaining":1`, `"would":"OVER_LIMIT"`}, "OVER_LIMIT", "OVER_LIMIT"},
		{"fresh_key", req(desc("user", "bob")), []string{`"remaining":3`, `"would":"OK"`}, "OK", "OK"},
		{"unknown_domain", other, []string{`"why":"domain \"tset\" is not in the rules (domains: \"test\")"`, `"limits":[]`}, "OK", "OK"},
		{"unknown_key", req(desc("usr", "alice")), []string{`no rule has the key \"usr\"`, `\"user\"`}, "OK", "OK"},
		{"value_not_matched", req(desc("tier", "silver")), []string{`the value \"silver\" of key \"tier\" matches no rule`, `\"basic\", \"gold\"`}, "OK", "OK"},
		{"unlimited", req(desc("free", "x")), []string{`"why":"the rule is unlimited"`, `"unlimited":true`}, "OK", "OK"},
		{"shadow_mode_over", req(desc("shadow", "x")), []string{`"shadow_mode":true`, `"remaining":0`, `"would":"OVER_LIMIT"`}, "OK", "OK"},
		{"override", req(withOverride(desc("user", "carol"), 1, typev3.RateLimitUnit_HOUR, 1)),
			[]string{`"rule":"override"`, `per-request limit override`, `"remaining":1`}, "OK", "OK"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := f.explain(t, tt.give)
			b, _ := json.Marshal(x.Descriptors[0])
			for _, w := range tt.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("descriptor %s lacks %s", b, w)
				}
			}
			if x.Descriptors[0].Code != tt.code || x.OverallCode != tt.overall || x.Counters != "read" {
				t.Errorf("code %q, overall %q, counters %q; want %q, %q, read", x.Descriptors[0].Code, x.OverallCode, x.Counters, tt.code, tt.overall)
			}
		})
	}

	// Two descriptors: gold's rule replaces basic's.
	x := f.explain(t, req(desc("tier", "basic"), desc("tier", "gold")))
	if d := x.Descriptors[0]; !strings.Contains(d.Why, `replaced: descriptor 2's rule test.tier_gold`) || len(d.Limits) != 1 || d.Limits[0].Skipped == "" {
		t.Errorf("replaced descriptor: %+v", d)
	}
}

// TestExplainCountsNothing: explaining a request counts no hit, makes no
// statistics key and tells the live view nothing: the decisions after it
// are those without it.
func TestExplainCountsNothing(t *testing.T) {
	var logs logBuffer
	rec := live.New(live.Config{Now: func() time.Time { return epoch }})
	f := newFixture(t, service.Config{Live: rec, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	before := fmt.Sprint(f.reg.Snapshot())
	other := req(desc("user", "alice"))
	other.Domain = "tset"
	for range 10 {
		f.explain(t, req(desc("user", "alice"), desc("usr", "x")))
		f.explain(t, other)
		f.explain(t, req(withOverride(desc("user", "carol"), 1, typev3.RateLimitUnit_HOUR, 1)))
	}
	if after := fmt.Sprint(f.reg.Snapshot()); after != before {
		t.Errorf("statistics changed by explaining:\n%s\n%s", before, after)
	}
	if len(rec.UnknownDomains(10))+len(rec.UnmatchedKeys(10)) != 0 || len(logs.lines("")) > 1 {
		t.Errorf("explaining reached the live view or the log: %v %v %q", rec.UnknownDomains(10), rec.UnmatchedKeys(10), logs.lines(""))
	}
	for i := range 3 {
		if resp := f.call(t, req(desc("user", "alice"))); resp.GetStatuses()[0].GetLimitRemaining() != uint32(2-i) {
			t.Fatalf("call %d after explaining: remaining %d, want %d", i+1, resp.GetStatuses()[0].GetLimitRemaining(), 2-i)
		}
	}
}

// TestExplainWithoutCounters: a store that cannot be read leaves the
// counters and codes out, and says why; the rest is explained.
func TestExplainWithoutCounters(t *testing.T) {
	f := newFixtureWithStore(t, service.Config{}, failingStore{fmt.Errorf("redis 10.0.0.7:6379: %w: %w", limiter.ErrUnavailable, limiter.ReasonBreakerOpen)})
	x := f.explain(t, req(desc("user", "alice")))
	d := x.Descriptors[0]
	if x.Counters != "not read: store unavailable: circuit breaker open" || x.OverallCode != "" || d.Code != "" || d.Rule != "test.user" ||
		d.Limits[0].Remaining != nil || d.Limits[0].Would != "" {
		t.Errorf("explanation without the store: %+v %+v", x, d)
	}
}

// TestExplainBoundsItsInput: Explain refuses what a decision refuses,
// with the same reason.
func TestExplainBoundsItsInput(t *testing.T) {
	f := newFixture(t, service.Config{})
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "", Descriptors: req(desc("user", "a")).Descriptors},
		req(desc("user", strings.Repeat("v", wire.MaxValueLen+1))),
		req(withHits(desc("user", "a"), service.MaxHitsAddend+1)),
	} {
		_, want := f.svc.ShouldRateLimit(t.Context(), r)
		_, err := f.svc.Explain(t.Context(), r)
		if err == nil || want == nil || !strings.Contains(want.Error(), err.Error()) {
			t.Errorf("Explain = %v, want the refusal of a decision: %v", err, want)
		}
	}
}

// TestExplainHandler: POST /api/v1/explain takes /json's request and
// answers the explanation; a bad request is 400, a body past the bound
// 413, another method 405.
func TestExplainHandler(t *testing.T) {
	f := newFixture(t, service.Config{})
	srv := httptest.NewServer(f.svc.ExplainHandler(1024))
	t.Cleanup(srv.Close)
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post(`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`)
	var x service.Explanation
	if err := json.Unmarshal([]byte(body), &x); code != http.StatusOK || err != nil || x.Descriptors[0].Rule != "test.user" || x.OverallCode != "OK" {
		t.Errorf("explain: %d %s", code, body)
	}
	for _, tt := range []struct {
		body string
		want int
	}{
		{`{"domain":"","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`, http.StatusBadRequest},
		{`{"domain":`, http.StatusBadRequest},
		{`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"` + strings.Repeat("v", 2000) + `"}]}]}`, http.StatusRequestEntityTooLarge},
	} {
		if code, body := post(tt.body); code != tt.want {
			t.Errorf("POST %.60s = %d %s, want %d", tt.body, code, body, tt.want)
		}
	}
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET = %d, want 405", resp.StatusCode)
	}
}
