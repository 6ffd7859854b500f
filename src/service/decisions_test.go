package service_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

// decisions returns the decision counters by "domain/code".
func (f *fixture) decisions() map[string]uint64 {
	out := map[string]uint64{}
	for name, v := range f.reg.Snapshot() {
		rest, ok := strings.CutPrefix(name, "ratelimit.service.decisions.__code=")
		if !ok {
			continue
		}
		code, domain, _ := strings.Cut(rest, ".__domain=")
		out[domain+"/"+code] = v
	}
	return out
}

// TestDecisionsByDomainAndCode: every call answered is counted once by
// domain and code, gRPC and /json alike; a domain the rules do not name
// is counted as _unknown, so clients cannot add series; a reload adds the
// new domains. A configured domain's series appear at its first call (a
// snapshot of 45,000 idle domains made 90,000 series), OK and OVER_LIMIT
// together; _unknown's are there from the start.
func TestDecisionsByDomainAndCode(t *testing.T) {
	f := newFixture(t, service.Config{})
	if got := f.decisions(); len(got) != 2 || got["_unknown/OK"] != 0 || got["_unknown/OVER_LIMIT"] != 0 {
		t.Errorf("before any call: %v, want OK and OVER_LIMIT at 0 for _unknown only", got)
	}
	for range 4 {
		f.call(t, req(desc("user", "alice"))) // 3 OK, then OVER_LIMIT
	}
	for i := range 50 {
		r := req(desc("user", "bob"))
		r.Domain = fmt.Sprintf("invented-%d", i)
		f.call(t, r)
	}
	if _, err := f.svc.ShouldRateLimit(context.Background(), req()); err == nil {
		t.Fatal("a request without descriptors was answered")
	}
	rec := httptest.NewRecorder()
	f.svc.ServeJSON(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"carol"}]}]}`)))
	if rec.Code != http.StatusOK {
		t.Fatalf("/json = %d", rec.Code)
	}
	want := map[string]uint64{
		"test/OK": 4, "test/OVER_LIMIT": 1, "test/INVALID_ARGUMENT": 1,
		"_unknown/OK": 50, "_unknown/OVER_LIMIT": 0,
	}
	if got := f.decisions(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decisions = %v, want %v", got, want)
	}

	rc, err := rules.Parse([]rules.File{{Name: "web.yaml", Data: []byte("domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	r := req(desc("user", "alice"))
	r.Domain = "web"
	f.call(t, r)
	f.call(t, req(desc("user", "alice"))) // test is no longer configured
	got := f.decisions()
	if got["web/OK"] != 1 || got["_unknown/OK"] != 51 || got["test/OK"] != 4 {
		t.Errorf("after a reload: %v, want web/OK 1, _unknown/OK 51, test/OK kept at 4", got)
	}
}

// Counting a decision allocates nothing once its counter exists.
func TestDecisionCountAllocs(t *testing.T) {
	f := newFixture(t, service.Config{})
	r := req(desc("user", "alice"))
	f.call(t, r)
	if n := testing.AllocsPerRun(100, func() { service.CountDecision(f.svc, "test", true) }); n != 0 {
		t.Errorf("counting a decision: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { service.CountDecision(f.svc, "invented", false) }); n != 0 {
		t.Errorf("counting a decision of an unknown domain: %v allocations, want 0", n)
	}
}

// The /json timer times every call; the gRPC one, one in eight.
func TestJSONResponseTime(t *testing.T) {
	f := newFixture(t, service.Config{ResponseTime: true})
	for range 3 {
		rec := httptest.NewRecorder()
		f.svc.ServeJSON(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"test","descriptors":[{"entries":[{"key":"ip","value":"a"}]}]}`)))
	}
	if got := f.reg.Timer("ratelimit_server.json.response_time").Count(); got != 3 {
		t.Errorf("json response_time counted %d, want 3", got)
	}
	if got := f.reg.Timer("ratelimit_server.ShouldRateLimit.response_time").Count(); got != 0 {
		t.Errorf("gRPC response_time counted %d /json calls, want 0", got)
	}
	if got := f.reg.Snapshot()["ratelimit_server.ShouldRateLimit.total_requests"]; got != 3 {
		t.Errorf("total_requests = %d, want 3 (/json calls count, as before)", got)
	}
}
