package service

// CountDecision counts one decision of s for domain, OK or OVER_LIMIT.
func CountDecision(s *Service, domain string, ok bool) {
	code := codeOverLimit
	if ok {
		code = codeOK
	}
	s.decisions.Load().count(domain, code)
}
