package service

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// Statistics that no rule in use names go once they stop counting: the
// keys of rules and domains that were removed or renamed (each reload from
// Envoy Gateway may rename them), and keys made of request values
// (detailed_metric, value_to_metric, limit overrides, unknown domains),
// whose slots (Config.MaxDynamicStatKeys) are then free for the values
// asked now instead of being held by the first ones forever. The keys of
// the rules in use always stay.

// defaultStatsExpiry is Config.StatsExpiry's default: how long a
// statistics key that no rule in use names must go without a hit before it
// is dropped from /stats, statsd and Prometheus. The keys are looked at a
// tenth of it apart, at most a minute.
const (
	defaultStatsExpiry = 10 * time.Minute
	maxStatsSweep      = time.Minute
)

// expiry is the sweep's memory: when each key was last seen to move.
// Only the sweeping goroutine touches it.
type expiry struct {
	keys    map[string]*idle
	domains map[string]*idle // the domains' decision counters
}

type idle struct {
	hits  uint64
	since time.Time
}

// stale returns whether the value v of name has stood still for after at
// now, recording it.
func stale(m map[string]*idle, name string, v uint64, now time.Time, after time.Duration) bool {
	st := m[name]
	if st == nil || st.hits != v {
		m[name] = &idle{hits: v, since: now}
		return false
	}
	return now.Sub(st.since) >= after
}

// RunStatsExpiry drops statistics keys that no rule in use names once they
// have gone Config.StatsExpiry without a hit, looking at them a tenth of it
// apart (at most a minute), until ctx is done.
func (s *Service) RunStatsExpiry(ctx context.Context) {
	t := time.NewTicker(min(s.cfg.StatsExpiry/10, maxStatsSweep))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.expireStats(s.cfg.Now())
		}
	}
}

// expireStats is one sweep at now.
func (s *Service) expireStats(now time.Time) {
	cfg := s.rules.Load()
	current := ruleStatKeys(cfg)
	e := &s.expiry
	if e.keys == nil {
		e.keys, e.domains = map[string]*idle{}, map[string]*idle{}
	}
	live := make(map[string]bool)
	s.ruleStats.Range(func(k, v any) bool {
		key, c := k.(string), v.(*ruleCounters)
		if current[key] {
			delete(e.keys, key)
			return true
		}
		live[key] = true
		if !stale(e.keys, key, c.hits(), now, s.cfg.StatsExpiry) {
			return true
		}
		if !s.ruleStats.CompareAndDelete(key, c) {
			return true
		}
		delete(e.keys, key)
		for _, stat := range ruleStatNames {
			s.stats.Forget(stats.RuleName(c.domain, c.levels, stat))
		}
		if c.shadowOverLimit != nil {
			s.stats.Forget(stats.RuleName(c.domain, c.levels, shadowOverLimitStat))
		}
		if c.dynamic {
			s.dynamicKeys.Add(-1)
		}
		return true
	})
	s.notFound.Range(func(k, v any) bool {
		domain, c := k.(string), v.(*stats.Counter)
		name := "notfound:" + domain
		live[name] = true
		if !stale(e.keys, name, c.Value(), now, s.cfg.StatsExpiry) || !s.notFound.CompareAndDelete(domain, c) {
			return true
		}
		delete(e.keys, name)
		s.stats.Forget(stats.RuleName(domain, nil, "domain_not_found"))
		s.dynamicKeys.Add(-1)
		return true
	})
	for name := range e.keys {
		if !live[name] {
			delete(e.keys, name) // gone another way (a rule back in use)
		}
	}
	s.expireDecisions(cfg, now)
}

// expireDecisions drops the decision counters of domains no rule names.
func (s *Service) expireDecisions(cfg *rules.Config, now time.Time) {
	e := &s.expiry
	s.decisionDomainsMu.Lock()
	defer s.decisionDomainsMu.Unlock()
	for domain := range s.decisionDomains {
		if cfg != nil && cfg.HasDomain(domain) {
			delete(e.domains, domain)
			continue
		}
		var total uint64
		for code := range decisionCode(numCodes) {
			v, _ := s.stats.TaggedValue(decisionName, decisionTags(domain, code)...)
			total += v
		}
		if !stale(e.domains, domain, total, now, s.cfg.StatsExpiry) {
			continue
		}
		for code := range decisionCode(numCodes) {
			s.stats.ForgetTagged(decisionName, decisionTags(domain, code)...)
		}
		delete(s.decisionDomains, domain)
		delete(e.domains, domain)
	}
}

// ruleStatKeys are the statistics keys of the rules in cfg: their own,
// and each limit's of a rate_limits list.
func ruleStatKeys(cfg *rules.Config) map[string]bool {
	out := map[string]bool{}
	if cfg == nil {
		return out
	}
	for _, l := range cfg.Limits() {
		out[l.FullKey] = true
		if l.StatLevel != "" {
			out[l.FullKey+"."+l.StatLevel] = true
		}
	}
	return out
}
