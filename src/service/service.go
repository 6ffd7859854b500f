// Package service implements Envoy's RateLimitService v3 (ShouldRateLimit)
// and its JSON form, and Envoy's Rate Limit Quota Service (Quota: streams
// of usage reports answered with quota assignments that package quota
// computes). It validates requests, matches descriptors and bucket ids
// against the current rules, asks the limiter for decisions and turns them
// into the response, statistics and gRPC codes. It is the only package that
// maps errors to gRPC codes and HTTP statuses; it knows no concrete store.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// ErrNoRules is returned while no valid rules have been loaded
// (FORCE_START_WITHOUT_INITIAL_CONFIG); it maps to codes.Unavailable.
var ErrNoRules = errors.New("service: no rate limit configuration loaded")

// Headers configures what an answer tells the client and the upstream
// about their quota. The zero value adds nothing.
type Headers struct {
	// Enabled adds the quota headers to every answer
	// (LIMIT_RESPONSE_HEADERS_ENABLED), in Style.
	Enabled bool
	// Style is the headers' form (LIMIT_RESPONSE_HEADERS_STYLE): the
	// anchor's draft-03 trio (the default) or the IETF pair.
	Style HeaderStyle
	// Limit, Remaining and Reset name the draft-03 headers
	// (LIMIT_LIMIT_HEADER, ...; defaults RateLimit-Limit,
	// RateLimit-Remaining, RateLimit-Reset).
	Limit, Remaining, Reset string
	// Upstream also sends the quota headers to the upstream with an
	// allowed request, in request_headers_to_add
	// (LIMIT_REQUEST_HEADERS_ENABLED).
	Upstream bool
	// RetryAfter adds Retry-After, in seconds, to an OVER_LIMIT answer
	// (LIMIT_RESPONSE_RETRY_AFTER_ENABLED).
	RetryAfter bool
	// Body makes an OVER_LIMIT answer carry a JSON body, with its
	// Content-Type, which Envoy sends as the 429's body
	// (LIMIT_RESPONSE_BODY_ENABLED).
	Body bool
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
	// Timeout is the store's budget for a request whose caller sends no
	// deadline (/json, and gRPC clients without one): REQUEST_TIMEOUT. 0
	// means none: such a request waits for the store's own timeouts. A
	// request whose caller sends a deadline (Envoy sends its filter
	// timeout, 20 ms by default) gets that deadline less a margin (see
	// budget), so that its answer, an error included, leaves before the
	// caller gives up.
	Timeout time.Duration
	// Ceiling, when positive, bounds every request's budget, the caller's
	// deadline or not: REQUEST_TIMEOUT when the operator sets it, as
	// envoyproxy/ratelimit bounds every request by it. 0 lets a caller's
	// deadline, however long, be the budget.
	Ceiling time.Duration
	// Deadlines makes a caller's deadline, less a margin, the budget of its
	// request even with neither Timeout nor Ceiling, so that its answer
	// leaves before the caller gives up and a call whose time has run out
	// is shed (see budget); a request without a deadline then has no
	// budget. The server sets it for the stores that wait on the network.
	Deadlines bool
	// MaxConcurrent bounds the decisions in flight, gRPC and /json together
	// (MAX_CONCURRENT_REQUESTS); a request beyond it is refused at once with
	// ResourceExhausted and counted as load_shed. 0 means no bound.
	MaxConcurrent int
	// MaxDynamicStatKeys bounds the statistics keys made from request data
	// (detailed_metric, value_to_metric, limit overrides:
	// STATS_MAX_DYNAMIC_KEYS). Past it, their hits count under the domain's
	// overflow key. 0 means 1000.
	MaxDynamicStatKeys int
	// StatsExpiry is how long a statistics key that no rule in use names
	// may go without a hit before RunStatsExpiry drops it
	// (STATS_IDLE_EXPIRY); 0 means 10 minutes.
	StatsExpiry time.Duration
	// Fallback, when not nil, decides the requests that the store cannot
	// (STORE_FAILURE_MODE=local): when the limiter's error wraps
	// limiter.ErrUnavailable (the store is unreachable, its breaker open,
	// or the budget ran out waiting for it), the request is decided again
	// by Fallback, a limiter over this instance's own memory, with the
	// same rules. Such a response is marked "degraded" in its dynamic
	// metadata and counted in degraded_decisions. Errors about the data
	// (limiter.ErrData) and load shed (limiter.ErrOverloaded) are not
	// outages and are answered as without it. Nil (STORE_FAILURE_MODE=
	// error, the default) answers every store error with its code, and
	// Envoy's failure_mode_deny decides.
	Fallback *limiter.Limiter
	// ResponseTime records the decisions' durations in the timers
	// ratelimit_server.ShouldRateLimit.response_time (gRPC: one decision
	// in eight, counted eight times: the first, the ninth...) and
	// ratelimit_server.json.response_time (/json: every one). Statsd and
	// Prometheus read them; the server turns it off when neither is asked
	// for.
	ResponseTime bool
	// Tracer, when not nil, traces every decision (TRACING_ENABLED): one
	// span of kind server per ShouldRateLimit call or /json request, a
	// child of the caller's span when Propagator finds one in the gRPC
	// metadata or the HTTP headers, with the domain, the number of
	// descriptors and the outcome (never the descriptors themselves). The
	// span is in the context the limiter and the store get, so a store
	// can add its round trips as children. Nil, the default, adds no work
	// at all to a request: no lookup, no allocation.
	Tracer trace.Tracer
	// Propagator reads the caller's trace context with Tracer; nil reads
	// none, and every span starts a trace.
	Propagator propagation.TextMapPropagator
	// Live, when not nil, is told every decision, the store's round
	// trips and the rules in use, for the live view (LIVE_VIEW_ENABLED).
	// The round trips are timed from Now's readings: with a Now other
	// than the system clock their latencies mean nothing.
	Live *live.Recorder
	// Observe, when not nil, is told each descriptor's decision as it is
	// made (see Observer); ratelimit-check -replay reads decisions so.
	Observe Observer
	// Capture, when not nil, is given every request decided while a
	// capture runs (the debug listener's /api/v1/capture); while none
	// runs it costs a decision one atomic load.
	Capture *capture.Recorder
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives errors worth an operator's attention; nil discards them.
	Log *slog.Logger
}

// Observer is told what each limit that applied to a descriptor of a
// request said: the descriptor's place i in the request, its entries as
// the limit counted them, the limit (a descriptor's only limit, or each
// limit of its rate_limits list in turn, shadow limits included), and the
// limiter's status of that limit. Descriptors without a limit (no rule,
// unlimited, replaced) are not told. It runs on the request's goroutine,
// before the answer is returned, and must not keep entries or st.
type Observer func(i int, entries []rules.Entry, lim *rules.Limit, st *limiter.Status)

// Service answers ShouldRateLimit. It is safe for concurrent use; rules are
// swapped whole with SetRules while requests are served.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	cfg     Config
	limiter *limiter.Limiter
	rules   atomic.Pointer[rules.Config]
	stats   *stats.Registry

	ruleStats   sync.Map     // stat key -> *ruleCounters
	notFound    sync.Map     // domain -> *stats.Counter (see domainNotFound)
	dynamicKeys atomic.Int64 // stat keys made from request data (see dynamicCounters)
	inFlight    atomic.Int64 // decisions under way (Config.MaxConcurrent)
	load        loadMeter    // decisions finished per second (see overloaded)
	protoLimits sync.Map     // *rules.Limit -> *rlsv3.RateLimitResponse_RateLimit
	limitStats  sync.Map     // *rules.Limit of a list -> *ruleCounters (see limitCounters)
	scratch     sync.Pool

	storeErrors   *stats.Counter
	serviceErrors *stats.Counter
	// degraded counts the requests decided by Config.Fallback.
	degraded *stats.Counter
	loadShed *stats.Counter
	// statKeysOverflow counts hits of request-made statistics keys
	// counted under a domain's overflow key (Config.MaxDynamicStatKeys).
	statKeysOverflow *stats.Counter

	// unavailableLog, errorLog and degradedLog hold back log lines past
	// one a second; unknownDomainLog and noRuleLog too (unmatched.go).
	unavailableLog, errorLog, degradedLog wire.LogEvery
	unknownDomainLog, noRuleLog           wire.LogEvery
	globalShadow                          *stats.Counter
	totalRequests                         *stats.Counter
	// responseTime is the anchor's response-time timer, which it records
	// around each gRPC call, and jsonTime the same for /json. Nil without
	// Config.ResponseTime.
	responseTime, jsonTime *stats.Timer
	// decisions counts the calls answered, by domain and code (see
	// decisions.go); replaced whole by SetRules.
	decisions atomic.Pointer[decisionStats]
	// decisionDomains are the domains whose decision counters exist, for
	// their expiry; decisionDomainsMu guards it.
	decisionDomainsMu sync.Mutex
	decisionDomains   map[string]bool
	// expiry is the statistics sweep's memory (expire.go); only the
	// sweeping goroutine touches it.
	expiry expiry
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
	if cfg.StatsExpiry <= 0 {
		cfg.StatsExpiry = defaultStatsExpiry
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
	s := &Service{
		cfg:           cfg,
		limiter:       l,
		stats:         reg,
		storeErrors:   reg.Counter("ratelimit.service.call.should_rate_limit.redis_error"),
		serviceErrors: reg.Counter("ratelimit.service.call.should_rate_limit.service_error"),
		loadShed:      reg.Counter("ratelimit.service.call.should_rate_limit.load_shed"),
		degraded:      reg.Counter("ratelimit.service.degraded_decisions"),

		statKeysOverflow: reg.Counter("ratelimit.service.stats_keys_overflow"),
		globalShadow:     reg.Counter("ratelimit.service.global_shadow_mode"),
		totalRequests:    reg.Counter("ratelimit_server.ShouldRateLimit.total_requests"),
		responseTime:     responseTimer(reg, cfg.ResponseTime, "ShouldRateLimit"),
		jsonTime:         responseTimer(reg, cfg.ResponseTime, "json"),
	}
	s.decisions.Store(newDecisionStats(reg, nil))
	return s
}

// timerEvery is how many decisions one timed decision stands for.
const timerEvery = 8

// responseTimer is the response-time timer of method, named as the
// anchor names the gRPC method's, or nil when it is not asked for.
func responseTimer(reg *stats.Registry, on bool, method string) *stats.Timer {
	if !on {
		return nil
	}
	return reg.Timer("ratelimit_server." + method + ".response_time")
}

// SetRules publishes a new rule tree; requests already running keep the one
// they started with.
func (s *Service) SetRules(c *rules.Config) {
	s.decisions.Store(newDecisionStats(s.stats, c.Domains()))
	s.decisionDomainsMu.Lock()
	if s.decisionDomains == nil {
		s.decisionDomains = map[string]bool{}
	}
	for _, d := range c.Domains() {
		s.decisionDomains[d] = true
	}
	s.decisionDomainsMu.Unlock()
	// The live view first, so that it knows every rule a request can
	// match.
	s.cfg.Live.SetRules(c)
	s.rules.Store(c)
	s.protoLimits.Clear()
	s.limitStats.Clear()
}

// Rules returns the rule tree in use, or nil before the first SetRules.
func (s *Service) Rules() *rules.Config { return s.rules.Load() }

// scratch is per-request working memory, pooled so that the hot path does
// not allocate it each time.
type scratch struct {
	descs    []limiter.Descriptor
	statuses []limiter.Status
	entries  []rules.Entry
	counters []*ruleCounters
	quota    []bool
	unlim    []bool
	// For descriptors with several limits: each holds the limits'
	// statuses (descs[i].Each is each[eachOff[i]:]) and eachCounters
	// their statistics, in the same places.
	each         []limiter.Status
	eachCounters []*ruleCounters
	eachOff      []int
	// quiet matches without a side effect: no statistics, log line or
	// live view (Explain).
	quiet bool
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
	sc.eachOff = grow(sc.eachOff, n)
	sc.eachCounters = sc.eachCounters[:0]
	sc.quiet = false
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
	clear(sc.eachCounters)
	clear(sc.each)
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

// ShouldRateLimit implements the RLS v3 call. Its message has come: it
// takes a place among Config.MaxConcurrent decisions in flight (Tap
// refused the calls past the bound before their messages were read; a few
// let in at once may still find it reached here).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.cfg.MaxConcurrent > 0 {
		if !s.acquire() {
			return nil, s.shed()
		}
		defer s.release()
	}
	// One branch on a nil Tracer is all that tracing costs when it is off:
	// reading the metadata, extracting a context and starting a span
	// allocate, and would be paid by every request.
	if s.cfg.Tracer == nil {
		return s.shouldRateLimit(ctx, req)
	}
	ctx, span := s.startSpan(ctx, &incomingCarrier{ctx}, grpcSpanName, grpcAttributes)
	resp, err := s.shouldRateLimit(ctx, req)
	endSpan(span, req, resp, err)
	span.End()
	return resp, err
}

// shouldRateLimit is ShouldRateLimit after tracing, for gRPC and /json.
func (s *Service) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := s.totalRequests.IncValue()
	// One decision in timerEvery is timed and counts for timerEvery: the
	// clock read and the timer's shared buckets would otherwise cost a
	// tenth of a decision's CPU in the service (docs/BENCHMARKS.md).
	timed := s.responseTime != nil && n%timerEvery == 1
	var start time.Time
	if timed {
		start = time.Now()
	}
	resp, err := s.reply(ctx, req)
	if timed {
		s.responseTime.RecordN(time.Since(start), timerEvery)
	}
	return resp, err
}

// shouldRateLimitJSON is ShouldRateLimit for /json, timed in its own timer
// at every call: /json's own work (JSON in and out) dwarfs the clock's.
func (s *Service) shouldRateLimitJSON(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.totalRequests.Inc()
	if s.jsonTime == nil {
		return s.reply(ctx, req)
	}
	start := time.Now()
	resp, err := s.reply(ctx, req)
	s.jsonTime.Record(time.Since(start))
	return resp, err
}

// reply decides req, counts the answer by domain and code, and turns an
// error into its gRPC status.
func (s *Service) reply(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, req)
	if err != nil {
		err = s.toStatus(err)
		s.decisions.Load().count(req.GetDomain(), errorCode(err))
		return nil, err
	}
	code := codeOK
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = codeOverLimit
	}
	s.decisions.Load().count(req.GetDomain(), code)
	return resp, nil
}

// toStatus maps an error to its gRPC status, counting and logging the ones
// that are not the caller's fault.
//
// A request refused for what it carries is told the reason (it is about
// the caller's own request). A failure of the store or of the service is
// told only its kind, and the store's reason when it gave one
// (limiter.Reason): the whole error names servers, addresses, ports and
// cache keys, which are for the logs, not for whoever sends requests
// (issue 24). It is logged at debug level for a deadline or a load shed
// (the default level logs no line per request), at warn or error for
// failures of the service or the store, at most one line a second per kind.
func (s *Service) toStatus(err error) error {
	var re *requestError
	switch {
	case errors.As(err, &re):
		s.cfg.Log.Debug("request refused", "reason", re.msg)
		return status.Error(codes.InvalidArgument, re.msg)
	case errors.Is(err, ErrNoRules):
		s.cfg.Log.Debug("request refused", "reason", err.Error())
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		s.storeErrors.Inc()
		s.cfg.Log.Debug("request out of time", "reason", err.Error())
		return status.Error(codes.DeadlineExceeded, msgDeadline)
	case errors.Is(err, context.Canceled):
		s.cfg.Log.Debug("request canceled by its caller", "reason", err.Error())
		return status.Error(codes.Canceled, msgCanceled)
	case errors.Is(err, limiter.ErrOverloaded):
		s.loadShed.Inc()
		s.cfg.Log.Debug("request shed", "reason", err.Error())
		return status.Error(codes.ResourceExhausted, withReason(limiter.ErrOverloaded, err))
	case errors.Is(err, limiter.ErrUnavailable):
		s.storeErrors.Inc()
		if ok, held := s.unavailableLog.Allow(time.Now()); ok {
			s.cfg.Log.Warn("store unavailable", "err", err, "suppressed", held)
		}
		return status.Error(codes.Unavailable, withReason(limiter.ErrUnavailable, err))
	default:
		s.serviceErrors.Inc()
		if ok, held := s.errorLog.Allow(time.Now()); ok {
			s.cfg.Log.Error("rate limit decision failed", "err", err, "suppressed", held)
		}
		if errors.Is(err, limiter.ErrData) {
			return status.Error(codes.Internal, limiter.ErrData.Error())
		}
		return status.Error(codes.Internal, msgInternal)
	}
}

// What a caller is told of a failure that is not its request's.
const (
	msgDeadline = "deadline exceeded"
	msgCanceled = "canceled"
	msgInternal = "internal error"
)

// withReason is kind's text, followed by the first limiter.Reason that err
// wraps, if any.
func withReason(kind, err error) string {
	var r limiter.Reason
	if errors.As(err, &r) {
		return kind.Error() + ": " + string(r)
	}
	return kind.Error()
}

func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	cfg := s.rules.Load()
	if cfg == nil {
		return nil, ErrNoRules
	}
	total := 0
	for _, d := range req.GetDescriptors() {
		total += len(d.GetEntries())
	}
	sc := s.getScratch(len(req.GetDescriptors()), total)
	defer s.putScratch(sc)

	s.match(cfg, req, sc)
	if err := slidingLogBudget(sc.descs); err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	storeCtx, cancel, err := s.budget(ctx)
	if err != nil {
		return nil, err
	}
	start := s.cfg.Live.StoreStart(now)
	err = s.limiter.Check(storeCtx, req.GetDomain(), now, sc.descs, sc.statuses)
	s.cfg.Live.StoreDone(start, err)
	cancel()
	degraded := false
	if err != nil && s.cfg.Fallback != nil && outage(err) {
		// The budget was the store's and may be spent: the local store
		// never waits for I/O, and needs only the caller's deadline.
		if lerr := s.cfg.Fallback.Check(ctx, req.GetDomain(), now, sc.descs, sc.statuses); lerr == nil {
			degraded = true
			s.degraded.Inc()
			if s.cfg.Tracer != nil {
				markDegraded(ctx)
			}
			if ok, held := s.degradedLog.Allow(time.Now()); ok {
				s.cfg.Log.Warn("store unavailable; deciding from this instance's local counts", "err", err, "suppressed", held)
			}
			err = nil
		}
	}
	if err != nil {
		return nil, err
	}
	resp, err := s.respond(req, sc, now, degraded)
	if err == nil && s.cfg.Capture.Active() {
		s.captureRequest(req, now, resp, degraded)
	}
	return resp, err
}

// outage reports whether a limiter error means that the store could not
// be reached, so that Config.Fallback decides: it wraps
// limiter.ErrUnavailable, and neither limiter.ErrData nor
// limiter.ErrOverloaded (a request can carry several stores' errors), nor
// the caller's cancellation (nobody waits for the answer).
func outage(err error) bool {
	return errors.Is(err, limiter.ErrUnavailable) &&
		!errors.Is(err, limiter.ErrData) && !errors.Is(err, limiter.ErrOverloaded) &&
		!errors.Is(err, context.Canceled)
}

// match fills sc.descs with what each descriptor of req is limited by: a
// per-request override, the rule it matches, or nothing (no rule,
// unlimited, or replaced by another matched rule), with the entries its
// cache key is made of and the hits it adds; and sc.counters with the
// statistics each counts under.
func (s *Service) match(cfg *rules.Config, req *rlsv3.RateLimitRequest, sc *scratch) {
	domain := req.GetDomain()
	known := cfg.HasDomain(domain)
	if !known && !sc.quiet {
		// As the anchor, once per descriptor looked up in no domain.
		s.domainNotFound(domain).Add(uint64(len(req.GetDescriptors())))
		s.logUnknownDomain(cfg, domain)
		s.cfg.Live.UnknownDomain(domain)
	}
	requestHits := uint64(req.GetHitsAddend())
	if requestHits == 0 {
		requestHits = 1
	}
	var replacing map[string]struct{}
	for i, d := range req.GetDescriptors() {
		start := len(sc.entries)
		for _, e := range d.GetEntries() {
			sc.entries = append(sc.entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		entries := sc.entries[start:len(sc.entries):len(sc.entries)]
		ld := &sc.descs[i]
		ld.Entries = entries
		ld.Hits = requestHits
		if h := d.GetHitsAddend(); h != nil {
			ld.Hits = h.GetValue()
		}
		// A refund gives those hits back (is_negative_hits), as the
		// anchor reads them: the descriptor's hits_addend, else the
		// request's, else 1.
		ld.Refund = d.GetIsNegativeHits()
		if o := d.GetLimit(); o != nil {
			// As in envoyproxy/ratelimit, an override applies only in a
			// configured domain: a migration must not start limiting
			// traffic that was never limited. Without entries there is
			// nothing to key it on.
			if len(entries) == 0 || !known {
				continue
			}
			ld.Limit = overrideLimit(domain, entries, o)
			if !sc.quiet {
				sc.counters[i] = s.overrideCounters(domain, entries)
			}
			continue
		}
		m := cfg.Match(domain, entries)
		if m.Limit == nil {
			if known && !sc.quiet {
				s.logNoRule(domain, entries)
				s.cfg.Live.NoRule(domain, entries)
			}
			continue
		}
		if unlimited(m.Limit) {
			sc.unlim[i] = true
			continue
		}
		ld.Limit = m.Limit
		if !sc.quiet {
			sc.counters[i] = s.matchCounters(&m)
		}
		if m.KeyEntries != nil {
			ld.Entries = m.KeyEntries
		}
		if m.Limit.InList() {
			sc.eachOff[i] = len(sc.eachCounters)
			for _, l := range m.Limit.Limits {
				var c *ruleCounters
				if !sc.quiet {
					c = s.limitCounters(&m, l)
				}
				sc.eachCounters = append(sc.eachCounters, c)
			}
		}
		if m.Limit.InList() {
			for _, l := range m.Limit.Limits {
				replacing = addReplaces(replacing, l)
			}
		} else {
			replacing = addReplaces(replacing, m.Limit)
		}
	}
	if replacing != nil {
		for i := range sc.descs {
			replace(&sc.descs[i], replacing)
		}
	}
	if len(sc.eachCounters) > 0 {
		sc.each = grow(sc.each, len(sc.eachCounters))
		for i := range sc.descs {
			if l := sc.descs[i].Limit; l != nil && l.InList() {
				off := sc.eachOff[i]
				sc.descs[i].Each = sc.each[off : off+len(l.Limits) : off+len(l.Limits)]
			}
		}
	}
}

// addReplaces adds the names l replaces to replacing, made on first use.
func addReplaces(replacing map[string]struct{}, l *rules.Limit) map[string]struct{} {
	if len(l.Replaces) == 0 {
		return replacing
	}
	if replacing == nil {
		replacing = map[string]struct{}{}
	}
	for _, r := range l.Replaces {
		replacing[r] = struct{}{}
	}
	return replacing
}

// unlimited reports whether a rule never limits: unlimited, or a list of
// unlimited limits only.
func unlimited(l *rules.Limit) bool {
	if !l.InList() {
		return l.Unlimited
	}
	for _, m := range l.Limits {
		if !m.Unlimited {
			return false
		}
	}
	return true
}

// replace drops the limits of d that another matched rule replaces (by
// name): a single limit, or those of a list (Descriptor.Skip), the whole
// descriptor when none of its limits is left.
func replace(d *limiter.Descriptor, replacing map[string]struct{}) {
	l := d.Limit
	if l == nil {
		return
	}
	if !l.InList() {
		if _, ok := replacing[l.Name]; ok && l.Name != "" {
			d.Limit = nil
		}
		return
	}
	left := false
	for k, m := range l.Limits {
		if _, ok := replacing[m.Name]; ok && m.Name != "" {
			d.Skip |= 1 << k
		} else if !m.Unlimited {
			left = true
		}
	}
	if !left {
		d.Limit = nil
	}
}

// budget bounds the store's work for one request. A caller that sends a
// deadline gets that deadline less deadlineMargin's share, at most
// Config.Ceiling: no call fails because a fixed time passed while its
// caller was still waiting. One that sends none gets Config.Timeout (the
// Ceiling when that is shorter), or no budget when both are 0: a call
// without a deadline is not failed by a fixed time, as in the anchor (a
// store that stops answering fails it through the store's own bounds and
// breaker). With neither Timeout, Ceiling nor Deadlines there is no budget
// at all: ctx is returned as it is, and no timer is made (the memory
// store, which never waits for I/O).
//
// A request whose caller's deadline leaves no time for the store (it
// waited in this process's queues until then) is shed: its error wraps
// limiter.ErrOverloaded, answered ResourceExhausted and counted as
// load_shed, and the store is not asked.
func (s *Service) budget(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.cfg.Timeout <= 0 && s.cfg.Ceiling <= 0 && !s.cfg.Deadlines {
		return ctx, func() {}, nil
	}
	var d time.Duration
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		d = left - deadlineMargin(left)
		if d <= 0 {
			return nil, nil, errNoTimeLeft
		}
		if s.cfg.Ceiling > 0 {
			d = min(d, s.cfg.Ceiling)
		}
	} else {
		d = s.cfg.Timeout
		if s.cfg.Ceiling > 0 && (d <= 0 || s.cfg.Ceiling < d) {
			d = s.cfg.Ceiling
		}
		if d <= 0 {
			return ctx, func() {}, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, cancel, nil
}

// errNoTimeLeft sheds a request whose caller's deadline has (all but)
// passed before the store was asked.
var errNoTimeLeft = fmt.Errorf("service: %w: the caller's deadline passed before the store could be asked", limiter.ErrOverloaded)

// maxDeadlineMargin bounds deadlineMargin.
const maxDeadlineMargin = 5 * time.Millisecond

// deadlineMargin is the part of a caller's remaining time left over after
// the store's budget: what the answer needs to reach the caller (or, with
// STORE_FAILURE_MODE=local, to be decided from local counts first) before
// the caller gives up. A tenth of the time left, at most 5 ms: 2 ms of
// Envoy's default 20 ms.
func deadlineMargin(left time.Duration) time.Duration {
	return min(left/10, maxDeadlineMargin)
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
