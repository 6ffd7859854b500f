package rules

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Policy is how a quota rule shares its limit among the Envoys that report
// a bucket (YAML: quota_buckets[].policy).
type Policy uint8

// The policies of a quota rule.
const (
	// FairShare splits the limit max-min fairly by the demand each Envoy
	// reports (the default).
	FairShare Policy = iota
	// Static gives every Envoy the same share, whatever its demand.
	Static
	// DenyAll denies every request of the bucket.
	DenyAll
	// AllowAll admits every request of the bucket.
	AllowAll
)

// Policies lists every policy, in declaration order.
var Policies = []Policy{FairShare, Static, DenyAll, AllowAll}

// String returns the policy's YAML name.
func (p Policy) String() string {
	switch p {
	case FairShare:
		return "fair_share"
	case Static:
		return "static"
	case DenyAll:
		return "deny_all"
	case AllowAll:
		return "allow_all"
	}
	return "unknown"
}

// Limited reports whether the policy shares a rate limit (fair_share and
// static), as opposed to a blanket answer.
func (p Policy) Limited() bool { return p == FairShare || p == Static }

// MaxQuotaRules is the most quota_buckets items a domain may have: each
// bucket a client reports is matched against them in order.
const MaxQuotaRules = 1000

// QuotaRule is one item of a domain's quota_buckets (our extension for
// Envoy's Rate Limit Quota Service): the bucket ids it matches and the
// global limit every such bucket gets, shared by the Envoys that report
// it. It is immutable once built.
type QuotaRule struct {
	// Domain is the rule's domain; Index its 1-based place in the
	// domain's quota_buckets (files in load order when domains merge).
	Domain string
	Index  int
	// Source is "file:line" of the rule, for messages.
	Source string
	// Name is the rule's optional name.
	Name string
	// Match lists the bucket id's entries, sorted by key: a bucket id
	// matches when it has exactly these keys and each value matches.
	// Empty for the domain's default, which matches any bucket id the
	// rules before it do not.
	Match []BucketMatch
	// Policy is how the limit is shared.
	Policy Policy
	// RequestsPerUnit, Unit and UnitMultiplier are the global limit of
	// one bucket, all Envoys together; zero for deny_all and allow_all.
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32
	// Burst is the most requests all Envoys together may admit at once
	// above the rate; 0 means RequestsPerUnit.
	Burst uint32
}

// BucketMatch is what one entry of a bucket id must hold.
type BucketMatch struct {
	Key string
	// Value is the value as written: exact, or a pattern when it holds
	// '*' (each '*' matches any run of bytes; "*" alone any value).
	// Empty when Regex is set.
	Value string
	// Regex is the value_regex pattern as written; empty when not set.
	Regex string

	wild *wildcard
	re   *regexp.Regexp
}

// Default reports whether the rule is its domain's default.
func (q *QuotaRule) Default() bool { return len(q.Match) == 0 }

// Rate is the rule's global rate in requests per second; 0 for deny_all
// and allow_all.
func (q *QuotaRule) Rate() float64 {
	w := q.Window()
	if w <= 0 {
		return 0
	}
	return float64(q.RequestsPerUnit) / w.Seconds()
}

// Window is the length of the rule's unit × unit_multiplier; 0 for
// deny_all and allow_all.
func (q *QuotaRule) Window() time.Duration {
	m := max(q.UnitMultiplier, 1)
	return time.Duration(q.Unit.Seconds()) * time.Duration(m) * time.Second
}

// Capacity is the rule's burst: Burst when set, RequestsPerUnit otherwise.
func (q *QuotaRule) Capacity() uint32 {
	if q.Burst > 0 {
		return q.Burst
	}
	return q.RequestsPerUnit
}

// Matches reports whether the bucket id id matches the rule (the default
// matches every id).
func (q *QuotaRule) Matches(id map[string]string) bool {
	if q.Default() {
		return true
	}
	if len(id) != len(q.Match) {
		return false
	}
	for i := range q.Match {
		m := &q.Match[i]
		v, ok := id[m.Key]
		if !ok || !m.matches(v) {
			return false
		}
	}
	return true
}

func (m *BucketMatch) matches(v string) bool {
	switch {
	case m.re != nil:
		return m.re.MatchString(v)
	case m.wild != nil:
		return m.wild.match([]byte(v))
	}
	return v == m.Value
}

// MatchQuota returns the quota rule for a bucket id that a client of
// domain reports: the first of the domain's quota_buckets, in file order,
// whose keys are exactly the id's and whose values match, else the
// domain's default, else nil.
func (c *Config) MatchQuota(domain string, id map[string]string) *QuotaRule {
	if c == nil {
		return nil
	}
	for _, q := range c.quotas[domain] {
		if q.Matches(id) {
			return q
		}
	}
	return nil
}

// QuotaRules returns every quota rule, domains sorted, each domain's in
// file order.
func (c *Config) QuotaRules() []*QuotaRule {
	if c == nil {
		return nil
	}
	var out []*QuotaRule
	for _, d := range c.names {
		out = append(out, c.quotas[d]...)
	}
	return out
}

// HasQuota reports whether any domain has quota_buckets.
func (c *Config) HasQuota() bool {
	if c == nil {
		return false
	}
	for _, qs := range c.quotas {
		if len(qs) > 0 {
			return true
		}
	}
	return false
}

// String writes the rule as Dump does, without the newline.
func (q *QuotaRule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s quota_buckets[%d] ", q.Domain, q.Index)
	if q.Default() {
		b.WriteString("default")
	} else {
		b.WriteByte('{')
		for i, m := range q.Match {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(m.Key)
			if m.Regex != "" {
				b.WriteString("~")
				b.WriteString(m.Regex)
			} else {
				b.WriteByte('=')
				b.WriteString(m.Value)
			}
		}
		b.WriteByte('}')
	}
	b.WriteString(": ")
	if q.Policy.Limited() {
		fmt.Fprintf(&b, "unit=%s requests_per_unit=%d, burst: %d, ", q.Unit, q.RequestsPerUnit, q.Capacity())
		if q.UnitMultiplier > 1 {
			fmt.Fprintf(&b, "unit_multiplier: %d, ", q.UnitMultiplier)
		}
	}
	fmt.Fprintf(&b, "policy: %s", q.Policy)
	if q.Name != "" {
		fmt.Fprintf(&b, ", name: %s", q.Name)
	}
	return b.String()
}

// The keys of a quota_buckets item and of its rate_limit.
var (
	quotaKeys          = []string{"name", "bucket", "rate_limit", "policy"}
	quotaRateLimitKeys = []string{"unit", "requests_per_unit", "unit_multiplier", "burst"}
	bucketValueKeys    = []string{"value_regex"}
)

// quotaBuckets reads a domain's quota_buckets list.
func (p *fileParser) quotaBuckets(f field, d *domainState) {
	seq := p.deref(f.val)
	if seq == nil || isNull(seq) {
		return
	}
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq.Line, "quota_buckets: want a list of bucket rules, got %s", describe(seq))
		return
	}
	for i, item := range seq.Content {
		item = p.deref(item)
		if item == nil || p.aborted {
			return
		}
		where := "quota_buckets[" + strconv.Itoa(i+1) + "]"
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "%s: want a map with bucket, rate_limit and policy, got %s", where, describe(item))
			continue
		}
		if q := p.quotaRule(item, where); q != nil {
			d.addQuota(p, q, item.Line)
		}
	}
}

// quotaRule reads one quota_buckets item; nil when it has a problem
// (reported).
func (p *fileParser) quotaRule(item *yaml.Node, where string) *QuotaRule {
	fs := p.fields(p.pairs(item), quotaKeys, where)
	ok := true
	q := &QuotaRule{Domain: p.domain, Source: p.source(item)}
	q.Name, _ = p.str(fs["name"], where+": name")
	if f, present := fs["bucket"]; present {
		q.Match, ok = p.bucketMatch(f, where)
	}
	if f, present := fs["policy"]; present {
		s, _ := p.str(f, where+": policy")
		switch s {
		case "fair_share":
			q.Policy = FairShare
		case "static":
			q.Policy = Static
		case "deny_all":
			q.Policy = DenyAll
		case "allow_all":
			q.Policy = AllowAll
		default:
			p.errorf(f.val.Line, "%s: policy: unknown policy %q (want fair_share, static, deny_all or allow_all)", where, s)
			ok = false
		}
	}
	rl, hasLimit := fs["rate_limit"]
	switch {
	case !ok:
	case q.Policy.Limited() && !hasLimit:
		p.errorf(item.Line, "%s: policy %s needs a rate_limit (unit and requests_per_unit)", where, q.Policy)
		ok = false
	case !q.Policy.Limited() && hasLimit:
		p.errorf(rl.key.Line, "%s: rate_limit has no effect with policy %s", where, q.Policy)
		ok = false
	case hasLimit:
		ok = p.quotaLimit(rl, q, where+": rate_limit")
	}
	if !ok {
		return nil
	}
	return q
}

// quotaLimit reads a quota rule's rate_limit into q.
func (p *fileParser) quotaLimit(f field, q *QuotaRule, where string) bool {
	m := p.deref(f.val)
	if m == nil || m.Kind != yaml.MappingNode {
		line := f.key.Line
		if m != nil {
			line = m.Line
		}
		got := "nothing"
		if m != nil {
			got = describe(m)
		}
		p.errorf(line, "%s: want a map with unit and requests_per_unit, got %s", where, got)
		return false
	}
	fs := p.fields(p.pairs(m), quotaRateLimitKeys, where)
	ok := true
	unit, unitOK := p.str(fs["unit"], where+": unit")
	switch u, valid := ParseUnit(unit); {
	case !unitOK:
		ok = false
	case unit == "":
		p.errorf(m.Line, "%s: missing unit (second, minute, hour, day, week, month or year)", where)
		ok = false
	case !valid:
		p.errorf(fs["unit"].val.Line, "%s: invalid unit %q (want second, minute, hour, day, week, month or year)", where, unit)
		ok = false
	default:
		q.Unit = u
	}
	n, isNum := p.uint32Field(fs["requests_per_unit"], where+": requests_per_unit")
	switch {
	case !isNum:
		ok = false
	case n == 0:
		line := m.Line
		if rf, present := fs["requests_per_unit"]; present {
			line = rf.val.Line
		}
		p.errorf(line, "%s: requests_per_unit must be at least 1 (policy deny_all denies every request)", where)
		ok = false
	}
	q.RequestsPerUnit = n
	q.UnitMultiplier = 1
	if mf, present := fs["unit_multiplier"]; present {
		v, isNum := p.uint32Field(mf, where+": unit_multiplier")
		switch {
		case !isNum:
			ok = false
		case v == 0:
			p.errorf(mf.val.Line, "%s: unit_multiplier must be at least 1", where)
			ok = false
		case q.Unit.Seconds()*int64(v) > maxWindowSeconds:
			p.errorf(mf.val.Line, "%s: unit_multiplier %d makes a window longer than %d seconds", where, v, maxWindowSeconds)
			ok = false
		default:
			q.UnitMultiplier = v
		}
	}
	if bf, present := fs["burst"]; present {
		v, isNum := p.uint32Field(bf, where+": burst")
		switch {
		case !isNum:
			ok = false
		case v == 0:
			p.errorf(bf.val.Line, "%s: burst must be at least 1 (leave it out to use requests_per_unit)", where)
			ok = false
		}
		q.Burst = v
	}
	return ok
}

// bucketMatch reads a quota rule's bucket: a map of bucket id keys to a
// value (exact or wildcard) or {value_regex: ...}.
func (p *fileParser) bucketMatch(f field, where string) ([]BucketMatch, bool) {
	where += ": bucket"
	m := p.deref(f.val)
	if m == nil || isNull(m) || m.Kind != yaml.MappingNode || len(m.Content) == 0 {
		got := "nothing"
		if m != nil && !isNull(m) {
			got = describe(m)
			if m.Kind == yaml.MappingNode {
				got = "an empty map"
			}
		}
		line := f.key.Line
		if m != nil {
			line = m.Line
		}
		p.errorf(line, "%s: want a map of bucket id keys to values, got %s (leave bucket out for the domain's default)", where, got)
		return nil, false
	}
	var out []BucketMatch
	seen := map[string]bool{}
	ok := true
	for _, kv := range p.pairs(m) {
		k := p.deref(kv.key)
		if k == nil || k.Kind != yaml.ScalarNode || k.Value == "" {
			line := kv.key.Line
			p.errorf(line, "%s: want a non-empty string key, got %s", where, describe(kv.key))
			ok = false
			continue
		}
		if seen[k.Value] {
			if k.Tag != "!!merged" {
				p.errorf(k.Line, "%s: duplicate key %q", where, k.Value)
				ok = false
			}
			continue
		}
		seen[k.Value] = true
		bm := BucketMatch{Key: k.Value}
		v := p.deref(kv.val)
		switch {
		case v == nil:
			return nil, false
		case v.Kind == yaml.ScalarNode && !isNull(v):
			bm.Value = v.Value
			if strings.Contains(v.Value, "*") {
				bm.wild = newWildcard(v.Value, nil)
			}
		case v.Kind == yaml.MappingNode:
			vf := p.fields(p.pairs(v), bucketValueKeys, where+": "+k.Value)
			rf, present := vf["value_regex"]
			if !present {
				p.errorf(v.Line, "%s: %s: want a value or {value_regex: ...}", where, k.Value)
				ok = false
				continue
			}
			pattern, _ := p.str(rf, where+": "+k.Value+": value_regex")
			re, msg := compileValueRegex(pattern)
			if msg != "" {
				p.errorf(rf.val.Line, "%s: %s: value_regex: %s", where, k.Value, msg)
				ok = false
				continue
			}
			bm.Regex, bm.re = pattern, re
		default:
			p.errorf(v.Line, "%s: %s: want a value or {value_regex: ...}, got %s", where, k.Value, describe(v))
			ok = false
			continue
		}
		out = append(out, bm)
	}
	slices.SortFunc(out, func(a, b BucketMatch) int { return strings.Compare(a.Key, b.Key) })
	return out, ok
}

// addQuota appends a quota rule to its domain, checking it against the
// rules before it: one default, last, and no two rules that match the
// same bucket ids.
func (d *domainState) addQuota(p *fileParser, q *QuotaRule, line int) {
	if len(d.quotas) >= MaxQuotaRules {
		if !d.quotasFull {
			p.errorf(line, "quota_buckets: more than %d rules in domain %q", MaxQuotaRules, q.Domain)
			d.quotasFull = true
		}
		return
	}
	for _, prev := range d.quotas {
		switch {
		case prev.Default():
			p.errorf(line, "quota_buckets[%d]: comes after the domain's default (at %s), which matches every bucket id first; put the default last", len(d.quotas)+1, prev.Source)
			return
		case !q.Default() && sameMatch(prev.Match, q.Match):
			p.errorf(line, "quota_buckets[%d]: matches the same bucket ids as the rule at %s, which wins", len(d.quotas)+1, prev.Source)
			return
		}
	}
	q.Index = len(d.quotas) + 1
	d.quotas = append(d.quotas, q)
}

func sameMatch(a, b []BucketMatch) bool {
	return slices.EqualFunc(a, b, func(x, y BucketMatch) bool {
		return x.Key == y.Key && x.Value == y.Value && x.Regex == y.Regex
	})
}
