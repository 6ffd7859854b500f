package service_test

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

const answerRules = `
domain: test
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: sl
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket, burst: 5}
  - key: tier
    value: gold
    rate_limit: {name: gold_tier, unit: hour, requests_per_unit: 100}
  - key: path
    value: "/a\"b"
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 2, unit_multiplier: 30}
`

func newAnswerFixture(t *testing.T, h service.Headers) *fixture {
	t.Helper()
	f := newFixture(t, service.Config{Headers: h})
	rc, err := rules.Parse([]rules.File{{Name: "a.yaml", Data: []byte(answerRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	return f
}

func headerMap(hs []*corev3.HeaderValue) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

// The IETF pair for every algorithm, 15 s into a minute, after one hit:
// each policy's quota and window, and its remaining quota and seconds to
// reset as the algorithm defines them (README's algorithm table).
func TestIETFHeaders(t *testing.T) {
	f := newAnswerFixture(t, service.Headers{Enabled: true, Style: service.HeadersIETF})
	resp := f.call(t, req(desc("fw", "a"), desc("sw", "a"), desc("sl", "a"), desc("tb", "a"),
		desc("tier", "gold"), desc("path", "/a\"b", "user", "u"), desc("nothing", "x"), desc("fw", "b")))
	got := headerMap(resp.GetResponseHeadersToAdd())
	want := map[string]string{
		"RateLimit-Policy": `"fw";q=3;w=60, "sw";q=3;w=60, "sl";q=3;w=60, "tb";q=3;w=60, "gold_tier";q=100;w=3600, "path_/a\"b.user";q=2;w=30, "fw#2";q=3;w=60`,
		// Fixed window: the window ends in 45 s. Sliding window: one more
		// fits now. Sliding log: the hit leaves in 60 s. Token bucket (a
		// token every 20 s): full again in 20 s. 30-second window at :15:
		// ends in 15 s; the hour ends in 2805 s.
		"RateLimit": `"fw";r=2;t=45, "sw";r=2;t=0, "sl";r=2;t=60, "tb";r=4;t=20, "gold_tier";r=99;t=2805, "path_/a\"b.user";r=1;t=15, "fw#2";r=2;t=45`,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s =\n  %s\nwant\n  %s", k, got[k], v)
		}
	}
	if len(got) != 2 {
		t.Errorf("headers %v, want only the IETF pair", got)
	}
	if len(resp.GetRequestHeadersToAdd()) != 0 {
		t.Errorf("request headers %v without LIMIT_REQUEST_HEADERS_ENABLED", resp.GetRequestHeadersToAdd())
	}
}

// The anchor's trio describes the descriptor closest to its limit.
func TestDraft03HeadersAndUpstream(t *testing.T) {
	f := newAnswerFixture(t, service.Headers{Enabled: true, Upstream: true})
	f.call(t, req(desc("tb", "a")))
	resp := f.call(t, req(desc("fw", "a"), desc("tb", "a")))
	want := map[string]string{"RateLimit-Limit": "3", "RateLimit-Remaining": "2", "RateLimit-Reset": "45"}
	got := headerMap(resp.GetResponseHeadersToAdd())
	up := headerMap(resp.GetRequestHeadersToAdd())
	for k, v := range want {
		if got[k] != v || up[k] != v {
			t.Errorf("%s = %q to the client and %q to the upstream, want %q", k, got[k], up[k], v)
		}
	}
}

// On OVER_LIMIT: Retry-After is when every descriptor over its limit
// admits again, and the body says what limited the request.
func TestOverLimitRetryAfterAndBody(t *testing.T) {
	f := newAnswerFixture(t, service.Headers{Enabled: true, Upstream: true, RetryAfter: true, Body: true})
	for range 3 {
		resp := f.call(t, req(desc("fw", "a")))
		if resp.GetRawBody() != nil || headerMap(resp.GetResponseHeadersToAdd())["Retry-After"] != "" {
			t.Fatalf("an allowed request carries a body or Retry-After: %v", resp)
		}
	}
	for range 5 {
		f.call(t, req(desc("sl", "a")))
	}
	f.advance(10 * time.Second) // 25 s into the minute
	resp := f.call(t, req(desc("sl", "a"), desc("fw", "a")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	got := headerMap(resp.GetResponseHeadersToAdd())
	// The log's oldest hit leaves in 50 s, the window ends in 35 s.
	if got["Retry-After"] != "50" {
		t.Errorf("Retry-After = %q, want 50", got["Retry-After"])
	}
	if got["Content-Type"] != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", got["Content-Type"])
	}
	if want := `{"domain":"test","rule":"sl","limit":3,"unit":"MINUTE","window_seconds":60,"retry_after_seconds":50}`; string(resp.GetRawBody()) != want {
		t.Errorf("body = %s\nwant %s", resp.GetRawBody(), want)
	}
	if len(resp.GetRequestHeadersToAdd()) != 0 {
		t.Errorf("a refused request sends headers to the upstream: %v", resp.GetRequestHeadersToAdd())
	}
	// Without the quota headers, Retry-After and the body still come.
	g := newAnswerFixture(t, service.Headers{RetryAfter: true})
	for range 4 {
		resp = g.call(t, req(desc("fw", "a")))
	}
	if got := headerMap(resp.GetResponseHeadersToAdd()); len(got) != 1 || got["Retry-After"] != "45" {
		t.Errorf("headers %v, want only Retry-After: 45", got)
	}
}

// Names are Structured Field strings whatever the rules hold.
func TestIETFPolicyNamesAreSFStrings(t *testing.T) {
	f := newFixture(t, service.Config{Headers: service.Headers{Enabled: true, Style: service.HeadersIETF}})
	rc, err := rules.Parse([]rules.File{{Name: "u.yaml", Data: []byte("domain: test\ndescriptors:\n  - key: k\n    value: \"café\\\\\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	resp := f.call(t, req(&ratelimitv3.RateLimitDescriptor{Entries: desc("k", "café\\").Entries}))
	if got := headerMap(resp.GetResponseHeadersToAdd())["RateLimit"]; got != `"k_caf__\\";r=0;t=1` {
		t.Errorf("RateLimit = %s", got)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		for _, c := range []byte(h.GetValue()) {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("%s holds byte %#x", h.GetKey(), c)
			}
		}
	}
}
