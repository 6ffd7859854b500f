package service

import (
	"strconv"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// ruleCounters are one rule's statistics, named as envoyproxy/ratelimit
// names them: ratelimit.service.rate_limit.<stat key>.<counter>.
type ruleCounters struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode, overLimitWithLocalCache *stats.Counter
}

func (s *Service) counters(key string) *ruleCounters {
	if c, ok := s.ruleStats.Load(key); ok {
		return c.(*ruleCounters)
	}
	prefix := "ratelimit.service.rate_limit." + key + "."
	c := &ruleCounters{
		totalHits:               s.stats.Counter(prefix + "total_hits"),
		overLimit:               s.stats.Counter(prefix + "over_limit"),
		nearLimit:               s.stats.Counter(prefix + "near_limit"),
		withinLimit:             s.stats.Counter(prefix + "within_limit"),
		shadowMode:              s.stats.Counter(prefix + "shadow_mode"),
		overLimitWithLocalCache: s.stats.Counter(prefix + "over_limit_with_local_cache"),
	}
	actual, _ := s.ruleStats.LoadOrStore(key, c)
	return actual.(*ruleCounters)
}

func (s *Service) count(key string, n *limiter.Counts) {
	c := s.counters(key)
	c.totalHits.Add(n.TotalHits)
	c.overLimit.Add(n.OverLimit)
	c.nearLimit.Add(n.NearLimit)
	c.withinLimit.Add(n.WithinLimit)
	c.shadowMode.Add(n.ShadowMode)
	c.overLimitWithLocalCache.Add(n.OverLimitWithLocalCache)
}

func formatUint(v uint64) string { return strconv.FormatUint(v, 10) }
