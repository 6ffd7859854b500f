package service

import (
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// ruleCounters are one statistics key's counters, named as
// envoyproxy/ratelimit names them: ratelimit.service.rate_limit.<key>.<counter>.
type ruleCounters struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode, overLimitWithLocalCache *stats.Counter
	// totalNegativeHits counts the hits refunds asked to give back
	// (is_negative_hits), as the anchor's total_negative_hits.
	totalNegativeHits *stats.Counter
	// shadowOverLimit counts the hits a shadow limit would have refused
	// (rules.Limit.Shadow; our extension, shadow_over_limit). Only the
	// keys of the limits of rate_limits lists have it: a limit may become
	// a shadow one at a reload, while its key and counters go on; the
	// anchor's keys keep the anchor's six statistics. Nil for the others.
	shadowOverLimit *stats.Counter

	// domain and levels name the counters in the registry; dynamic says
	// that the key holds request data and takes one of
	// Config.MaxDynamicStatKeys (see expire.go).
	domain  string
	levels  []string
	dynamic bool
}

// ruleStatNames are the per-rule statistics of a key, in ruleCounters'
// order; the key of a list's limit has shadowOverLimitStat too.
var ruleStatNames = [...]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode", "over_limit_with_local_cache", "total_negative_hits"}

// shadowOverLimitStat names ruleCounters.shadowOverLimit.
const shadowOverLimitStat = "shadow_over_limit"

// keyKind says what a statistics key is, for newCounters.
type keyKind uint8

const (
	// dynamicKey: the key is made from request data and takes one of
	// Config.MaxDynamicStatKeys (see expire.go).
	dynamicKey keyKind = 1 << iota
	// listKey: the key of a limit of a rate_limits list.
	listKey
)

// hits is what the key has counted: it moves at every decision, and at
// every refund.
func (c *ruleCounters) hits() uint64 {
	return c.totalHits.Value() + c.shadowMode.Value() + c.totalNegativeHits.Value()
}

func (c *ruleCounters) add(n *limiter.Counts) {
	c.totalHits.Add(n.TotalHits)
	c.overLimit.Add(n.OverLimit)
	c.nearLimit.Add(n.NearLimit)
	c.withinLimit.Add(n.WithinLimit)
	c.shadowMode.Add(n.ShadowMode)
	c.overLimitWithLocalCache.Add(n.OverLimitWithLocalCache)
	c.totalNegativeHits.Add(n.TotalNegativeHits)
	if n.ShadowOverLimit > 0 && c.shadowOverLimit != nil {
		c.shadowOverLimit.Add(n.ShadowOverLimit)
	}
}

// defaultMaxDynamicStatKeys is Config.MaxDynamicStatKeys's default.
const defaultMaxDynamicStatKeys = 1000

// overflowLevel names the statistics key under which a domain counts the
// hits of request-made keys past Config.MaxDynamicStatKeys.
const overflowLevel = "_overflow"

// matchCounters returns the counters of a matched rule. A rule's own key
// comes from the rules, so there are as many as there are rules; a key
// holding request values (detailed_metric, value_to_metric) is bounded by
// Config.MaxDynamicStatKeys.
func (s *Service) matchCounters(m *rules.Match) *ruleCounters {
	if c, ok := s.ruleStats.Load(m.StatKey); ok {
		return c.(*ruleCounters)
	}
	if m.StatLevels == nil {
		c, _ := s.newCounters(m.StatKey, m.Limit.Domain, m.Limit.Levels, 0)
		return c
	}
	return s.dynamicCounters(m.StatKey, m.Limit.Domain, m.StatLevels, 0)
}

// limitCounters returns the counters of one limit l of a matched list:
// the key of the match's statistics with the limit's StatLevel one level
// below ("domain.user.sustained"). A rule's own key is cached by limit (a
// reload clears it); a key holding request values is bounded as the
// match's is.
func (s *Service) limitCounters(m *rules.Match, l *rules.Limit) *ruleCounters {
	if m.StatLevels == nil {
		if c, ok := s.limitStats.Load(l); ok {
			return c.(*ruleCounters)
		}
		levels := append(slices.Clip(l.Levels), l.StatLevel)
		c, _ := s.newCounters(l.FullKey+"."+l.StatLevel, l.Domain, levels, listKey)
		s.limitStats.Store(l, c)
		return c
	}
	key := m.StatKey + "." + l.StatLevel
	if c, ok := s.ruleStats.Load(key); ok {
		return c.(*ruleCounters)
	}
	return s.dynamicCounters(key, l.Domain, append(slices.Clip(m.StatLevels), l.StatLevel), listKey)
}

// overrideCounters returns the counters of a descriptor that carries its
// own limit: one key per key path ("domain.key1.key2"), never per value,
// so that the values a client invents create no statistics; the key paths
// themselves are the client's too, so they are bounded as request values
// are.
func (s *Service) overrideCounters(domain string, entries []rules.Entry) *ruleCounters {
	n := len(domain)
	for _, e := range entries {
		n += 1 + len(e.Key)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
	}
	key := b.String()
	if c, ok := s.ruleStats.Load(key); ok {
		return c.(*ruleCounters)
	}
	levels := make([]string, len(entries))
	for i, e := range entries {
		levels[i] = e.Key
	}
	return s.dynamicCounters(key, domain, levels, 0)
}

// dynamicCounters returns the counters of a key made from request data,
// creating them while fewer than Config.MaxDynamicStatKeys such keys exist,
// and the domain's overflow counters afterwards; kind may add listKey.
func (s *Service) dynamicCounters(key, domain string, levels []string, kind keyKind) *ruleCounters {
	if s.dynamicKeys.Add(1) > int64(s.cfg.MaxDynamicStatKeys) {
		s.dynamicKeys.Add(-1)
		s.statKeysOverflow.Inc()
		okey := domain + "." + overflowLevel
		if c, ok := s.ruleStats.Load(okey); ok {
			return c.(*ruleCounters)
		}
		c, _ := s.newCounters(okey, domain, []string{overflowLevel}, 0)
		return c
	}
	c, created := s.newCounters(key, domain, levels, kind|dynamicKey)
	if !created {
		s.dynamicKeys.Add(-1) // another request made it first
	}
	return c
}

// domainNotFound returns the counter of requests for a domain that no
// rule names, ratelimit.service.rate_limit.<domain>.domain_not_found as in
// the anchor. The domain is the client's, so these counters share the
// bound of the keys made from request data (Config.MaxDynamicStatKeys);
// past it, they count under the domain "_overflow".
func (s *Service) domainNotFound(domain string) *stats.Counter {
	if c, ok := s.notFound.Load(domain); ok {
		return c.(*stats.Counter)
	}
	if s.dynamicKeys.Add(1) > int64(s.cfg.MaxDynamicStatKeys) {
		s.dynamicKeys.Add(-1)
		s.statKeysOverflow.Inc()
		return s.stats.RuleCounter(overflowLevel, nil, "domain_not_found")
	}
	c, loaded := s.notFound.LoadOrStore(domain, s.stats.RuleCounter(domain, nil, "domain_not_found"))
	if loaded {
		s.dynamicKeys.Add(-1) // another request made it first
	}
	return c.(*stats.Counter)
}

// newCounters returns the counters of key, of the kind given, registering
// them on first use.
func (s *Service) newCounters(key, domain string, levels []string, kind keyKind) (c *ruleCounters, created bool) {
	c = &ruleCounters{
		domain:                  domain,
		levels:                  slices.Clone(levels),
		dynamic:                 kind&dynamicKey != 0,
		totalHits:               s.stats.RuleCounter(domain, levels, "total_hits"),
		overLimit:               s.stats.RuleCounter(domain, levels, "over_limit"),
		nearLimit:               s.stats.RuleCounter(domain, levels, "near_limit"),
		withinLimit:             s.stats.RuleCounter(domain, levels, "within_limit"),
		shadowMode:              s.stats.RuleCounter(domain, levels, "shadow_mode"),
		overLimitWithLocalCache: s.stats.RuleCounter(domain, levels, "over_limit_with_local_cache"),
		totalNegativeHits:       s.stats.RuleCounter(domain, levels, "total_negative_hits"),
	}
	if kind&listKey != 0 {
		c.shadowOverLimit = s.stats.RuleCounter(domain, levels, shadowOverLimitStat)
	}
	actual, loaded := s.ruleStats.LoadOrStore(key, c)
	return actual.(*ruleCounters), !loaded
}

func formatUint(v uint64) string { return strconv.FormatUint(v, 10) }
