package service

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// HeaderStyle is the form of the quota headers (LIMIT_RESPONSE_HEADERS_STYLE).
type HeaderStyle uint8

// The header styles.
const (
	// HeadersDraft03 is envoyproxy/ratelimit's trio, RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset, describing the descriptor
	// closest to its limit (draft-polli-ratelimit-headers-03).
	HeadersDraft03 HeaderStyle = iota
	// HeadersIETF is the IETF httpapi draft's pair: RateLimit-Policy, one
	// quota policy per limited descriptor, and RateLimit, the remaining
	// quota and seconds to reset of each
	// (draft-ietf-httpapi-ratelimit-headers-10).
	HeadersIETF
)

// ParseHeaderStyle reads LIMIT_RESPONSE_HEADERS_STYLE: "draft03" or "ietf".
func ParseHeaderStyle(s string) (HeaderStyle, bool) {
	switch strings.ToLower(s) {
	case "", "draft03":
		return HeadersDraft03, true
	case "ietf":
		return HeadersIETF, true
	}
	return 0, false
}

// answer adds to resp what a client (and the upstream) can act on, as
// Config.Headers asks: the quota headers, Retry-After and a JSON body on
// OVER_LIMIT, and the quota headers for the upstream on OK.
func (s *Service) answer(resp *rlsv3.RateLimitResponse, req *rlsv3.RateLimitRequest, sc *scratch) {
	h := &s.cfg.Headers
	if !h.Enabled && !h.RetryAfter && !h.Body {
		return
	}
	over := resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	var hdrs []*corev3.HeaderValue
	if h.Enabled {
		if h.Style == HeadersIETF {
			hdrs = ietfHeaders(resp.GetStatuses(), sc)
		} else {
			hdrs = s.draft03Headers(resp.GetStatuses(), sc)
		}
		if h.Upstream && !over && len(hdrs) > 0 {
			resp.RequestHeadersToAdd = hdrs
		}
	}
	if over {
		// The request passes once every descriptor over its limit does.
		var retry time.Duration
		first := -1
		for i, st := range resp.GetStatuses() {
			if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				continue
			}
			if first < 0 {
				first = i
			}
			retry = max(retry, sc.statuses[i].ResetAfter)
		}
		secs := ceilSeconds(retry)
		if h.RetryAfter {
			hdrs = append(hdrs, &corev3.HeaderValue{Key: "Retry-After", Value: formatUint(secs)})
		}
		if h.Body && first >= 0 {
			l := sc.statuses[first].Limit // the limit that decided
			if l == nil {
				l = sc.descs[first].Limit
			}
			resp.RawBody = overLimitBody(req.GetDomain(), l, policyName(l, sc.descs[first].Entries), secs)
			hdrs = append(hdrs, &corev3.HeaderValue{Key: "Content-Type", Value: "application/json"})
		}
	}
	resp.ResponseHeadersToAdd = hdrs
}

// draft03Headers describes the descriptor closest to its limit, as
// envoyproxy/ratelimit does; none when no descriptor is limited.
func (s *Service) draft03Headers(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, sc *scratch) []*corev3.HeaderValue {
	best := -1
	for i, st := range statuses {
		if st.GetCurrentLimit() == nil {
			continue
		}
		if best < 0 || st.GetLimitRemaining() < statuses[best].GetLimitRemaining() {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	st := statuses[best]
	return []*corev3.HeaderValue{
		{Key: s.cfg.Headers.Limit, Value: formatUint(uint64(st.GetCurrentLimit().GetRequestsPerUnit()))},
		{Key: s.cfg.Headers.Remaining, Value: formatUint(uint64(st.GetLimitRemaining()))},
		{Key: s.cfg.Headers.Reset, Value: formatUint(ceilSeconds(sc.statuses[best].ResetAfter))},
	}
}

// ietfHeaders lists every limited descriptor as a quota policy (its quota
// and window) in RateLimit-Policy and with its remaining quota and seconds
// to reset in RateLimit; a descriptor with several limits, every limit
// that applied. A policy is named after its rule's name, or its key path
// (with the limit's StatLevel for one of a list); a name met again gets
// "#2", "#3"...
func ietfHeaders(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, sc *scratch) []*corev3.HeaderValue {
	var policy, current strings.Builder
	var seen map[string]int
	for i, st := range statuses {
		l := sc.descs[i].Limit
		if st.GetCurrentLimit() == nil || l == nil {
			continue
		}
		if each := sc.descs[i].Each; each != nil {
			for k := range each {
				// A shadow limit is no policy of the client's.
				if each[k].Limit != nil && !each[k].Limit.Shadow {
					seen = writePolicy(&policy, &current, seen, each[k].Limit, sc.descs[i].Entries, each[k].Remaining, each[k].ResetAfter)
				}
			}
			continue
		}
		seen = writePolicy(&policy, &current, seen, l, sc.descs[i].Entries, st.GetLimitRemaining(), sc.statuses[i].ResetAfter)
	}
	if policy.Len() == 0 {
		return nil
	}
	return []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: policy.String()},
		{Key: "RateLimit", Value: current.String()},
	}
}

// writePolicy writes one limit's policy and its current state (see
// ietfHeaders); seen counts the names written so far.
func writePolicy(policy, current *strings.Builder, seen map[string]int, l *rules.Limit, entries []rules.Entry, remaining uint32, reset time.Duration) map[string]int {
	name := policyName(l, entries)
	if seen == nil {
		seen = map[string]int{}
	}
	seen[name]++
	if n := seen[name]; n > 1 {
		name += "#" + strconv.Itoa(n)
	}
	if policy.Len() > 0 {
		policy.WriteString(", ")
		current.WriteString(", ")
	}
	writeSFString(policy, name)
	policy.WriteString(";q=")
	policy.WriteString(formatUint(uint64(l.RequestsPerUnit)))
	policy.WriteString(";w=")
	policy.WriteString(formatUint(uint64(l.Window() / time.Second)))
	writeSFString(current, name)
	current.WriteString(";r=")
	current.WriteString(formatUint(uint64(remaining)))
	current.WriteString(";t=")
	current.WriteString(formatUint(ceilSeconds(reset)))
	return seen
}

// policyName names a limit for a client: the rule's name, else its key
// path ("path_/login.user"); an override's is its descriptor's keys. It
// comes from the rules (or the request's keys), never from a value that
// only the request holds.
func policyName(l *rules.Limit, entries []rules.Entry) string {
	switch {
	case l.Name != "":
		return l.Name
	case l.InList():
		return strings.Join(l.Levels, ".") + "." + l.StatLevel
	case len(l.Levels) > 0:
		return strings.Join(l.Levels, ".")
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	return strings.Join(keys, ".")
}

// writeSFString writes s as a Structured Field string (RFC 8941 §3.3.3):
// quoted, with '"' and '\' escaped; bytes a string cannot hold (outside
// printable ASCII) become '_'.
func writeSFString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// overLimitBody is the 429 body Envoy sends when the answer carries one
// (LIMIT_RESPONSE_BODY_ENABLED): what limited the request and when to
// retry.
func overLimitBody(domain string, l *rules.Limit, name string, retryAfter uint64) []byte {
	b, _ := json.Marshal(struct {
		Domain            string `json:"domain"`
		Rule              string `json:"rule"`
		Limit             uint32 `json:"limit"`
		Unit              string `json:"unit"`
		WindowSeconds     uint64 `json:"window_seconds"`
		RetryAfterSeconds uint64 `json:"retry_after_seconds"`
	}{domain, name, l.RequestsPerUnit, l.Unit.String(), uint64(l.Window() / time.Second), retryAfter})
	return b
}

// ceilSeconds is d in whole seconds, rounded up, never negative.
func ceilSeconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Second - 1) / time.Second)
}
