package service

import (
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// respond turns the limiter's statuses into the response: per-descriptor
// statuses, the overall code (shadow and quota modes), headers and dynamic
// metadata; and counts every descriptor's hits in its statistics and in
// the live view. now is the time of the decisions; degraded says the
// statuses come from Config.Fallback.
func (s *Service) respond(req *rlsv3.RateLimitRequest, sc *scratch, now time.Time, degraded bool) (*rlsv3.RateLimitResponse, error) {
	resp, backing := newResponse(len(sc.descs))
	var t tally
	for i := range sc.descs {
		s.respondOne(req, sc, &backing[i], i, now, &t)
	}
	if t.limitedOver || (t.quotaRules > 0 && t.quotaOver == t.quotaRules) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		if s.cfg.GlobalShadowMode {
			resp.OverallCode = rlsv3.RateLimitResponse_OK
			s.globalShadow.Inc()
		}
	}
	s.answer(resp, req, sc)
	switch {
	case s.cfg.DynamicMetadata:
		md, err := dynamicMetadata(req, t.passedMetadata, marks{degraded, t.shadowOver})
		if err != nil {
			return nil, err
		}
		resp.DynamicMetadata = md
	case degraded || t.shadowOver != nil:
		// Marked even without RESPONSE_DYNAMIC_METADATA: only
		// STORE_FAILURE_MODE=local and shadow limits make such marks,
		// and Envoy's access logs and routes can only tell them so.
		resp.DynamicMetadata = markMetadata(marks{degraded, t.shadowOver})
	}
	return resp, nil
}

// tally is what respond gathers over a request's descriptors for the
// overall code and the dynamic metadata.
type tally struct {
	limitedOver    bool
	quotaRules     int
	quotaOver      int
	passedMetadata []map[string]any
	shadowOver     []any // names of the shadow limits that would refuse
}

// respondOne fills the status of the i-th descriptor into slot, counts
// its hits in its statistics and the live view, and adds to t.
func (s *Service) respondOne(req *rlsv3.RateLimitRequest, sc *scratch, slot *statusSlot, i int, now time.Time, t *tally) {
	st := &slot.status
	st.Code = rlsv3.RateLimitResponse_OK
	l := sc.descs[i].Limit
	if l == nil {
		switch {
		case sc.unlim[i]:
			st.LimitRemaining = math.MaxUint32
		case s.cfg.GlobalQuotaMode:
			// A descriptor without a rule (or whose rule another
			// replaced) is a quota descriptor within its limit in
			// global quota mode, as in envoyproxy/ratelimit: the
			// request is denied only if a non-quota descriptor is over,
			// or every quota descriptor is.
			t.quotaRules++
		}
		return
	}
	ds := &sc.statuses[i]
	sc.counters[i].add(&ds.Counts)
	if sc.descs[i].Each != nil {
		s.countEach(req, sc, i, now, t)
	}
	// The limit that decided: the descriptor's, or one of its list.
	decided := ds.Limit
	if decided == nil {
		if l.InList() {
			// No limit of the list but shadow (or unlimited) ones
			// applied: answered as without them.
			if unlimitedLeft(&sc.descs[i]) {
				st.LimitRemaining = math.MaxUint32
			}
			return
		}
		decided = l
	}
	refund := sc.descs[i].Refund
	if s.cfg.Live != nil && !refund {
		// A list's decision counts under the limit that decided. A
		// refund decides nothing: the live view shows decisions.
		s.cfg.Live.Observe(req.GetDomain(), sc.descs[i].Entries, decided, ds, now)
	}
	if s.cfg.Observe != nil && !l.InList() {
		s.cfg.Observe(i, sc.descs[i].Entries, decided, ds)
	}
	st.CurrentLimit = s.protoLimit(decided)
	st.LimitRemaining = ds.Remaining
	st.DurationUntilReset = setDuration(&slot.reset, resetDuration(decided, ds.ResetAfter))
	// A refund asks for no quota: it is never one of the quota rules
	// whose refusal together makes the request OVER_LIMIT.
	quota := (l.QuotaMode || s.cfg.GlobalQuotaMode) && !refund
	if quota {
		t.quotaRules++
	}
	if ds.Code == limiter.OverLimit {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if quota {
			t.quotaOver++
		} else {
			t.limitedOver = true
		}
	} else if len(l.Metadata) > 0 && s.cfg.DynamicMetadata {
		t.passedMetadata = append(t.passedMetadata, l.Metadata)
	}
}

// countEach counts the hits of each limit of the i-th descriptor's list;
// a shadow limit, never the decision, is said apart, in the live view and
// in the dynamic metadata.
func (s *Service) countEach(req *rlsv3.RateLimitRequest, sc *scratch, i int, now time.Time, t *tally) {
	each, off := sc.descs[i].Each, sc.eachOff[i]
	for k := range each {
		if each[k].Limit == nil {
			continue
		}
		sc.eachCounters[off+k].add(&each[k].Counts)
		m := each[k].Limit
		if s.cfg.Observe != nil {
			s.cfg.Observe(i, sc.descs[i].Entries, m, &each[k])
		}
		if m.Shadow && !sc.descs[i].Refund {
			s.cfg.Live.Observe(req.GetDomain(), sc.descs[i].Entries, m, &each[k], now)
			if each[k].Code == limiter.OverLimit {
				t.shadowOver = append(t.shadowOver, shadowName(m))
			}
		}
	}
}

// shadowName names a shadow limit in the dynamic metadata: its rule's key
// and the limit's name or window, as its statistics and the live view name
// it ("web.user.strict"); from the rules, never from a request's values.
func shadowName(l *rules.Limit) string {
	return l.FullKey + "." + l.StatLevel
}

// unlimitedLeft reports whether a descriptor with a list has an
// unlimited limit that another rule did not replace: answered as an
// unlimited rule is when no other limit but shadow ones applied.
func unlimitedLeft(d *limiter.Descriptor) bool {
	for k, m := range d.Limit.Limits {
		if m.Unlimited && d.Skip&(1<<k) == 0 {
			return true
		}
	}
	return false
}

// statusSlot holds one descriptor's status and its duration, so that a
// response's parts come from as few allocations as possible.
type statusSlot struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	reset  durationpb.Duration
}

// oneStatusResponse is a response with room for one status: the common
// case, in a single allocation.
type oneStatusResponse struct {
	resp rlsv3.RateLimitResponse
	ptrs [1]*rlsv3.RateLimitResponse_DescriptorStatus
	slot [1]statusSlot
}

// threeStatusResponse is a response with room for up to three statuses,
// in a single allocation: Envoy's usual chain sends three descriptors
// (remote address, path, user).
type threeStatusResponse struct {
	resp rlsv3.RateLimitResponse
	ptrs [3]*rlsv3.RateLimitResponse_DescriptorStatus
	slot [3]statusSlot
}

// newResponse returns an OK response whose Statuses point into the
// returned slots, one per descriptor.
func newResponse(n int) (*rlsv3.RateLimitResponse, []statusSlot) {
	var (
		resp  *rlsv3.RateLimitResponse
		slots []statusSlot
	)
	switch {
	case n == 1:
		one := &oneStatusResponse{}
		resp, slots = &one.resp, one.slot[:]
		resp.Statuses = one.ptrs[:]
	case n == 2 || n == 3:
		three := &threeStatusResponse{}
		resp, slots = &three.resp, three.slot[:n]
		resp.Statuses = three.ptrs[:n]
	default:
		resp, slots = &rlsv3.RateLimitResponse{}, make([]statusSlot, n)
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range slots {
		resp.Statuses[i] = &slots[i].status
	}
	return resp, slots
}

// setDuration fills d with v and returns it, as durationpb.New would
// without allocating.
func setDuration(d *durationpb.Duration, v time.Duration) *durationpb.Duration {
	d.Seconds = int64(v / time.Second)
	d.Nanos = int32(v % time.Second)
	return d
}

// protoLimit returns the response form of l, built once per rule and shared
// by every response (protos are only read when marshalled).
func (s *Service) protoLimit(l *rules.Limit) *rlsv3.RateLimitResponse_RateLimit {
	if l.Source == "" { // an override: built per request anyway
		return newProtoLimit(l)
	}
	if p, ok := s.protoLimits.Load(l); ok {
		return p.(*rlsv3.RateLimitResponse_RateLimit)
	}
	p, _ := s.protoLimits.LoadOrStore(l, newProtoLimit(l))
	return p.(*rlsv3.RateLimitResponse_RateLimit)
}

func newProtoLimit(l *rules.Limit) *rlsv3.RateLimitResponse_RateLimit {
	p := &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name,
		RequestsPerUnit: l.RequestsPerUnit,
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit),
	}
	if l.UnitMultiplier > 1 {
		p.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
	}
	return p
}

// resetDuration is the duration_until_reset of a status. Fixed windows are
// reported in whole seconds, rounded up, which equals envoyproxy/ratelimit's
// "unit - now % unit"; the other algorithms report their exact value.
func resetDuration(l *rules.Limit, d time.Duration) time.Duration {
	if l.Algorithm.Windowed() {
		return (d + time.Second - 1) / time.Second * time.Second
	}
	return d
}
