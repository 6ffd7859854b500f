package service

import (
	"context"
	"log/slog"
	"strings"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// Requests that no rule limits are answered OK, as in the anchor, which
// is also how a misspelt domain or descriptor key goes unnoticed: at
// debug level each kind is logged, at most one line a second (wire.LogEvery),
// so that a flood of them cannot fill a disk. At the default level
// nothing is logged: the counters (domain_not_found) and the live view
// count them.

// Bounds of what a line about an unmatched request shows of it: the
// domains known, and each value of a descriptor (a value may be 4 KiB).
const (
	logMaxDomains  = 16
	logMaxValueLen = 64
)

// logUnknownDomain logs, at debug level, a request for a domain that no
// rule names.
func (s *Service) logUnknownDomain(cfg *rules.Config, domain string) {
	if !s.cfg.Log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	ok, held := s.unknownDomainLog.Allow(s.cfg.Now())
	if !ok {
		return
	}
	known := cfg.Domains()
	more := len(known) - logMaxDomains
	if more > 0 {
		known = known[:logMaxDomains]
	}
	s.cfg.Log.Debug("unknown domain: no rule applies to the request; add the domain to the rules, or fix the domain the rate limit filter sends",
		"domain", domain, "domains", known, "domains_not_shown", max(more, 0), "suppressed", held)
}

// logNoRule logs, at debug level, a descriptor of a known domain that no
// rule matches.
func (s *Service) logNoRule(domain string, entries []rules.Entry) {
	if !s.cfg.Log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	ok, held := s.noRuleLog.Allow(s.cfg.Now())
	if !ok {
		return
	}
	s.cfg.Log.Debug("descriptor matches no rule: no limit applies; check its keys and values against the domain's rules, or explain it (POST /api/v1/explain on the debug port)",
		"domain", domain, "descriptor", formatEntries(entries), "suppressed", held)
}

// formatEntries writes entries as "key=value,key=value", each value cut
// at logMaxValueLen bytes (marked with "...").
func formatEntries(entries []rules.Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		if len(e.Value) > logMaxValueLen {
			b.WriteString(e.Value[:logMaxValueLen])
			b.WriteString("...")
		} else {
			b.WriteString(e.Value)
		}
	}
	return b.String()
}
