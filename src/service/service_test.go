package service_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/memory"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// epoch is a fixed instant 15 seconds into a minute.
var epoch = time.Unix(1_699_999_995, 0)

const testRules = `
domain: test
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tier
    value: basic
    rate_limit: {name: basic, unit: minute, requests_per_unit: 1}
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: basic}]}
  - key: path
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: backend
    value: a
    metadata: {service: svc-a, route: {zone: west}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: backend
    value: b
    metadata: {service: svc-b, route: {tier: gold}}
    rate_limit: {unit: minute, requests_per_unit: 5}
`

type fixture struct {
	svc   *service.Service
	reg   *stats.Registry
	clock atomic.Pointer[time.Time]
}

func newFixture(t testing.TB, cfg service.Config) *fixture {
	t.Helper()
	return newFixtureWithStore(t, cfg, nil)
}

func newFixtureWithStore(t testing.TB, cfg service.Config, store limiter.Store) *fixture {
	t.Helper()
	f := &fixture{reg: stats.NewRegistry()}
	now := epoch
	f.clock.Store(&now)
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return *f.clock.Load() }
	}
	if store == nil {
		m := memory.New(memory.Config{})
		t.Cleanup(m.Close)
		store = m
	}
	f.svc = service.New(limiter.New(store, limiter.Config{NearLimitRatio: 0.8}), f.reg, cfg)
	rc, err := rules.Parse([]rules.File{{Name: "test.yaml", Data: []byte(testRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	return f
}

func (f *fixture) advance(d time.Duration) {
	n := f.clock.Load().Add(d)
	f.clock.Store(&n)
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func req(descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "test", Descriptors: descs}
}

func (f *fixture) call(t *testing.T, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.svc.ShouldRateLimit(t.Context(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func TestFixedWindowCountsAndResets(t *testing.T) {
	f := newFixture(t, service.Config{})
	for i := 1; i <= 3; i++ {
		resp := f.call(t, req(desc("user", "alice")))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: overall %v, want OK", i, resp.GetOverallCode())
		}
		st := resp.GetStatuses()[0]
		if got, want := st.GetLimitRemaining(), uint32(3-i); got != want {
			t.Errorf("request %d: limit_remaining = %d, want %d", i, got, want)
		}
		if got := st.GetCurrentLimit(); got.GetRequestsPerUnit() != 3 || got.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("current_limit = %v, want 3 per MINUTE", got)
		}
		// 15 s into the minute: 45 s until the window ends, as the anchor computes it.
		if got := st.GetDurationUntilReset().AsDuration(); got != 45*time.Second {
			t.Errorf("duration_until_reset = %v, want 45s", got)
		}
	}
	resp := f.call(t, req(desc("user", "alice")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th request: %v, want OVER_LIMIT", resp)
	}
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 0 {
		t.Errorf("over limit: limit_remaining = %d, want 0", got)
	}
	// Another user has its own counter.
	if resp := f.call(t, req(desc("user", "bob"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("bob: %v, want OK", resp.GetOverallCode())
	}
	f.advance(45 * time.Second)
	if resp := f.call(t, req(desc("user", "alice"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("next window: %v, want OK", resp.GetOverallCode())
	}

	snap := f.reg.Snapshot()
	for name, want := range map[string]uint64{
		"ratelimit.service.rate_limit.test.user.total_hits":   6,
		"ratelimit.service.rate_limit.test.user.over_limit":   1,
		"ratelimit.service.rate_limit.test.user.within_limit": 5,
	} {
		if snap[name] != want {
			t.Errorf("%s = %d, want %d", name, snap[name], want)
		}
	}
}

func TestNoRuleAndUnknownDomainAreOK(t *testing.T) {
	f := newFixture(t, service.Config{})
	for _, r := range []*rlsv3.RateLimitRequest{
		req(desc("nothing", "here")),
		{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice")}},
		req(desc("path", "/a", "method", "GET", "extra", "x")), // longer than the tree
	} {
		resp := f.call(t, r)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("%v: overall %v, want OK", r, resp.GetOverallCode())
		}
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit() != nil || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("%v: status %v, want OK without a limit", r, st)
		}
	}
}

func TestUnlimited(t *testing.T) {
	f := newFixture(t, service.Config{})
	st := f.call(t, req(desc("free", "x"))).GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != math.MaxUint32 {
		t.Errorf("unlimited: %v, want OK with remaining MaxUint32", st)
	}
}

func TestNestedRule(t *testing.T) {
	f := newFixture(t, service.Config{})
	r := req(desc("path", "/a", "method", "GET"))
	f.call(t, r)
	f.call(t, r)
	if got := f.call(t, r).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("3rd request to a 2/s rule: %v, want OVER_LIMIT", got)
	}
}

func TestInvalidRequests(t *testing.T) {
	f := newFixture(t, service.Config{})
	many := make([]*ratelimitv3.RateLimitDescriptor, service.MaxDescriptors+1)
	for i := range many {
		many[i] = desc("user", "x")
	}
	tests := []struct {
		name string
		give *rlsv3.RateLimitRequest
		want string
	}{
		{"empty_domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "a")}}, "domain"},
		{"no_descriptors", &rlsv3.RateLimitRequest{Domain: "test"}, "descriptor"},
		{"empty_key", req(desc("", "a")), "empty key"},
		{"too_many_descriptors", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: many}, "limit is"},
		{"key_too_long", req(desc(strings.Repeat("k", wire.MaxKeyLen+1), "a")), "key is"},
		{"value_too_long", req(desc("user", strings.Repeat("v", wire.MaxValueLen+1))), "value is"},
		{"override_unit_unknown", req(&ratelimitv3.RateLimitDescriptor{
			Entries: desc("user", "a").Entries,
			Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_UNKNOWN},
		}), "unit"},
		// A refund is bounded as a hit is.
		{"refund_hits_over_bound", req(&ratelimitv3.RateLimitDescriptor{Entries: desc("user", "a").Entries, IsNegativeHits: true,
			HitsAddend: wrapperspb.UInt64(service.MaxHitsAddend + 1)}), "hits_addend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.svc.ShouldRateLimit(t.Context(), tt.give)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("ShouldRateLimit = %v, want InvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestNoRulesIsUnavailable(t *testing.T) {
	m := memory.New(memory.Config{})
	t.Cleanup(m.Close)
	svc := service.New(limiter.New(m, limiter.Config{}), stats.NewRegistry(), service.Config{})
	_, err := svc.ShouldRateLimit(t.Context(), req(desc("user", "a")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("without rules: %v, want Unavailable", err)
	}
}

func TestShadowMode(t *testing.T) {
	f := newFixture(t, service.Config{})
	f.call(t, req(desc("shadow", "a")))
	resp := f.call(t, req(desc("shadow", "a")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("shadow rule over its limit: %v, want OK", resp)
	}
	if got := f.reg.Snapshot()["ratelimit.service.rate_limit.test.shadow.shadow_mode"]; got != 1 {
		t.Errorf("shadow_mode counter = %d, want 1", got)
	}
}

func TestGlobalShadowModeChangesOnlyTheOverallCode(t *testing.T) {
	f := newFixture(t, service.Config{GlobalShadowMode: true})
	for range 3 {
		f.call(t, req(desc("user", "a")))
	}
	resp := f.call(t, req(desc("user", "a")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("overall = %v, want OK in global shadow mode", resp.GetOverallCode())
	}
	if resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("status = %v, want OVER_LIMIT kept", resp.GetStatuses()[0].GetCode())
	}
	if got := f.reg.Snapshot()["ratelimit.service.global_shadow_mode"]; got != 1 {
		t.Errorf("global_shadow_mode = %d, want 1", got)
	}
}

// TestQuotaMode is envoyproxy/ratelimit's quota mode as its current code
// has it (#1059, #1112): a quota descriptor over its limit says OVER_LIMIT
// in its own status, and the request is denied only when a non-quota
// descriptor is over or every quota descriptor is; the dynamic metadata
// has no quota keys (quotaModeEnabled and quotaModeViolations went with
// #1112) and carries the rule metadata of the descriptors within their
// limit.
func TestQuotaMode(t *testing.T) {
	f := newFixture(t, service.Config{DynamicMetadata: true})
	both := req(desc("quota_a", "x"), desc("quota_b", "x"), desc("backend", "b"))
	f.call(t, req(desc("quota_a", "x"))) // uses quota_a's only unit
	if got := f.call(t, req(desc("quota_a", "x"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the only quota rule over: overall %v, want OVER_LIMIT", got)
	}
	resp := f.call(t, both)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("one of two quota rules over: overall %v, want OK", resp.GetOverallCode())
	}
	if got := resp.GetStatuses()[0].GetCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("quota_a status = %v, want OVER_LIMIT", got)
	}
	md := resp.GetDynamicMetadata().AsMap()
	for _, k := range []string{"quotaModeEnabled", "quotaModeViolations"} {
		if v, ok := md[k]; ok {
			t.Errorf("dynamic metadata %s = %v; envoyproxy/ratelimit no longer sends it", k, v)
		}
	}
	if rule, _ := md["metadata"].(map[string]any); md["domain"] != "test" || rule["service"] != "svc-b" {
		t.Errorf("dynamic metadata = %v, want domain test and backend b's metadata", md)
	}
	// Now both are over: the request is denied.
	if got := f.call(t, both).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("all quota rules over: overall %v, want OVER_LIMIT", got)
	}
}

// TestGlobalQuotaMode: with QUOTA_MODE every descriptor is a quota
// descriptor, those without a rule too, within their limit, as in
// envoyproxy/ratelimit: one over its limit beside one without a rule is
// let through.
func TestGlobalQuotaMode(t *testing.T) {
	f := newFixture(t, service.Config{GlobalQuotaMode: true})
	for range 3 {
		f.call(t, req(desc("user", "a")))
	}
	if got := f.call(t, req(desc("user", "a"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the only descriptor over: overall %v, want OVER_LIMIT", got)
	}
	resp := f.call(t, req(desc("user", "a"), desc("no_rule", "x")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("over beside a descriptor without a rule: overall %v, status %v; want OK and OVER_LIMIT",
			resp.GetOverallCode(), resp.GetStatuses()[0].GetCode())
	}
}

func TestReplaces(t *testing.T) {
	f := newFixture(t, service.Config{})
	r := req(desc("tier", "basic"), desc("tier", "gold"))
	for i := range 5 {
		resp := f.call(t, r)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v; the gold rule replaces basic (1/min)", i, resp.GetOverallCode())
		}
		if resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Errorf("replaced descriptor reports a limit: %v", resp.GetStatuses()[0])
		}
	}
}

func TestHitsAddend(t *testing.T) {
	f := newFixture(t, service.Config{})
	r := req(desc("ip", "1"))
	r.HitsAddend = 0 // means 1
	if got := f.call(t, r).GetStatuses()[0].GetLimitRemaining(); got != 9 {
		t.Errorf("hits_addend 0: remaining %d, want 9", got)
	}
	r.HitsAddend = 4
	if got := f.call(t, r).GetStatuses()[0].GetLimitRemaining(); got != 5 {
		t.Errorf("hits_addend 4: remaining %d, want 5", got)
	}
	check := req(&ratelimitv3.RateLimitDescriptor{Entries: desc("ip", "1").Entries, HitsAddend: wrapperspb.UInt64(0)})
	for range 3 {
		if got := f.call(t, check).GetStatuses()[0].GetLimitRemaining(); got != 5 {
			t.Errorf("per-descriptor hits_addend 0 (check only): remaining %d, want 5", got)
		}
	}
	per := req(&ratelimitv3.RateLimitDescriptor{Entries: desc("ip", "1").Entries, HitsAddend: wrapperspb.UInt64(6)})
	per.HitsAddend = 1 // the descriptor's own value wins
	if got := f.call(t, per).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("per-descriptor hits_addend 6 on 5 remaining: %v, want OVER_LIMIT", got)
	}
}

func TestOverride(t *testing.T) {
	f := newFixture(t, service.Config{})
	over := func(n uint32) *rlsv3.RateLimitRequest {
		return req(&ratelimitv3.RateLimitDescriptor{
			Entries: desc("anything", "v").Entries,
			Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_HOUR},
		})
	}
	resp := f.call(t, over(2))
	st := resp.GetStatuses()[0]
	if st.GetCurrentLimit().GetRequestsPerUnit() != 2 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || st.GetLimitRemaining() != 1 {
		t.Errorf("override: %v, want 2/HOUR with 1 remaining", st)
	}
	f.call(t, over(2))
	if got := f.call(t, over(2)).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("third hit on an override of 2: %v, want OVER_LIMIT", got)
	}
	// Counted per key path, never per value.
	if got := f.reg.Snapshot()["ratelimit.service.rate_limit.test.anything.total_hits"]; got != 3 {
		t.Errorf("override stats total_hits = %d, want 3", got)
	}
}

func TestHeadersDescribeTheClosestDescriptor(t *testing.T) {
	f := newFixture(t, service.Config{Headers: service.Headers{Enabled: true}})
	resp := f.call(t, req(desc("ip", "1"), desc("user", "a"), desc("nothing", "x")))
	got := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		got[h.GetKey()] = h.GetValue()
	}
	want := map[string]string{"RateLimit-Limit": "3", "RateLimit-Remaining": "2", "RateLimit-Reset": "45"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if f2 := newFixture(t, service.Config{}); len(f2.call(t, req(desc("user", "a"))).GetResponseHeadersToAdd()) != 0 {
		t.Error("headers sent although disabled")
	}
}

func TestExactUnderConcurrency(t *testing.T) {
	f := newFixture(t, service.Config{})
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				resp, err := f.svc.ShouldRateLimit(context.Background(), req(desc("ip", "shared")))
				if err != nil {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Errorf("admitted %d of 3200 requests on a limit of 10, want exactly 10", ok.Load())
	}
}

// failingStore fails every batch with err.
type failingStore struct{ err error }

func (s failingStore) Do(context.Context, *limiter.Batch) error { return s.err }

func TestStoreErrorsMapToCodes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"unavailable", fmt.Errorf("redis: dial: %w", limiter.ErrUnavailable), codes.Unavailable},
		{"deadline", fmt.Errorf("redis: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"other", errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixtureWithStore(t, service.Config{}, failingStore{tt.err})
			_, err := f.svc.ShouldRateLimit(t.Context(), req(desc("user", "a")))
			if status.Code(err) != tt.want {
				t.Errorf("ShouldRateLimit = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	f := newFixture(t, service.Config{})
	post := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		f.svc.ServeJSON(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	body := `{"domain":"test","descriptors":[{"entries":[{"key":"shadow","value":"j"}]},{"entries":[{"key":"user","value":"json"}]}]}`
	code, out := post(body)
	if code != http.StatusOK || !strings.Contains(out, `"overallCode":"OK"`) {
		t.Errorf("first: %d %s, want 200 OK", code, out)
	}
	post(body)
	post(body)
	if code, out = post(body); code != http.StatusTooManyRequests || !strings.Contains(out, "OVER_LIMIT") {
		t.Errorf("fourth: %d %s, want 429 OVER_LIMIT", code, out)
	}
	if code, _ = post(`{"domain":`); code != http.StatusBadRequest {
		t.Errorf("malformed JSON: %d, want 400", code)
	}
	if code, _ = post(`{"domain":"","descriptors":[]}`); code != http.StatusBadRequest {
		t.Errorf("empty domain: %d, want 400", code)
	}
	rec := httptest.NewRecorder()
	f.svc.ServeJSON(rec, httptest.NewRequest(http.MethodGet, "/json", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /json: %d, want 405", rec.Code)
	}
}

func TestDynamicMetadataCarriesRuleMetadataOfPassingDescriptors(t *testing.T) {
	f := newFixture(t, service.Config{DynamicMetadata: true})
	r := req(desc("backend", "a"), desc("backend", "b"))
	md := f.call(t, r).GetDynamicMetadata().AsMap()
	meta, _ := md["metadata"].(map[string]any)
	route, _ := meta["route"].(map[string]any)
	if meta["service"] != "svc-a" || route["zone"] != "west" || route["tier"] != "gold" {
		t.Errorf("first call metadata = %v, want svc-a first and both routes merged", meta)
	}
	// backend=a is now over its limit of 1: only b's metadata is sent.
	md = f.call(t, r).GetDynamicMetadata().AsMap()
	meta, _ = md["metadata"].(map[string]any)
	if meta["service"] != "svc-b" {
		t.Errorf("second call metadata = %v, want only svc-b", meta)
	}
	if off := newFixture(t, service.Config{}); off.call(t, r).GetDynamicMetadata() != nil {
		t.Error("dynamic_metadata sent while RESPONSE_DYNAMIC_METADATA is off")
	}
}

// TestServiceLevelStatistics: the anchor's response-time timer counts one
// decision in eight as eight, and a domain that no rule names is counted per
// descriptor under <domain>.domain_not_found, within the bound of keys
// made from request data.
func TestServiceLevelStatistics(t *testing.T) {
	f := newFixture(t, service.Config{MaxDynamicStatKeys: 5, ResponseTime: true})
	f.call(t, req(desc("user", "alice")))
	for i := range 8 {
		r := req(desc("user", "alice"), desc("user", "bob"))
		r.Domain = fmt.Sprintf("unknown%d", i)
		f.call(t, r)
	}
	// Decisions 1 and 9 are timed, each standing for 8.
	if got := f.reg.Timer("ratelimit_server.ShouldRateLimit.response_time").Count(); got != 16 {
		t.Errorf("response_time counted %d decisions, want 16 (two timed, eight each)", got)
	}
	off := newFixture(t, service.Config{})
	off.call(t, req(desc("user", "alice")))
	if got := off.reg.Timer("ratelimit_server.ShouldRateLimit.response_time").Count(); got != 0 {
		t.Errorf("response_time counted %d decisions without Config.ResponseTime, want 0", got)
	}
	snap := f.reg.Snapshot()
	if got := snap["ratelimit.service.rate_limit.test.domain_not_found"]; got != 0 {
		t.Errorf("domain_not_found of a configured domain = %d, want 0", got)
	}
	if got := snap["ratelimit.service.rate_limit.unknown0.domain_not_found"]; got != 2 {
		t.Errorf("unknown0.domain_not_found = %d, want 2 (one per descriptor)", got)
	}
	if got := snap["ratelimit.service.rate_limit._overflow.domain_not_found"]; got != 6 {
		t.Errorf("_overflow.domain_not_found = %d, want 6 (3 domains past the bound of 5)", got)
	}
	n := 0
	for name := range snap {
		if strings.HasSuffix(name, ".domain_not_found") && !strings.Contains(name, "_overflow") {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d domain_not_found statistics, want 5 (the bound)", n)
	}
}
