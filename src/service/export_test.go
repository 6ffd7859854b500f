package service

import rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

// CountDecision counts one decision of s for domain, OK or OVER_LIMIT.
func CountDecision(s *Service, domain string, ok bool) {
	code := codeOverLimit
	if ok {
		code = codeOK
	}
	s.decisions.Load().count(domain, code)
}

// QuotaReport handles m as the first message of a new stream of q, which
// ends at once.
func QuotaReport(q *Quota, m *rlqsv3.RateLimitQuotaUsageReports) error {
	st, err := q.open()
	if err != nil {
		return err
	}
	defer q.end(st)
	return q.report(st, m)
}
