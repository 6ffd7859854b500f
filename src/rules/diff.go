package rules

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ChangeKind says how a rule, a level of a rule tree or a domain differs
// between two configs.
type ChangeKind uint8

// The kinds of Change.
const (
	// Added is a rule or domain only in the new config.
	Added ChangeKind = iota + 1
	// Removed is a rule or domain only in the old config.
	Removed
	// Changed is a rule, or a level without a rule, in both configs
	// whose settings differ.
	Changed
)

// String returns "added", "removed" or "changed".
func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Removed:
		return "removed"
	case Changed:
		return "changed"
	}
	return "unknown"
}

// Change is one difference found by Diff.
//
// A rule is known by its domain and the composite keys of its chain
// (Limit.Domain, Limit.Levels): the same descriptor path in both configs is
// the same rule, whichever file or line holds it. Its cache keys depend
// only on that path, its window and its algorithm, so a rule that Diff
// does not report keeps its counters across a reload.
type Change struct {
	Kind ChangeKind
	// Domain is the domain of the change. Levels is the chain of composite
	// keys ("key" or "key_value") of the rule or level; empty when the
	// change is a whole domain added or removed.
	Domain string
	Levels []string
	// Old and New are the rule in the old and the new config; nil where
	// there is none (a rule added or removed, a domain, a level without a
	// rule, a quota rule).
	Old, New *Limit
	// Quota is the quota rule added or removed (in the new or the old
	// config); nil for the other changes. A quota rule is known by its
	// bucket match and settings: a changed one is removed and added. When
	// only the order of a domain's quota rules changed, which decides the
	// first match, Kind is Changed and Quota nil, with Fields naming
	// quota_buckets.
	Quota *QuotaRule
	// Fields lists the settings that differ, in Dump's order: every
	// difference of a rule in both configs, and for the other kinds the
	// value_to_metric and share_threshold flags of a level present in both
	// (they apply to the rules below that level too).
	Fields []FieldChange
	// Restarts reports that the counters of the rule, or of every rule
	// below the level, start afresh with the new config: the window
	// (unit × unit_multiplier), the algorithm or a share_threshold on the
	// way changed, and with it the cache keys.
	Restarts bool
}

// FieldChange is one setting that differs, named as in the YAML, with its
// old and new values written as Dump writes them.
type FieldChange struct {
	Name     string
	Old, New string
}

// Key returns the change's descriptor path as Limit.FullKey writes it
// ("domain.key_value.key2"), or the domain alone.
func (c Change) Key() string {
	if c.New != nil {
		return c.New.FullKey
	}
	if c.Old != nil {
		return c.Old.FullKey
	}
	if len(c.Levels) == 0 {
		return c.Domain
	}
	return c.Domain + "." + strings.Join(c.Levels, ".")
}

// String returns the change on one line: "+ " and the rule's Dump line for
// a rule added, "- " and the old rule's Dump line for one removed, "~ ",
// the path and each field as "name old -> new" for a change, and "+ domain
// d" or "- domain d" for a domain.
func (c Change) String() string {
	var b strings.Builder
	switch c.Kind {
	case Added:
		b.WriteString("+ ")
	case Removed:
		b.WriteString("- ")
	default:
		b.WriteString("~ ")
	}
	var rule *Limit
	switch c.Kind {
	case Added:
		rule = c.New
	case Removed:
		rule = c.Old
	}
	switch {
	case c.Quota != nil:
		b.WriteString(c.Quota.String())
	case rule != nil:
		var line strings.Builder
		for _, l := range all(rule) {
			writeLimit(&line, l)
		}
		// writeLimit ends each line; the limits of a list go on one
		// line, and Fields, if any, too.
		b.WriteString(strings.ReplaceAll(strings.TrimSuffix(line.String(), "\n"), "\n", "; "))
	case len(c.Levels) == 0:
		b.WriteString("domain ")
		b.WriteString(c.Domain)
	default:
		b.WriteString(c.Key())
	}
	for i, f := range c.Fields {
		switch {
		case i > 0:
			b.WriteString(", ")
		case c.Kind == Changed:
			b.WriteString(": ")
		default:
			b.WriteString("; level ")
		}
		fmt.Fprintf(&b, "%s %s -> %s", f.Name, f.Old, f.New)
	}
	if c.Restarts {
		b.WriteString(" (counters restart)")
	}
	return b.String()
}

// Diff returns what differs between two configs, in Dump order (domains
// sorted, then depth first with keys sorted; a domain before its rules):
// domains added and removed, rules added and removed, rules whose settings
// changed, and levels without a rule whose value_to_metric or
// share_threshold changed. It returns nil when the configs behave the
// same. Where a rule's file or line moved, nothing is reported. A nil
// config is an empty one.
func Diff(from, to *Config) []Change {
	var changes []Change
	var names []string
	if from != nil {
		names = append(names, from.names...)
	}
	if to != nil {
		names = append(names, to.names...)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, d := range names {
		a, b := from.root(d), to.root(d)
		switch {
		case b == nil:
			changes = append(changes, Change{Kind: Removed, Domain: d})
		case a == nil:
			changes = append(changes, Change{Kind: Added, Domain: d})
		}
		changes = diffLevels(changes, d, flatten(a, nil, nil), flatten(b, nil, nil))
		changes = diffQuotas(changes, d, from.quotaRules(d), to.quotaRules(d))
	}
	return changes
}

func (c *Config) quotaRules(domain string) []*QuotaRule {
	if c == nil {
		return nil
	}
	return c.quotas[domain]
}

// quotaIdentity is a quota rule's bucket match and settings: what makes
// two rules behave the same, whatever their place.
func quotaIdentity(q *QuotaRule) string {
	_, rest, _ := strings.Cut(q.String(), "] ")
	return rest
}

// diffQuotas appends the quota rules of a domain removed and added, or a
// change of their order.
func diffQuotas(changes []Change, domain string, from, to []*QuotaRule) []Change {
	ids := func(qs []*QuotaRule) []string {
		out := make([]string, len(qs))
		for i, q := range qs {
			out[i] = quotaIdentity(q)
		}
		return out
	}
	a, b := ids(from), ids(to)
	if slices.Equal(a, b) {
		return changes
	}
	n := len(changes)
	for i, id := range a {
		if !slices.Contains(b, id) {
			changes = append(changes, Change{Kind: Removed, Domain: domain, Quota: from[i]})
		}
	}
	for i, id := range b {
		if !slices.Contains(a, id) {
			changes = append(changes, Change{Kind: Added, Domain: domain, Quota: to[i]})
		}
	}
	if len(changes) == n {
		changes = append(changes, Change{Kind: Changed, Domain: domain,
			Fields: []FieldChange{{Name: "quota_buckets", Old: "order " + strings.Join(a, "; "), New: "order " + strings.Join(b, "; ")}}})
	}
	return changes
}

// root returns the tree of a domain, nil when there is none.
func (c *Config) root(domain string) *node {
	if c == nil {
		return nil
	}
	return c.domains[domain]
}

// level is one node of a tree with its path from the domain.
type level struct {
	levels []string
	n      *node
}

// flatten appends the nodes below n in Dump order, which is the order of
// their paths compared with slices.Compare: a parent before its children,
// siblings sorted by composite key.
func flatten(n *node, path []string, out []level) []level {
	if n == nil {
		return out
	}
	keys := make([]string, 0, len(n.children))
	for k := range n.children {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p := append(slices.Clip(path), k)
		out = append(out, level{levels: p, n: n.children[k]})
		out = flatten(n.children[k], p, out)
	}
	return out
}

// diffLevels merges two flattened trees of one domain, both in Dump order,
// and appends their differences.
func diffLevels(changes []Change, domain string, from, to []level) []Change {
	for len(from) > 0 || len(to) > 0 {
		var c int
		switch {
		case len(from) == 0:
			c = 1
		case len(to) == 0:
			c = -1
		default:
			c = slices.Compare(from[0].levels, to[0].levels)
		}
		switch {
		case c < 0:
			if l := from[0].n.limit; l != nil {
				changes = append(changes, Change{Kind: Removed, Domain: domain, Levels: from[0].levels, Old: l})
			}
			from = from[1:]
		case c > 0:
			if l := to[0].n.limit; l != nil {
				changes = append(changes, Change{Kind: Added, Domain: domain, Levels: to[0].levels, New: l})
			}
			to = to[1:]
		default:
			if ch, ok := diffNode(domain, to[0].levels, from[0].n, to[0].n); ok {
				changes = append(changes, ch)
			}
			from, to = from[1:], to[1:]
		}
	}
	return changes
}

// diffNode compares one level present in both trees. It reports false
// when nothing differs.
func diffNode(domain string, levels []string, a, b *node) (Change, bool) {
	c := Change{Domain: domain, Levels: levels, Old: a.limit, New: b.limit, Kind: Changed}
	both := a.limit != nil && b.limit != nil
	switch {
	case both && (a.limit.InList() || b.limit.InList()):
		c.Fields = listFields(a.limit, b.limit)
		c.Restarts = listRestarts(a.limit, b.limit)
	case both:
		c.Fields = limitFields(a.limit, b.limit)
		c.Restarts = !a.limit.Unlimited && !b.limit.Unlimited &&
			(a.limit.Window() != b.limit.Window() || a.limit.Algorithm != b.limit.Algorithm)
	case a.limit != nil:
		c.Kind = Removed
	case b.limit != nil:
		c.Kind = Added
	}
	// The flags of the level apply to every rule matched through it, the
	// rule of the level included, so they are compared on the node.
	c.Fields = appendField(c.Fields, "value_to_metric", strconv.FormatBool(a.valueToMetric), strconv.FormatBool(b.valueToMetric))
	c.Fields = appendField(c.Fields, "share_threshold", strconv.FormatBool(a.shareThreshold), strconv.FormatBool(b.shareThreshold))
	if a.shareThreshold != b.shareThreshold {
		// The wildcard pattern replaces, or stops replacing, the
		// request's value in the cache key.
		c.Restarts = true
	}
	if both {
		// Last, as in Dump.
		c.Fields = appendField(c.Fields, "metadata", metadata(a.limit), metadata(b.limit))
	}
	if c.Kind == Changed && len(c.Fields) == 0 {
		return Change{}, false
	}
	return c, true
}

// limitFields returns the settings of two rules that differ, in Dump's
// order, up to detailed_metric: the level flags and the metadata, which
// Dump writes after it, are diffNode's.
func limitFields(a, b *Limit) []FieldChange {
	var fs []FieldChange
	fs = appendField(fs, "unit", a.Unit.String(), b.Unit.String())
	fs = appendField(fs, "requests_per_unit", strconv.FormatUint(uint64(a.RequestsPerUnit), 10), strconv.FormatUint(uint64(b.RequestsPerUnit), 10))
	fs = appendField(fs, "shadow_mode", strconv.FormatBool(a.ShadowMode), strconv.FormatBool(b.ShadowMode))
	fs = appendField(fs, "quota_mode", strconv.FormatBool(a.QuotaMode), strconv.FormatBool(b.QuotaMode))
	fs = appendField(fs, "shadow", strconv.FormatBool(a.Shadow), strconv.FormatBool(b.Shadow))
	fs = appendField(fs, "unlimited", strconv.FormatBool(a.Unlimited), strconv.FormatBool(b.Unlimited))
	fs = appendField(fs, "algorithm", a.Algorithm.String(), b.Algorithm.String())
	fs = appendField(fs, "burst", burst(a), burst(b))
	fs = appendField(fs, "unit_multiplier", strconv.FormatUint(uint64(max(a.UnitMultiplier, 1)), 10), strconv.FormatUint(uint64(max(b.UnitMultiplier, 1)), 10))
	fs = appendField(fs, "name", strconv.Quote(a.Name), strconv.Quote(b.Name))
	fs = appendField(fs, "replaces", "["+strings.Join(a.Replaces, ",")+"]", "["+strings.Join(b.Replaces, ",")+"]")
	fs = appendField(fs, "detailed_metric", strconv.FormatBool(a.DetailedMetric), strconv.FormatBool(b.DetailedMetric))
	return fs
}

// listFields compares two rules of which one at least has rate_limits:
// their number of limits ("rate_limits", 0 for a single rate_limit), then
// the limits at each place, named "rate_limits[2].unit"; a limit present
// on one side only is the field "rate_limits[3]" from or to "none", with
// its StatLevel.
func listFields(a, b *Limit) []FieldChange {
	la, lb := a.Limits, b.Limits
	if !a.InList() {
		la = []*Limit{a}
	}
	if !b.InList() {
		lb = []*Limit{b}
	}
	var fs []FieldChange
	fs = appendField(fs, "rate_limits", strconv.Itoa(len(a.Limits)), strconv.Itoa(len(b.Limits)))
	for i := range max(len(la), len(lb)) {
		name := "rate_limits[" + strconv.Itoa(i+1) + "]"
		switch {
		case i >= len(la):
			fs = append(fs, FieldChange{Name: name, Old: "none", New: lb[i].StatLevel})
		case i >= len(lb):
			fs = append(fs, FieldChange{Name: name, Old: la[i].StatLevel, New: "none"})
		default:
			for _, f := range limitFields(la[i], lb[i]) {
				f.Name = name + "." + f.Name
				fs = append(fs, f)
			}
		}
	}
	return fs
}

// listRestarts reports whether counters of a rule with rate_limits (on
// either side) restart: the cache keys of a list's limits are their
// algorithms and windows (and, for a shadow limit, a mark of its own), in
// a form of their own, so a change between rate_limit and rate_limits
// restarts them, and so does a limit whose algorithm, window and role the
// old list had not. A shadow limit enforced in place of the limit of its
// window takes that limit's key, which goes on counting.
func listRestarts(a, b *Limit) bool {
	if !a.InList() || !b.InList() {
		return true
	}
	for _, nl := range b.Limits {
		if nl.Unlimited {
			continue
		}
		if !slices.ContainsFunc(a.Limits, func(ol *Limit) bool {
			return !ol.Unlimited && ol.Algorithm == nl.Algorithm && ol.Unit == nl.Unit && ol.UnitMultiplier == nl.UnitMultiplier && ol.Shadow == nl.Shadow
		}) {
			return true
		}
	}
	return false
}

// burst is a rule's token bucket capacity as Dump writes it, or "none"
// for the other algorithms, which have no burst.
func burst(l *Limit) string {
	if !l.Algorithm.HasBurst() {
		return "none"
	}
	return strconv.FormatUint(uint64(l.Capacity()), 10)
}

// metadata is a rule's metadata as Dump writes it, or "none".
func metadata(l *Limit) string {
	if l.Metadata == nil {
		return "none"
	}
	// json.Marshal sorts map keys, so equal maps give equal text.
	md, err := json.Marshal(l.Metadata)
	if err != nil {
		// Parse only builds values json.Marshal accepts.
		return fmt.Sprint(l.Metadata)
	}
	return string(md)
}

func appendField(fs []FieldChange, name, a, b string) []FieldChange {
	if a == b {
		return fs
	}
	return append(fs, FieldChange{Name: name, Old: a, New: b})
}
