// Package rules reads the rate limit rules (the YAML format of
// envoyproxy/ratelimit, plus per-rule algorithms) into an immutable tree
// and matches request descriptors against it. Rules already decoded from
// another form (xDS) are built into the same tree with the same checks.
//
// It is pure: it gets bytes or data and gives a tree or errors. It knows
// nothing of files on disk, gRPC, xDS, stores or statistics; provider
// finds the rules, service and limiter use the matches.
package rules

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// Config is a parsed set of rules: one descriptor tree per domain. It is
// immutable and safe for concurrent use. Build it with Parse; a nil *Config
// matches nothing.
type Config struct {
	domains map[string]*node
	names   []string // sorted
	limits  []*Limit // in Dump order
	// quotas are each domain's quota_buckets, in file order.
	quotas map[string][]*QuotaRule
}

// Match is the result of matching one descriptor.
type Match struct {
	// Limit is the matched rule, nil when nothing matched. It is shared by
	// every request: never modify it.
	Limit *Limit
	// StatKey is the key to count this hit under in the statistics:
	// Limit.FullKey, or a key that includes request values when the chain
	// asks for it with detailed_metric or value_to_metric, built exactly as
	// envoyproxy/ratelimit builds it.
	StatKey string
	// StatLevels are StatKey's levels after the domain when StatKey holds
	// request values; nil when StatKey is Limit.FullKey (see Limit.Levels).
	StatLevels []string
	// KeyEntries are the entries to build the cache key from. Nil means the
	// request's own entries. They differ when share_threshold makes every
	// value that matches a wildcard share one counter: the wildcard pattern
	// then stands in for the value, as in envoyproxy/ratelimit.
	KeyEntries []Entry
}

// node is one level of a descriptor tree.
type node struct {
	// key is the composite key, "key" or "key_value", as in FullKey.
	key string
	// descKey is the descriptor's key alone (Explain names it).
	descKey string
	source  string // file:line
	// children holds every child by composite key, wildcards included.
	children map[string]*node
	// wildcards are the children whose composite key contains '*', in
	// the order of the rule files; the first that matches wins.
	wildcards []*wildcard
	// wildFirst has bit b set when a wildcard child may match a composite
	// key starting with byte b, so most lookups skip the wildcard scan.
	wildFirst [4]uint64
	// regexes are the value_regex children, in the order of the rule
	// files; the first whose key and pattern match wins.
	regexes []*node
	// regex is this node's value_regex, matched against whole values of
	// entries whose key is entryKey; nil for other nodes. Every value it
	// matches starts with regexPrefix (its LiteralPrefix), which rules
	// out most values for the cost of a comparison.
	regex       *regexp.Regexp
	regexPrefix string
	entryKey    string
	// limit is the node's rule: its only limit, or the first of its
	// rate_limits (see Limit.Limits).
	limit          *Limit
	valueToMetric  bool
	shareThreshold bool
}

func newNode(key, source string) *node {
	return &node{key: key, source: source, children: map[string]*node{}}
}

func (n *node) add(child *node) {
	n.children[child.key] = child
	if child.regex != nil {
		n.regexes = append(n.regexes, child)
		return
	}
	if strings.Contains(child.key, "*") {
		w := newWildcard(child.key, child)
		n.wildcards = append(n.wildcards, w)
		if first := w.parts[0]; len(first) > 0 {
			n.wildFirst[first[0]/64] |= 1 << (first[0] % 64)
		} else {
			n.wildFirst = [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}
		}
	}
}

// collect appends the limits of n's subtree in a stable order: depth
// first, children sorted by composite key.
func (n *node) collect(out []*Limit) []*Limit {
	if n.limit != nil {
		out = append(out, all(n.limit)...)
	}
	keys := make([]string, 0, len(n.children))
	for k := range n.children {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = n.children[k].collect(out)
	}
	return out
}

// matchPattern returns the child matching entry e by pattern, or nil: the
// first wildcard matching the composite key k ("key_value"), else the
// first value_regex of e's key matching e's value.
func (n *node) matchPattern(k []byte, e *Entry) *node {
	// k is never empty: it holds at least the '_' between key and value.
	if n.wildFirst[k[0]/64]&(1<<(k[0]%64)) != 0 {
		for _, w := range n.wildcards {
			if w.match(k) {
				return w.node
			}
		}
	}
	for _, r := range n.regexes {
		if r.entryKey == e.Key && strings.HasPrefix(e.Value, r.regexPrefix) && r.regex.MatchString(e.Value) {
			return r
		}
	}
	return nil
}

// byKey returns the key-only child for an entry's key, never a
// value_regex (see exact).
func (n *node) byKey(key string) *node {
	if c := n.children[key]; c != nil && c.regex == nil {
		return c
	}
	return nil
}

// exact returns the child whose composite key is k, unless that child is a
// value_regex: its composite key names it, and a request whose value
// spells that name must not pick its rule.
func (n *node) exact(k []byte) *node {
	if c := n.children[string(k)]; c != nil && c.regex == nil {
		return c
	}
	return nil
}

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return append([]string(nil), c.names...)
}

// HasDomain reports whether the config defines the domain.
func (c *Config) HasDomain(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// Empty reports whether the config has no domain at all.
func (c *Config) Empty() bool { return c == nil || len(c.domains) == 0 }

// Limits returns every rule of every domain, in Dump order.
func (c *Config) Limits() []*Limit {
	if c == nil {
		return nil
	}
	return append([]*Limit(nil), c.limits...)
}

// Match finds the rule for one descriptor of a request, exactly as
// envoyproxy/ratelimit's GetLimit does: at each level the entry's
// key_value wins over a wildcard value, which wins over a value_regex (our
// extension; the first in file order that matches), which wins over the
// bare key; a descriptor with more entries than the tree is deep matches
// nothing; one that stops above the leaves gets the limit of the node it
// stops on, if that node has one. For a descriptor with rate_limits the
// Match's Limit is the first of them (see Limit.Limits).
//
// Per-request limit overrides are the service's job; Match only reads the
// tree. In the common case (no detailed_metric, value_to_metric or
// share_threshold on the chain) Match does not allocate.
func (c *Config) Match(domain string, entries []Entry) Match {
	if c == nil || len(entries) == 0 {
		return Match{}
	}
	cur := c.domains[domain]
	if cur == nil {
		return Match{}
	}
	// plain stays true while the statistics key equals the rule's FullKey
	// and the cache key is built from the request's own entries.
	plain := true
	var buf [256]byte
	last := len(entries) - 1
	var limit *Limit
	for i := range entries {
		e := &entries[i]
		k := append(append(append(buf[:0], e.Key...), '_'), e.Value...)
		next := cur.exact(k)
		switch {
		case next != nil:
			// An empty value matched a composite key "key_": the
			// statistics key writes it as "key".
			plain = plain && e.Value != ""
		default:
			if next = cur.matchPattern(k, e); next != nil {
				plain = plain && !next.shareThreshold && !next.valueToMetric && keyPrefixed(next.key, e.Key)
			} else if next = cur.byKey(e.Key); next != nil {
				plain = plain && (!next.valueToMetric || e.Value == "")
			}
		}
		if next == nil {
			return Match{}
		}
		if i == last {
			limit = next.limit
			break
		}
		if len(next.children) == 0 {
			return Match{}
		}
		cur = next
	}
	if limit == nil {
		return Match{}
	}
	if plain && !limit.DetailedMetric {
		return Match{Limit: limit, StatKey: limit.FullKey}
	}
	return c.matchDetailed(domain, entries, limit)
}

// keyPrefixed reports whether composite is key + "_" + something.
func keyPrefixed(composite, key string) bool {
	return len(composite) > len(key) && composite[len(key)] == '_' && composite[:len(key)] == key
}

// matchDetailed walks the chain again, recording how each level matched,
// and builds the statistics key and cache key entries the way
// envoyproxy/ratelimit does when detailed_metric, value_to_metric or
// share_threshold apply.
func (c *Config) matchDetailed(domain string, entries []Entry, limit *Limit) Match {
	cur := c.domains[domain]
	// values[i] is what follows "key_" for entry i in the value_to_metric
	// key; share[i] is the wildcard pattern replacing entry i's value.
	values := make([]string, len(entries))
	share := make([]string, len(entries))
	shared := false
	for i, e := range entries {
		k := []byte(e.Key + "_" + e.Value)
		next := cur.exact(k)
		switch {
		case next != nil:
			values[i] = e.Value
		default:
			if next = cur.matchPattern(k, &e); next != nil {
				pattern := strings.TrimPrefix(next.key, e.Key+"_")
				switch {
				case next.shareThreshold:
					share[i], shared = pattern, true
					values[i] = pattern
				case next.valueToMetric:
					values[i] = e.Value
				default:
					values[i] = pattern
				}
			} else {
				next = cur.byKey(e.Key)
				if next.valueToMetric {
					values[i] = e.Value
				}
			}
		}
		cur = next
	}

	levels := make([]string, len(entries))
	for i, e := range entries {
		switch {
		case limit.DetailedMetric && shared && share[i] != "":
			levels[i] = e.Key + "_" + share[i]
		case limit.DetailedMetric && shared:
			levels[i] = e.Key
			if e.Value != "" {
				levels[i] += "_" + e.Value
			}
		case limit.DetailedMetric:
			// envoyproxy/ratelimit writes "key_" for an empty value here.
			levels[i] = e.Key + "_" + e.Value
		case values[i] != "":
			levels[i] = e.Key + "_" + values[i]
		default:
			levels[i] = e.Key
		}
	}
	var b strings.Builder
	b.WriteString(domain)
	for _, l := range levels {
		b.WriteByte('.')
		b.WriteString(l)
	}
	m := Match{Limit: limit, StatKey: b.String(), StatLevels: levels}
	if m.StatKey == limit.FullKey {
		m.StatKey, m.StatLevels = limit.FullKey, nil
	}
	if shared {
		m.KeyEntries = make([]Entry, len(entries))
		for i, e := range entries {
			m.KeyEntries[i] = e
			if share[i] != "" {
				m.KeyEntries[i].Value = share[i]
			}
		}
	}
	return m
}

// Dump returns every rule as text, one line per rule in a stable order
// (domains sorted, then depth first with keys sorted), and one line per
// limit of a descriptor's rate_limits, in file order, marked "rate_limits:
// 2/3 minute" (the limit's place and Limit.StatLevel), and a shadow limit
// (Limit.Shadow) "shadow: true". Each line starts as
// envoyproxy/ratelimit's /rlconfig line and appends the settings that
// differ from their defaults. The quota rules follow, one line each as
// QuotaRule.String writes it, domains sorted, each in file order.
func (c *Config) Dump() string {
	var b strings.Builder
	_ = c.WriteDump(&b)
	return b.String()
}

// WriteDump writes what Dump returns to w, a line at a time, so that a
// large rule set is never held as one string (the /rlconfig endpoint).
func (c *Config) WriteDump(w io.Writer) error {
	if c == nil {
		return nil
	}
	var line strings.Builder
	for _, l := range c.limits {
		line.Reset()
		writeLimit(&line, l)
		if _, err := io.WriteString(w, line.String()); err != nil {
			return err
		}
	}
	for _, q := range c.QuotaRules() {
		if _, err := io.WriteString(w, q.String()+"\n"); err != nil {
			return err
		}
	}
	return nil
}

func writeLimit(b *strings.Builder, l *Limit) {
	fmt.Fprintf(b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t",
		l.FullKey, l.Unit, l.RequestsPerUnit, l.ShadowMode, l.QuotaMode)
	if l.InList() {
		// One line per limit of the list, all with the descriptor's key.
		fmt.Fprintf(b, ", rate_limits: %d/%d %s", l.Index+1, len(l.Limits), l.StatLevel)
	}
	if l.Shadow {
		b.WriteString(", shadow: true")
	}
	if l.Unlimited {
		b.WriteString(", unlimited: true")
	}
	if l.Algorithm != FixedWindow {
		fmt.Fprintf(b, ", algorithm: %s", l.Algorithm)
	}
	if l.Algorithm.HasBurst() {
		fmt.Fprintf(b, ", burst: %d", l.Capacity())
	}
	if l.UnitMultiplier > 1 {
		fmt.Fprintf(b, ", unit_multiplier: %d", l.UnitMultiplier)
	}
	if l.Name != "" {
		fmt.Fprintf(b, ", name: %s", l.Name)
	}
	if len(l.Replaces) > 0 {
		fmt.Fprintf(b, ", replaces: %s", strings.Join(l.Replaces, ","))
	}
	if l.DetailedMetric {
		b.WriteString(", detailed_metric: true")
	}
	if l.ValueToMetric {
		b.WriteString(", value_to_metric: true")
	}
	if l.ShareThreshold {
		b.WriteString(", share_threshold: true")
	}
	if l.Metadata != nil {
		// json.Marshal sorts map keys, so the line is stable.
		if md, err := json.Marshal(l.Metadata); err == nil {
			fmt.Fprintf(b, ", metadata: %s", md)
		}
	}
	b.WriteByte('\n')
}
