package rules

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
)

// Source is the rules of one domain given as data, already decoded, rather
// than as YAML: an xDS RateLimitConfig, for example. Build checks it exactly
// as Parse checks a rule file.
type Source struct {
	// Name names the source in errors and in each Limit.Source, for
	// example `config "web" (domain web)`. It must not be empty.
	Name string
	// Domain is the domain the descriptors belong to.
	Domain string
	// Descriptors are the domain's top-level descriptors.
	Descriptors []Descriptor
}

// Descriptor is one descriptor of a Source: the `descriptors` item of the
// YAML format, field for field.
type Descriptor struct {
	Key   string
	Value string
	// RateLimit is the descriptor's rule; nil sets none, as an absent or
	// empty rate_limit does in YAML.
	RateLimit   *RateLimit
	Descriptors []Descriptor

	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool

	// Metadata is the rule's metadata, with the value types Limit.Metadata
	// allows. Build keeps the map itself, so the caller must not modify
	// it afterwards. Nil when absent.
	Metadata map[string]any
}

// RateLimit is the rate_limit of a Descriptor. Zero values mean absent:
// data has no way to tell `burst: 0` from no burst, so a zero Burst or
// UnitMultiplier takes the default instead of being an error as in YAML.
type RateLimit struct {
	// Unit is a unit's name, in any case ("second", "MINUTE"); "" is none,
	// which only an unlimited rule may have.
	Unit            string
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string
	// Algorithm is an algorithm's YAML name; "" is fixed_window.
	Algorithm string
	// Burst is the token bucket's capacity; 0 is RequestsPerUnit.
	Burst uint32
	// UnitMultiplier makes a window of that many units; 0 is 1.
	UnitMultiplier uint32
}

// Build makes a Config from rules given as data, with the checks Parse
// applies to YAML: it reports every problem, each an *Error whose File is
// the Source's Name and whose Line is 0, joined with errors.Join; on error
// the Config is nil. Two sources with the same domain are an error unless
// opts.MergeDomains is set, as two files are.
func Build(srcs []Source, opts Options) (*Config, error) {
	b := &builder{opts: opts, domains: map[string]*domainState{}}
	for i := range srcs {
		b.source(&srcs[i])
	}
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	return b.build(), nil
}

// source adds the descriptors of one Source.
func (b *builder) source(s *Source) {
	errorf := func(format string, args ...any) {
		b.errs = append(b.errs, &Error{File: s.Name, Msg: fmt.Sprintf(format, args...)})
	}
	d, msg := b.domain(s.Domain, s.Name, s.Name)
	if msg != "" {
		errorf("%s", msg)
		if d == nil {
			return
		}
	}
	b.descriptors(s, s.Descriptors, d.root, s.Domain, nil, errorf)
}

// descriptors adds a list of data descriptors below parent.
func (b *builder) descriptors(s *Source, list []Descriptor, parent *node, parentKey string, levels []string, errorf func(string, ...any)) {
	for i := range list {
		d := &list[i]
		if msg, stop := b.count(len(levels) + 1); msg != "" || stop {
			if msg != "" {
				errorf("descriptor %d of %q: %s", i+1, parentKey, msg)
			}
			if stop {
				return
			}
			continue
		}
		n := descriptorNames(parentKey, d.Key, d.Value, i+1)
		levels := append(levels[:len(levels):len(levels)], n.composite)
		if d.Key == "" {
			errorf("%s: %s", n.where, msgEmptyKey)
		}
		flags := descriptorFlags{
			shadow:         d.ShadowMode,
			quota:          d.QuotaMode,
			detailed:       d.DetailedMetric,
			valueToMetric:  d.ValueToMetric,
			shareThreshold: d.ShareThreshold,
		}
		// A data descriptor has no line: name it by its place instead,
		// which also tells two descriptors with one key apart.
		source := fmt.Sprintf("%s, descriptor %d of %q", s.Name, i+1, parentKey)
		nd := newNode(n.composite, source)
		nd.descKey = d.Key
		nd.valueToMetric = flags.valueToMetric
		nd.shareThreshold = flags.shareThreshold
		if msg := checkShareThreshold(flags, n.composite, false); msg != "" {
			errorf("%s: %s", n.where, msg)
		}
		if d.RateLimit != nil {
			spec := d.RateLimit.spec()
			l, problems := newLimit(spec, n.fullKey, source, flags, b.opts)
			for _, p := range problems {
				errorf("%s: rate_limit: %s", n.where, p.msg)
			}
			if l != nil {
				l.Domain, l.Levels = s.Domain, levels
				if len(d.Metadata) > 0 {
					l.Metadata = d.Metadata
				}
			}
			nd.limit = l
		}
		if d.Key != "" {
			if msg := addChild(parent, nd); msg != "" {
				errorf("%s: %s", n.where, msg)
			}
		}
		b.descriptors(s, d.Descriptors, nd, n.fullKey, levels, errorf)
	}
}

// spec is the limitSpec of a data rate limit: zero values are absent.
func (r *RateLimit) spec() limitSpec {
	return limitSpec{
		unit:          r.Unit,
		hasUnit:       r.Unit != "",
		requests:      r.RequestsPerUnit,
		unlimited:     r.Unlimited,
		name:          r.Name,
		replaces:      r.Replaces,
		algorithm:     r.Algorithm,
		hasAlgorithm:  r.Algorithm != "",
		burst:         r.Burst,
		hasBurst:      r.Burst != 0,
		multiplier:    r.UnitMultiplier,
		hasMultiplier: r.UnitMultiplier != 0,
	}
}

// The checks below are shared by Parse and Build, so that YAML and data
// are held to the same rules and described in the same words. Each returns
// its problems as text without a place; the caller adds the file and line,
// or the source's name.

// msgEmptyKey is the problem of a descriptor without a key.
const msgEmptyKey = "empty key"

// names are how a descriptor is named: its composite key ("key" or
// "key_value"), its full key ("domain.key_value.key2", as in FullKey) and
// how messages name it.
type names struct {
	composite, fullKey, where string
}

// descriptorNames names the index-th (1-based) descriptor of parentKey.
func descriptorNames(parentKey, key, value string, index int) names {
	composite := key
	if value != "" {
		composite += "_" + value
	}
	n := names{composite: composite, fullKey: parentKey + "." + composite}
	if key == "" {
		n.where = fmt.Sprintf("descriptor %d of %q", index, parentKey)
	} else {
		n.where = fmt.Sprintf("descriptor %q", n.fullKey)
	}
	return n
}

// domain returns the state of a domain for a source (a file, or a Source
// named name) that defines it, and a problem: an empty domain (the state
// is then nil) or a duplicate one (the state is then a throwaway tree, so
// that the descriptors are still checked).
func (b *builder) domain(domain, name, source string) (*domainState, string) {
	if domain == "" {
		return nil, "empty domain"
	}
	d := b.domains[domain]
	switch {
	case d == nil:
		d = &domainState{root: newNode(domain, source), file: name}
		b.domains[domain] = d
	case !b.opts.MergeDomains:
		return &domainState{root: newNode(domain, "")},
			fmt.Sprintf("duplicate domain %q (also in %s; set MERGE_DOMAIN_CONFIG=true to merge)", domain, d.file)
	}
	return d, ""
}

// checkShareThreshold returns the problem of a share_threshold set on a
// descriptor whose value is neither a wildcard nor a value_regex, or "".
func checkShareThreshold(flags descriptorFlags, composite string, regex bool) string {
	if flags.shareThreshold && !regex && !strings.Contains(composite, "*") {
		return "share_threshold needs a wildcard value (containing '*') or a value_regex, so that the values it matches can share one counter"
	}
	return ""
}

// msgOneAndList is the problem of a descriptor with both forms of limit.
const msgOneAndList = "give rate_limit or rate_limits, not both"

// regexMark starts the value part of a value_regex descriptor's composite
// key ("path_~^/api/"): it names the descriptor in statistics, Dump and
// messages, and stands in for the value in the cache key of a
// share_threshold. The node is never found by an exact lookup of a
// request's value, whatever that value is (see Config.Match).
const regexMark = "~"

// MaxRegexLen is the longest value_regex, in bytes. Go's regular
// expressions (RE2) match in time linear in the value's length times the
// pattern's size; request values are bounded by the service, patterns here.
const MaxRegexLen = 1024

// compileValueRegex compiles a value_regex to match whole values only, or
// returns the problem.
func compileValueRegex(pattern string) (*regexp.Regexp, string) {
	switch {
	case pattern == "":
		return nil, "empty pattern (leave value_regex out to match any value by key)"
	case len(pattern) > MaxRegexLen:
		return nil, fmt.Sprintf("pattern is %d bytes long, the limit is %d", len(pattern), MaxRegexLen)
	}
	// Compiled alone first, so that a problem is reported in the
	// pattern's own terms.
	re, err := regexp.Compile(pattern)
	if err == nil {
		// The pattern must match the whole value, as value and
		// wildcards do: "admin" must not match "not-an-admin".
		re, err = regexp.Compile(`^(?:` + pattern + `)$`)
	}
	if err != nil {
		msg := err.Error()
		var se *syntax.Error
		if errors.As(err, &se) {
			msg = fmt.Sprintf("%s: %q", se.Code, se.Expr)
		}
		return nil, fmt.Sprintf("invalid regular expression %q: %s", pattern, msg)
	}
	return re, ""
}

// checkListLen returns the problem of a rate_limits list of n items, or "".
func checkListLen(n int) string {
	switch {
	case n == 0:
		return "empty list (leave rate_limits out to set no limit)"
	case n > MaxLimits:
		return fmt.Sprintf("%d limits, the most a descriptor may have is %d", n, MaxLimits)
	}
	return ""
}

// listProblem is a problem of the index-th (0-based) limit of a list.
type listProblem struct {
	index int
	msg   string
}

// linkList makes the limits of one rate_limits list siblings (Limits,
// Index, StatLevel) and returns the problems of the list as a whole: two
// limits that would count in one cache key (same algorithm and window),
// or whose statistics would share a name.
func linkList(list []*Limit) []listProblem {
	var probs []listProblem
	for i, l := range list {
		l.Limits, l.Index, l.StatLevel = list, i, statLevel(l)
		for j, prev := range list[:i] {
			switch {
			case !l.Unlimited && !prev.Unlimited && l.Algorithm == prev.Algorithm &&
				l.Unit == prev.Unit && l.UnitMultiplier == prev.UnitMultiplier && l.Shadow == prev.Shadow:
				probs = append(probs, listProblem{i, fmt.Sprintf(
					"same algorithm and window as rate_limits[%d] (%s, %s); they would count in one key, keep the stricter",
					j+1, l.Algorithm, windowName(l))})
			case l.StatLevel == prev.StatLevel:
				probs = append(probs, listProblem{i, fmt.Sprintf(
					"its statistics would be named %q as those of rate_limits[%d]; give the limits different names", l.StatLevel, j+1)})
			}
		}
	}
	return probs
}

// statLevel is a limit's Limit.StatLevel within a list: an unnamed shadow
// limit's ends with "_shadow", as its key does, so that it may shadow a
// limit of its window without a name of its own.
func statLevel(l *Limit) string {
	switch {
	case l.Name != "":
		return l.Name
	case l.Unlimited:
		return "unlimited"
	}
	s := windowName(l)
	if l.Algorithm != FixedWindow {
		s += "_" + l.Algorithm.String()
	}
	if l.Shadow {
		s += "_shadow"
	}
	return s
}

// windowName writes a limit's window as "minute" or "5_minute".
func windowName(l *Limit) string {
	u := strings.ToLower(l.Unit.String())
	if l.UnitMultiplier > 1 {
		return strconv.FormatUint(uint64(l.UnitMultiplier), 10) + "_" + u
	}
	return u
}

// checkStatLevels returns the problems of a list's statistics names that
// equal the composite key of a descriptor below n: their statistics would
// be counted under one name.
func checkStatLevels(list []*Limit, n *node) []string {
	var msgs []string
	for _, l := range list {
		if c := n.children[l.StatLevel]; c != nil {
			msgs = append(msgs, fmt.Sprintf(
				"the statistics of rate_limits[%d] (%q) would share a name with the descriptor at %s; give the limit a name",
				l.Index+1, l.StatLevel, c.source))
		}
	}
	return msgs
}

// all returns the limits of l's descriptor: its list, or l alone.
func all(l *Limit) []*Limit {
	if l.InList() {
		return l.Limits
	}
	return []*Limit{l}
}

// addChild adds n below parent, or returns the problem of a composite key
// parent already has.
func addChild(parent, n *node) string {
	if prev := parent.children[n.key]; prev != nil {
		return fmt.Sprintf("duplicate composite key (first defined at %s)", prev.source)
	}
	parent.add(n)
	return ""
}

// limitSpec is a rate_limit as read, from YAML or data, before it is
// checked.
type limitSpec struct {
	unit    string
	hasUnit bool
	// badUnit, badBurst and badMultiplier mark a field whose YAML could
	// not be read at all; that problem is reported already, so the
	// field's own checks are skipped.
	badUnit, badBurst, badMultiplier bool

	requests  uint32
	unlimited bool
	name      string
	replaces  []string
	// shadow is an item of rate_limits's shadow_mode (Limit.Shadow).
	shadow bool

	// hasAlgorithm, hasBurst and hasMultiplier are the field given (in
	// YAML, its key present, whatever its value).
	algorithm     string
	hasAlgorithm  bool
	burst         uint32
	hasBurst      bool
	multiplier    uint32
	hasMultiplier bool
}

// Fields of a rate_limit that a limitProblem may be about.
const (
	fieldLimit      = "" // the rate_limit as a whole
	fieldUnit       = "unit"
	fieldRequests   = "requests_per_unit"
	fieldReplaces   = "replaces"
	fieldAlgorithm  = "algorithm"
	fieldBurst      = "burst"
	fieldMultiplier = "unit_multiplier"
	fieldShadow     = "shadow_mode"
)

// limitProblem is one problem of a rate_limit: its text and what it is
// about, so that YAML can point at the line of that field's key or value
// (or at the index-th item of replaces).
type limitProblem struct {
	field   string
	atValue bool
	index   int
	msg     string
}

// limitCheck gathers the problems of one rate_limit as newLimit checks it.
type limitCheck struct {
	probs []limitProblem
	// ok is false once a problem makes the Limit unusable.
	ok bool
}

// report adds a problem that makes the Limit unusable.
func (c *limitCheck) report(field string, atValue bool, format string, args ...any) {
	c.probs = append(c.probs, limitProblem{field: field, atValue: atValue, msg: fmt.Sprintf(format, args...)})
	c.ok = false
}

// newLimit checks a rate_limit and builds its Limit. It returns the Limit
// (nil when a problem makes it unusable) and every problem found.
func newLimit(s limitSpec, fullKey, source string, flags descriptorFlags, opts Options) (*Limit, []limitProblem) {
	c := &limitCheck{ok: !s.badUnit && !s.badBurst && !s.badMultiplier}
	l := &Limit{
		FullKey:         fullKey,
		Source:          source,
		RequestsPerUnit: s.requests,
		UnitMultiplier:  1,
		Name:            s.name,
		Unlimited:       s.unlimited,
		Shadow:          s.shadow,
		ShadowMode:      flags.shadow,
		QuotaMode:       flags.quota,
		DetailedMetric:  flags.detailed,
		ValueToMetric:   flags.valueToMetric,
		ShareThreshold:  flags.shareThreshold,
	}
	c.unit(s, l)
	c.replaces(s, l)
	if s.unlimited {
		c.unlimited(s)
	} else {
		c.algorithm(s, l, opts)
	}
	if !c.ok {
		return nil, c.probs
	}
	return l, c.probs
}

// unit checks the unit and sets l's.
func (c *limitCheck) unit(s limitSpec, l *Limit) {
	switch {
	case s.badUnit:
	case s.unlimited && s.unit != "":
		c.report(fieldUnit, false, "unit %q given with unlimited: true; an unlimited rule has no unit", s.unit)
	case s.unlimited:
	case !s.hasUnit || s.unit == "":
		c.report(fieldUnit, false, "missing unit (second, minute, hour, day, week, month or year)")
	default:
		u, valid := ParseUnit(s.unit)
		if !valid {
			c.report(fieldUnit, true, "invalid unit %q (want second, minute, hour, day, week, month or year)", s.unit)
		}
		l.Unit = u
	}
}

// replaces checks the names the limit replaces and sets l's.
func (c *limitCheck) replaces(s limitSpec, l *Limit) {
	for i, name := range s.replaces {
		switch {
		case name == "":
			c.probs = append(c.probs, limitProblem{field: fieldReplaces, index: i, msg: "replaces: empty name"})
		case name == s.name:
			c.probs = append(c.probs, limitProblem{field: fieldReplaces, index: i,
				msg: fmt.Sprintf("replaces: a rule cannot replace its own name %q", name)})
		default:
			l.Replaces = append(l.Replaces, name)
		}
	}
	if s.shadow && len(s.replaces) > 0 {
		// Dropping another rule's limit would change what is enforced,
		// which a shadow limit never does.
		c.report(fieldShadow, false, "a shadow limit cannot replace other limits: that would change what is enforced")
	}
}

// unlimited checks that an unlimited rule sets nothing that would have no
// effect.
func (c *limitCheck) unlimited(s limitSpec) {
	if s.shadow {
		c.report(fieldShadow, false, "shadow_mode has no effect with unlimited: true")
	}
	for _, f := range []struct {
		name    string
		present bool
	}{{fieldAlgorithm, s.hasAlgorithm}, {fieldBurst, s.hasBurst}, {fieldMultiplier, s.hasMultiplier}} {
		if f.present {
			c.report(f.name, false, "%s has no effect with unlimited: true", f.name)
		}
	}
}

// algorithm checks the algorithm and what depends on it (burst,
// unit_multiplier, the sliding log's size, the store's support), and sets
// l's.
func (c *limitCheck) algorithm(s limitSpec, l *Limit, opts Options) {
	alg, valid := ParseAlgorithm(s.algorithm)
	if !valid {
		c.report(fieldAlgorithm, true, "unknown algorithm %q (want %s)", s.algorithm, algorithmNames(func(Algorithm) bool { return true }))
	}
	l.Algorithm = alg
	if s.hasBurst && !s.badBurst {
		switch {
		case valid && !alg.HasBurst():
			c.report(fieldBurst, false, "burst is only for algorithm %s", algorithmNames(Algorithm.HasBurst))
		case s.burst == 0:
			c.report(fieldBurst, true, "burst must be at least 1 (leave it out to use requests_per_unit)")
		}
		l.Burst = s.burst
	}
	if s.hasMultiplier && !s.badMultiplier {
		switch {
		case s.multiplier == 0:
			c.report(fieldMultiplier, true, "unit_multiplier must be at least 1")
		case l.Unit.Seconds()*int64(s.multiplier) > maxWindowSeconds:
			c.report(fieldMultiplier, true, "unit_multiplier %d makes a window longer than %d seconds", s.multiplier, maxWindowSeconds)
		default:
			l.UnitMultiplier = s.multiplier
		}
	}
	if valid && alg.PerHit() && s.requests > MaxSlidingLog {
		c.report(fieldRequests, true,
			"%s keeps one timestamp per request; requests_per_unit %d is above its maximum of %d (use sliding_window)",
			alg, s.requests, MaxSlidingLog)
	}
	if valid && opts.Supports != nil && !opts.Supports(alg) {
		store, why := cmp.Or(opts.StoreName, "configured"), cmp.Or(opts.Unsupported, "it cannot run it atomically")
		c.report(fieldAlgorithm, true, "algorithm %s is not supported by the %s store (%s)", alg, store, why)
	}
}
