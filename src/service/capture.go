package service

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// captureRequest gives the capture that runs (Config.Capture) a decided
// request: what the client sent, when it was decided, and the answer. It
// is called only while a capture runs, so what it allocates costs nothing
// otherwise.
func (s *Service) captureRequest(req *rlsv3.RateLimitRequest, now time.Time, resp *rlsv3.RateLimitResponse, degraded bool) {
	descs := req.GetDescriptors()
	r := capture.Request{
		Time:        now,
		Domain:      req.GetDomain(),
		Hits:        req.GetHitsAddend(),
		Descriptors: make([]capture.Descriptor, len(descs)),
		OverLimit:   resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT,
		Codes:       make([]bool, len(descs)),
		Degraded:    degraded,
	}
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	entries := make([]rules.Entry, 0, n)
	for i, d := range descs {
		start := len(entries)
		for _, e := range d.GetEntries() {
			entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		cd := &r.Descriptors[i]
		cd.Entries = entries[start:len(entries):len(entries)]
		if h := d.GetHitsAddend(); h != nil {
			cd.HasHits, cd.Hits = true, h.GetValue()
		}
		cd.Refund = d.GetIsNegativeHits()
		if o := d.GetLimit(); o != nil {
			cd.Limit = &capture.Override{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: rules.Unit(o.GetUnit())}
			if m := o.GetUnitMultiplier(); m != nil {
				cd.Limit.UnitMultiplier = m.GetValue()
			}
		}
		r.Codes[i] = resp.GetStatuses()[i].GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	s.cfg.Capture.Record(&r)
}
