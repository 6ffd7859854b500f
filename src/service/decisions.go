package service

import (
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// decisionCode is what a call was answered: the overall code of a
// response, or the gRPC code of a refusal.
type decisionCode uint8

const (
	codeOK decisionCode = iota
	codeOverLimit
	codeInvalidArgument
	codeUnavailable
	codeDeadlineExceeded
	codeResourceExhausted
	codeCancelled
	codeInternal
	numCodes
)

// codeNames are the values of the "code" label: the RLS codes, then the
// canonical names of the gRPC codes the service answers with.
var codeNames = [numCodes]string{
	"OK", "OVER_LIMIT", "INVALID_ARGUMENT", "UNAVAILABLE", "DEADLINE_EXCEEDED",
	"RESOURCE_EXHAUSTED", "CANCELLED", "INTERNAL",
}

// errorCode is the decisionCode of an error toStatus returned.
func errorCode(err error) decisionCode {
	switch status.Code(err) {
	case codes.InvalidArgument:
		return codeInvalidArgument
	case codes.Unavailable:
		return codeUnavailable
	case codes.DeadlineExceeded:
		return codeDeadlineExceeded
	case codes.ResourceExhausted:
		return codeResourceExhausted
	case codes.Canceled:
		return codeCancelled
	}
	return codeInternal
}

// unknownDomain is the domain label of calls for a domain that the rules
// in use do not configure (or no domain at all): the domain is the
// client's, and a label value per domain a client invents would grow the
// series without bound.
const unknownDomain = "_unknown"

// decisionName is the statistic counting decisions, tagged domain and
// code: ratelimit_service_decisions{domain,code} in Prometheus.
const decisionName = "ratelimit.service.decisions"

// decisionStats holds the decision counters of one rules snapshot: one
// set per configured domain, and one for every other domain. A domain's
// counters are registered at its first decision (OK and OVER_LIMIT at
// once, so that they start at 0 in Prometheus), not when its rules load: a
// snapshot of 45,000 domains, most of them idle, made 90,000 series at
// once; a lookup takes no lock and allocates nothing.
type decisionStats struct {
	reg     *stats.Registry
	domains map[string]*domainDecisions
	unknown *domainDecisions
}

type domainDecisions struct {
	domain string
	codes  [numCodes]atomic.Pointer[stats.Counter]
}

// decisionTags are the tags of the counter of domain's decisions answered
// with code.
func decisionTags(domain string, code decisionCode) []stats.Label {
	return []stats.Label{{Name: "domain", Value: domain}, {Name: "code", Value: codeNames[code]}}
}

// newDecisionStats returns the counters of the domains configured. The
// label values are the rules' domains, so the series are bounded by the
// rules (a domain removed by a reload keeps its counters until they expire:
// see expire.go).
func newDecisionStats(reg *stats.Registry, domains []string) *decisionStats {
	d := &decisionStats{reg: reg, domains: make(map[string]*domainDecisions, len(domains))}
	d.unknown = d.add(unknownDomain)
	d.unknown.counter(reg, codeOK) // the one series of every other domain, from the start
	for _, name := range domains {
		d.domains[name] = d.add(name)
	}
	return d
}

func (d *decisionStats) add(domain string) *domainDecisions {
	return &domainDecisions{domain: domain}
}

// count counts one call for domain answered with code.
func (d *decisionStats) count(domain string, code decisionCode) {
	dd, ok := d.domains[domain]
	if !ok {
		dd = d.unknown
	}
	dd.counter(d.reg, code).Inc()
}

func (dd *domainDecisions) counter(reg *stats.Registry, code decisionCode) *stats.Counter {
	if c := dd.codes[code].Load(); c != nil {
		return c
	}
	if code != codeOK && code != codeOverLimit {
		// The domain's first decision registers the usual two as well.
		dd.counter(reg, codeOK)
		dd.counter(reg, codeOverLimit)
	} else {
		other := codeOverLimit
		if code == codeOverLimit {
			other = codeOK
		}
		if dd.codes[other].Load() == nil {
			dd.codes[other].Store(reg.TaggedCounter(decisionName, decisionTags(dd.domain, other)...))
		}
	}
	c := reg.TaggedCounter(decisionName, decisionTags(dd.domain, code)...)
	dd.codes[code].Store(c)
	return c
}
