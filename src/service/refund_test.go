package service_test

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

// refund is a descriptor of kv that gives hits back (is_negative_hits);
// hits < 0 leaves its hits_addend unset.
func refund(hits int, kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := desc(kv...)
	d.IsNegativeHits = true
	if hits >= 0 {
		d.HitsAddend = wrapperspb.UInt64(uint64(hits))
	}
	return d
}

// TestRefund: reserve, then give back. A refund is answered OK with the
// limit and what is left after it, even while the key is still over its
// limit; the hits it gives back are admitted again, and a refund of more
// than was spent frees no more than the limit. Its hits are counted in
// total_negative_hits only.
func TestRefund(t *testing.T) {
	f := newFixture(t, service.Config{})
	reserve := req(desc("user", "alice"))
	reserve.HitsAddend = 3
	if resp := f.call(t, reserve); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("reserve 3 of 3: %v, want OK", resp.GetOverallCode())
	}
	if resp := f.call(t, req(desc("user", "alice"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th hit: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	// 4 counted (the anchor's fixed window counts the refused hit): a
	// refund of 1 leaves the key over its limit, and is OK all the same.
	st := f.call(t, req(refund(1, "user", "alice"))).GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 || st.GetCurrentLimit().GetRequestsPerUnit() != 3 ||
		st.GetDurationUntilReset().AsDuration() <= 0 {
		t.Errorf("refund leaving the key at its limit: %v, want OK, nothing left, the limit and its reset", st)
	}
	// A refund without hits_addend gives back the request's, or 1.
	r := req(refund(-1, "user", "alice"))
	r.HitsAddend = 2
	if st := f.call(t, r).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 2 {
		t.Errorf("refund of the request's 2: %v, want OK with 2 left", st)
	}
	for i := range 2 {
		if resp := f.call(t, req(desc("user", "alice"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("hit %d after the refunds: %v, want OK", i+1, resp.GetOverallCode())
		}
	}
	if resp := f.call(t, req(refund(1000, "user", "alice"))); resp.GetStatuses()[0].GetLimitRemaining() != 3 {
		t.Errorf("refund of 1000: %v, want the whole limit left, no more", resp.GetStatuses()[0])
	}
	admitted := 0
	for range 5 {
		if f.call(t, req(desc("user", "alice"))).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("after a refund of more than was spent %d hits admitted, want the limit, 3", admitted)
	}
	snap := f.reg.Snapshot()
	for name, want := range map[string]uint64{
		"ratelimit.service.rate_limit.test.user.total_hits":          3 + 1 + 2 + 5,
		"ratelimit.service.rate_limit.test.user.total_negative_hits": 1 + 2 + 1000,
		"ratelimit.service.rate_limit.test.user.within_limit":        3 + 2 + 3,
	} {
		if snap[name] != want {
			t.Errorf("%s = %d, want %d", name, snap[name], want)
		}
	}
}

// TestRefundBesideOtherDescriptors: a refund's status is OK whatever the
// request's other descriptors say; the overall code is theirs; in quota
// mode a refund asks for no quota, so it does not keep a request whose
// quota descriptors are all over from being OVER_LIMIT.
func TestRefundBesideOtherDescriptors(t *testing.T) {
	f := newFixture(t, service.Config{})
	f.call(t, req(desc("quota_a", "x")))
	f.call(t, req(desc("quota_b", "x")))
	tests := []struct {
		name  string
		give  *rlsv3.RateLimitRequest
		codes []rlsv3.RateLimitResponse_Code
		want  rlsv3.RateLimitResponse_Code
	}{
		{"refund_beside_over", req(refund(1, "user", "bob"), desc("shadow", "x"), desc("quota_b", "x"), desc("user", "over"), desc("user", "over"), desc("user", "over"), desc("user", "over")),
			nil, rlsv3.RateLimitResponse_OVER_LIMIT},
		{"quota_refund_beside_quota_over", req(refund(1, "quota_a", "y"), desc("quota_b", "x")),
			[]rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}, rlsv3.RateLimitResponse_OVER_LIMIT},
		{"quota_refund_alone", req(refund(1, "quota_b", "x")),
			[]rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK}, rlsv3.RateLimitResponse_OK},
		{"shadow_mode_refund", req(refund(5, "shadow", "x")),
			[]rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK}, rlsv3.RateLimitResponse_OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := f.call(t, tt.give)
			if resp.GetOverallCode() != tt.want {
				t.Errorf("overall %v, want %v (%v)", resp.GetOverallCode(), tt.want, resp.GetStatuses())
			}
			if st := resp.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("the refund's status %v, want OK", st)
			}
			for i, want := range tt.codes {
				if got := resp.GetStatuses()[i].GetCode(); got != want {
					t.Errorf("descriptor %d: %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestRefundSlidingLogBudget: a refund writes no timestamps, so refunds
// of sliding_log rules are not held to MaxSlidingLogHits, while hits are.
func TestRefundSlidingLogBudget(t *testing.T) {
	f := newFixture(t, service.Config{})
	rc, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(`domain: test
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	over := uint64(service.MaxSlidingLogHits + 1)
	hit := req(desc("user", "a"))
	hit.Descriptors[0].HitsAddend = wrapperspb.UInt64(over)
	if _, err := f.svc.ShouldRateLimit(t.Context(), hit); err == nil {
		t.Errorf("%d hits on a sliding_log rule were decided, want InvalidArgument", over)
	}
	f.call(t, req(desc("user", "a")))
	if st := f.call(t, req(refund(int(over), "user", "a"))).GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 10 {
		t.Errorf("refund of %d: %v, want OK, the whole limit left", over, st)
	}
}

// TestRefundList: a refund gives back to every limit of a rate_limits
// list, and its status is that of the limit with the least left.
func TestRefundList(t *testing.T) {
	f := newFixture(t, service.Config{})
	rc, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(`domain: test
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 8, algorithm: token_bucket, name: hourly}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	for range 5 {
		f.call(t, req(desc("user", "u")))
	}
	st := f.call(t, req(refund(2, "user", "u"))).GetStatuses()[0]
	// minute: 5 - 2 = 3 in use, 2 left; hour: 3 in use, 5 left.
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 2 || st.GetCurrentLimit().GetRequestsPerUnit() != 5 {
		t.Errorf("refund of 2 on a list = %v, want OK, decided by the minute's limit with 2 left", st)
	}
	snap := f.reg.Snapshot()
	for _, name := range []string{"test.user", "test.user.minute", "test.user.hourly"} {
		if got := snap["ratelimit.service.rate_limit."+name+".total_negative_hits"]; got != 2 {
			t.Errorf("%s.total_negative_hits = %d, want 2", name, got)
		}
	}
}
