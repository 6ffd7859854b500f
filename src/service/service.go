// Package service implements Envoy's RateLimitService v3 (ShouldRateLimit)
// and its JSON form. It validates requests, matches descriptors against the
// current rules, asks the limiter for decisions and turns them into the
// response, statistics and gRPC codes. It is the only package that maps
// errors to gRPC codes and HTTP statuses; it knows no concrete store.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// Request bounds. Envoy sends a handful of descriptors of a few entries;
// these bounds stop absurd or hostile requests before they cost memory or
// reach a store. A request past one is refused with InvalidArgument and the
// reason (the README's "Limits and hostile input" lists them).
const (
	MaxDomainLen          = 256
	MaxDescriptors        = 256
	MaxEntriesPerDescribe = 64
	MaxKeyLen             = 256
	MaxValueLen           = 4096
	// MaxHitsAddend is the largest hits_addend of a descriptor (the
	// request's own is a uint32 in the proto): every store counts that
	// exactly, and a larger value could wrap a store's counter.
	MaxHitsAddend = limiter.MaxHits
	// MaxOverrideWindow is the longest window a per-request limit
	// override may ask for: one YEAR (365 days), the longest unit. Longer
	// windows (YEAR × 4294967295 is centuries) would make state that never
	// expires.
	MaxOverrideWindow = 365 * 24 * time.Hour
)

// ErrNoRules is returned while no valid rules have been loaded
// (FORCE_START_WITHOUT_INITIAL_CONFIG); it maps to codes.Unavailable.
var ErrNoRules = errors.New("service: no rate limit configuration loaded")

// Headers configures the rate-limit response headers (LIMIT_RESPONSE_HEADERS_ENABLED).
type Headers struct {
	Enabled   bool
	Limit     string // default "RateLimit-Limit"
	Remaining string // default "RateLimit-Remaining"
	Reset     string // default "RateLimit-Reset"
}

// Config tunes a Service. The zero value serves with no global modes, no
// headers and no backend budget beyond the caller's deadline.
type Config struct {
	// GlobalShadowMode answers OK overall even when a descriptor is over its
	// limit (SHADOW_MODE); per-descriptor statuses are unchanged.
	GlobalShadowMode bool
	// GlobalQuotaMode treats every rule as quota_mode (QUOTA_MODE).
	GlobalQuotaMode bool
	Headers         Headers
	// DynamicMetadata adds the request summary to dynamic_metadata
	// (RESPONSE_DYNAMIC_METADATA).
	DynamicMetadata bool
	// Timeout is the backend budget of one request (REQUEST_TIMEOUT): the
	// store's work ends by the caller's deadline or after Timeout, whichever
	// comes first. 0 means only the caller's deadline applies.
	Timeout time.Duration
	// MaxConcurrent bounds the decisions in flight, gRPC and /json together
	// (MAX_CONCURRENT_REQUESTS); a request beyond it is refused at once with
	// ResourceExhausted and counted as load_shed. 0 means no bound.
	MaxConcurrent int
	// MaxDynamicStatKeys bounds the statistics keys made from request data
	// (detailed_metric, value_to_metric, limit overrides:
	// STATS_MAX_DYNAMIC_KEYS). Past it, their hits count under the domain's
	// overflow key. 0 means 1000.
	MaxDynamicStatKeys int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives errors worth an operator's attention; nil discards them.
	Log *slog.Logger
}

// Service answers ShouldRateLimit. It is safe for concurrent use; rules are
// swapped whole with SetRules while requests are served.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg     Config
	limiter *limiter.Limiter
	rules   atomic.Pointer[rules.Config]
	stats   *stats.Registry

	ruleStats   sync.Map     // stat key -> *ruleCounters
	dynamicKeys atomic.Int64 // stat keys made from request data (see dynamicCounters)
	inFlight    atomic.Int64 // decisions under way (Config.MaxConcurrent)
	protoLimits sync.Map     // *rules.Limit -> *rlsv3.RateLimitResponse_RateLimit
	scratch     sync.Pool

	storeErrors   *stats.Counter
	serviceErrors *stats.Counter
	loadShed      *stats.Counter
	// statKeysOverflow counts hits of request-made statistics keys
	// counted under a domain's overflow key (Config.MaxDynamicStatKeys).
	statKeysOverflow *stats.Counter
	globalShadow     *stats.Counter
	totalRequests    *stats.Counter
}

// New returns a Service that decides with l and counts into reg. It answers
// Unavailable until SetRules is called.
func New(l *limiter.Limiter, reg *stats.Registry, cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxDynamicStatKeys <= 0 {
		cfg.MaxDynamicStatKeys = defaultMaxDynamicStatKeys
	}
	if cfg.Headers.Limit == "" {
		cfg.Headers.Limit = "RateLimit-Limit"
	}
	if cfg.Headers.Remaining == "" {
		cfg.Headers.Remaining = "RateLimit-Remaining"
	}
	if cfg.Headers.Reset == "" {
		cfg.Headers.Reset = "RateLimit-Reset"
	}
	return &Service{
		cfg:           cfg,
		limiter:       l,
		stats:         reg,
		storeErrors:   reg.Counter("ratelimit.service.call.should_rate_limit.redis_error"),
		serviceErrors: reg.Counter("ratelimit.service.call.should_rate_limit.service_error"),
		loadShed:      reg.Counter("ratelimit.service.call.should_rate_limit.load_shed"),

		statKeysOverflow: reg.Counter("ratelimit.service.stats_keys_overflow"),
		globalShadow:     reg.Counter("ratelimit.service.global_shadow_mode"),
		totalRequests:    reg.Counter("ratelimit_server.ShouldRateLimit.total_requests"),
	}
}

// SetRules publishes a new rule tree; requests already running keep the one
// they started with.
func (s *Service) SetRules(c *rules.Config) {
	s.rules.Store(c)
	s.protoLimits.Clear()
}

// Rules returns the rule tree in use, or nil before the first SetRules.
func (s *Service) Rules() *rules.Config { return s.rules.Load() }

// requestError is a bad request; it maps to codes.InvalidArgument.
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

// scratch is per-request working memory, pooled so that the hot path does
// not allocate it each time.
type scratch struct {
	descs    []limiter.Descriptor
	statuses []limiter.Status
	entries  []rules.Entry
	counters []*ruleCounters
	quota    []bool
	unlim    []bool
}

func (s *Service) getScratch(n, entries int) *scratch {
	sc, _ := s.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	sc.descs = grow(sc.descs, n)
	sc.statuses = grow(sc.statuses, n)
	sc.counters = grow(sc.counters, n)
	sc.quota = grow(sc.quota, n)
	sc.unlim = grow(sc.unlim, n)
	if cap(sc.entries) < entries {
		sc.entries = make([]rules.Entry, 0, entries)
	}
	sc.entries = sc.entries[:0]
	return sc
}

func (s *Service) putScratch(sc *scratch) {
	clear(sc.descs)
	clear(sc.entries[:cap(sc.entries)])
	clear(sc.counters)
	s.scratch.Put(sc)
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// ShouldRateLimit implements the RLS v3 call.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.totalRequests.Inc()
	resp, err := s.decide(ctx, req)
	if err != nil {
		return nil, s.toStatus(err)
	}
	return resp, nil
}

// toStatus maps an error to its gRPC status, counting and logging the ones
// that are not the caller's fault.
func (s *Service) toStatus(err error) error {
	var re *requestError
	switch {
	case errors.As(err, &re):
		return status.Error(codes.InvalidArgument, re.msg)
	case errors.Is(err, ErrNoRules):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		s.storeErrors.Inc()
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, limiter.ErrOverloaded):
		s.loadShed.Inc()
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, limiter.ErrUnavailable):
		s.storeErrors.Inc()
		s.cfg.Log.Warn("store unavailable", "err", err)
		return status.Error(codes.Unavailable, err.Error())
	default:
		s.serviceErrors.Inc()
		s.cfg.Log.Error("rate limit decision failed", "err", err)
		return status.Error(codes.Internal, err.Error())
	}
}

func validate(req *rlsv3.RateLimitRequest) error {
	if msg, bad := malformed(req); bad {
		return badRequest("invalid RateLimitRequest: %s", msg)
	}
	domain := req.GetDomain()
	if domain == "" {
		return badRequest("rate limit domain must not be empty")
	}
	if len(domain) > MaxDomainLen {
		return badRequest("rate limit domain is %d bytes long, the limit is %d", len(domain), MaxDomainLen)
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return badRequest("rate limit descriptor list must not be empty")
	}
	if len(descs) > MaxDescriptors {
		return badRequest("request has %d descriptors, the limit is %d", len(descs), MaxDescriptors)
	}
	for i, d := range descs {
		// A descriptor without entries is answered OK without a limit, as
		// envoyproxy/ratelimit does: clients other than Envoy send them.
		entries := d.GetEntries()
		if len(entries) > MaxEntriesPerDescribe {
			return badRequest("descriptor %d has %d entries, the limit is %d", i, len(entries), MaxEntriesPerDescribe)
		}
		for j, e := range entries {
			if e.GetKey() == "" {
				return badRequest("descriptor %d entry %d has an empty key", i, j)
			}
			if len(e.GetKey()) > MaxKeyLen {
				return badRequest("descriptor %d entry %d: key is %d bytes long, the limit is %d", i, j, len(e.GetKey()), MaxKeyLen)
			}
			if len(e.GetValue()) > MaxValueLen {
				return badRequest("descriptor %d entry %d: value is %d bytes long, the limit is %d", i, j, len(e.GetValue()), MaxValueLen)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > MaxHitsAddend {
			return badRequest("descriptor %d: hits_addend %d is over the limit of %d", i, h.GetValue(), uint64(MaxHitsAddend))
		}
		if o := d.GetLimit(); o != nil {
			unit := rules.Unit(o.GetUnit())
			if unit.Seconds() == 0 { // UNKNOWN or out of range
				return badRequest("descriptor %d: limit override has unit %s", i, o.GetUnit())
			}
			mult := uint64(1)
			if m := o.GetUnitMultiplier(); m != nil {
				if mult = uint64(m.GetValue()); mult == 0 {
					return badRequest("descriptor %d: limit override has unit_multiplier 0", i)
				}
			}
			// At most 3.2e7 s × 4.3e9: no overflow in seconds.
			if secs := unit.Seconds() * int64(mult); secs > int64(MaxOverrideWindow/time.Second) {
				return badRequest("descriptor %d: limit override window %s × %d is longer than the limit of one YEAR", i, o.GetUnit(), mult)
			}
		}
		if d.GetIsNegativeHits() {
			return badRequest("descriptor %d: is_negative_hits is not supported", i)
		}
	}
	return nil
}

func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	cfg := s.rules.Load()
	if cfg == nil {
		return nil, ErrNoRules
	}
	domain := req.GetDomain()
	reqDescs := req.GetDescriptors()
	requestHits := uint64(req.GetHitsAddend())
	if requestHits == 0 {
		requestHits = 1
	}

	total := 0
	for _, d := range reqDescs {
		total += len(d.GetEntries())
	}
	sc := s.getScratch(len(reqDescs), total)
	defer s.putScratch(sc)

	var replacing map[string]struct{}
	for i, d := range reqDescs {
		start := len(sc.entries)
		for _, e := range d.GetEntries() {
			sc.entries = append(sc.entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		entries := sc.entries[start:len(sc.entries):len(sc.entries)]
		hits := requestHits
		if h := d.GetHitsAddend(); h != nil {
			hits = h.GetValue()
		}
		ld := &sc.descs[i]
		ld.Entries = entries
		ld.Hits = hits
		if o := d.GetLimit(); o != nil {
			// As in envoyproxy/ratelimit, an override applies only in a
			// configured domain: a migration must not start limiting
			// traffic that was never limited. Without entries there is
			// nothing to key it on.
			if len(entries) == 0 || !cfg.HasDomain(domain) {
				continue
			}
			ld.Limit = overrideLimit(domain, entries, o)
			sc.counters[i] = s.overrideCounters(domain, entries)
			continue
		}
		m := cfg.Match(domain, entries)
		if m.Limit == nil {
			continue
		}
		if m.Limit.Unlimited {
			sc.unlim[i] = true
			continue
		}
		ld.Limit = m.Limit
		sc.counters[i] = s.matchCounters(&m)
		if m.KeyEntries != nil {
			ld.Entries = m.KeyEntries
		}
		if len(m.Limit.Replaces) > 0 {
			if replacing == nil {
				replacing = map[string]struct{}{}
			}
			for _, r := range m.Limit.Replaces {
				replacing[r] = struct{}{}
			}
		}
	}
	if replacing != nil {
		for i := range sc.descs {
			if l := sc.descs[i].Limit; l != nil && l.Name != "" {
				if _, ok := replacing[l.Name]; ok {
					sc.descs[i].Limit = nil
				}
			}
		}
	}

	now := s.cfg.Now()
	if s.cfg.Timeout > 0 {
		// The budget: the caller's deadline or Timeout, whichever is
		// first. Envoy sends its filter timeout as the deadline; when that
		// is the sooner, no timer is needed.
		if dl, ok := ctx.Deadline(); !ok || dl.After(time.Now().Add(s.cfg.Timeout)) {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
			defer cancel()
		}
	}
	if err := s.limiter.Check(ctx, domain, now, sc.descs, sc.statuses); err != nil {
		return nil, err
	}

	resp, backing := newResponse(len(reqDescs))
	var (
		limitedOver     bool
		quotaRules      int
		quotaOver       int
		quotaViolations []int
		minStatus       *rlsv3.RateLimitResponse_DescriptorStatus
		minReset        time.Duration
		passedMetadata  []map[string]any
	)
	for i := range sc.descs {
		st := &backing[i].status
		st.Code = rlsv3.RateLimitResponse_OK
		l := sc.descs[i].Limit
		if l == nil {
			if sc.unlim[i] {
				st.LimitRemaining = math.MaxUint32
			}
			continue
		}
		ds := &sc.statuses[i]
		sc.counters[i].add(&ds.Counts)
		st.CurrentLimit = s.protoLimit(l)
		st.LimitRemaining = ds.Remaining
		st.DurationUntilReset = setDuration(&backing[i].reset, resetDuration(l, ds.ResetAfter))
		quota := l.QuotaMode || s.cfg.GlobalQuotaMode
		if quota {
			quotaRules++
		}
		if ds.Code == limiter.OverLimit {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if quota {
				quotaOver++
				quotaViolations = append(quotaViolations, i)
			} else {
				limitedOver = true
			}
		} else if len(l.Metadata) > 0 && s.cfg.DynamicMetadata {
			passedMetadata = append(passedMetadata, l.Metadata)
		}
		if s.cfg.Headers.Enabled && (minStatus == nil || st.LimitRemaining < minStatus.LimitRemaining) {
			minStatus = st
			minReset = ds.ResetAfter
		}
	}
	if limitedOver || (quotaRules > 0 && quotaOver == quotaRules) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		if s.cfg.GlobalShadowMode {
			resp.OverallCode = rlsv3.RateLimitResponse_OK
			s.globalShadow.Inc()
		}
	}
	if minStatus != nil {
		resp.ResponseHeadersToAdd = s.headers(minStatus, minReset)
	}
	if s.cfg.DynamicMetadata {
		md, err := dynamicMetadata(req, quotaRules > 0, quotaViolations, passedMetadata)
		if err != nil {
			return nil, err
		}
		resp.DynamicMetadata = md
	}
	return resp, nil
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

// newResponse returns an OK response whose Statuses point into the
// returned slots, one per descriptor.
func newResponse(n int) (*rlsv3.RateLimitResponse, []statusSlot) {
	var (
		resp  *rlsv3.RateLimitResponse
		slots []statusSlot
	)
	if n == 1 {
		one := &oneStatusResponse{}
		resp, slots = &one.resp, one.slot[:]
		resp.Statuses = one.ptrs[:]
	} else {
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

// overrideLimit builds the limit a descriptor carries itself (Envoy's
// per-route limit override). Overrides are never in shadow mode; their hits
// are counted per key path, never per value (see overrideCounters).
func overrideLimit(domain string, entries []rules.Entry, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *rules.Limit {
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = m.GetValue()
	}
	return &rules.Limit{
		Domain:          domain,
		RequestsPerUnit: o.GetRequestsPerUnit(),
		Unit:            rules.Unit(o.GetUnit()),
		UnitMultiplier:  mult,
	}
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

// headers describes the descriptor closest to its limit, as envoyproxy/ratelimit does.
func (s *Service) headers(st *rlsv3.RateLimitResponse_DescriptorStatus, reset time.Duration) []*corev3.HeaderValue {
	secs := int64((reset + time.Second - 1) / time.Second)
	return []*corev3.HeaderValue{
		{Key: s.cfg.Headers.Limit, Value: formatUint(uint64(st.GetCurrentLimit().GetRequestsPerUnit()))},
		{Key: s.cfg.Headers.Remaining, Value: formatUint(uint64(st.GetLimitRemaining()))},
		{Key: s.cfg.Headers.Reset, Value: formatUint(uint64(max(secs, 0)))},
	}
}

// resetDuration is the duration_until_reset of a status. Fixed windows are
// reported in whole seconds, rounded up, which equals envoyproxy/ratelimit's
// "unit - now % unit"; the other algorithms report their exact value.
func resetDuration(l *rules.Limit, d time.Duration) time.Duration {
	if l.Algorithm == rules.FixedWindow {
		return (d + time.Second - 1) / time.Second * time.Second
	}
	return d
}
