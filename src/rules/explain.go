package rules

import (
	"fmt"
	"sort"
	"strings"
)

// How an entry matched a node of the rules (Step.By), in Match's order of
// preference.
const (
	// ByValue: the rule names the entry's key and value.
	ByValue = "value"
	// ByWildcard: the rule's value holds '*' and matches the entry's.
	ByWildcard = "wildcard"
	// ByValueRegex: the rule's value_regex matches the entry's value.
	ByValueRegex = "value_regex"
	// ByKey: the rule names the key alone: the key's default, for any
	// value no rule above names.
	ByKey = "key"
)

// maxNamesInWhy bounds the keys or values an Explanation's Why lists.
const maxNamesInWhy = 10

// Step is one entry of a descriptor on its way down a domain's rules.
type Step struct {
	Entry Entry
	// By says how the entry matched (ByValue, ByWildcard, ByValueRegex,
	// ByKey).
	By string
	// Rule is the node it matched as the rules' statistics name it:
	// "key_value", "key" alone, a wildcard "key_/api/*", or a value_regex
	// "key_~regex".
	Rule string
	// Source is the node's file and line.
	Source string
}

// Explanation says how one descriptor matched the rules, or why it did
// not: what Match does, step by step.
type Explanation struct {
	// Steps are the entries that matched a node, in order; the walk
	// stopped at the first that did not.
	Steps []Step
	// Limit is Match's Limit: the rule matched, nil when none.
	Limit *Limit
	// Why says, when Limit is nil, why no rule matched, naming what the
	// rules have where the walk stopped.
	Why string
}

// Explain walks entries down domain's rules as Match does, and says at
// each level how the entry matched, or why it did not. Its Limit is always
// Match's. It allocates; it is for operators' questions, not the hot path.
func (c *Config) Explain(domain string, entries []Entry) Explanation {
	var x Explanation
	if c == nil || c.domains[domain] == nil {
		x.Why = fmt.Sprintf("domain %q is not in the rules (domains: %s)", domain, someNames(c.Domains()))
		return x
	}
	if len(entries) == 0 {
		x.Why = "the descriptor has no entries: answered OK without a limit"
		return x
	}
	cur := c.domains[domain]
	for i := range entries {
		e := &entries[i]
		k := []byte(e.Key + "_" + e.Value)
		step := Step{Entry: *e}
		next := cur.exact(k)
		switch {
		case next != nil:
			step.By, step.Rule = ByValue, next.key
		default:
			if next = cur.matchPattern(k, e); next != nil {
				step.By, step.Rule = ByWildcard, next.key
				if next.regex != nil {
					step.By = ByValueRegex
				}
			} else if next = cur.byKey(e.Key); next != nil {
				step.By, step.Rule = ByKey, next.key
			}
		}
		if next == nil {
			x.Why = whyNot(cur, e, i)
			return x
		}
		step.Source = next.source
		x.Steps = append(x.Steps, step)
		if i == len(entries)-1 {
			if next.limit == nil {
				x.Why = fmt.Sprintf("the rule %s (%s) has no rate_limit; the rules below it have keys: %s",
					next.key, next.source, someNames(childKeys(next)))
			}
			x.Limit = next.limit
			return x
		}
		if len(next.children) == 0 {
			x.Why = fmt.Sprintf("the rules end at %s (%s), entry %d of %d: a descriptor longer than the rules matches nothing",
				next.key, next.source, i+1, len(entries))
			return x
		}
		cur = next
	}
	return x
}

// whyNot says why entry i, e, matched no child of n: no rule for its key
// there, or none for its value.
func whyNot(n *node, e *Entry, i int) string {
	var values []string
	for _, c := range n.children {
		if c.descKey != e.Key {
			continue
		}
		if c.key != e.Key {
			values = append(values, strings.TrimPrefix(c.key, e.Key+"_"))
		}
	}
	if len(values) > 0 {
		sort.Strings(values)
		return fmt.Sprintf("entry %d: the value %q of key %q matches no rule: the rules there have for %q the values %s, and no rule for the key alone",
			i+1, e.Value, e.Key, e.Key, someNames(values))
	}
	return fmt.Sprintf("entry %d: no rule has the key %q there; the rules there have keys: %s", i+1, e.Key, someNames(childKeys(n)))
}

// childKeys returns the keys of n's children, each once, sorted.
func childKeys(n *node) []string {
	seen := map[string]bool{}
	var keys []string
	for _, c := range n.children {
		if !seen[c.descKey] {
			seen[c.descKey] = true
			keys = append(keys, c.descKey)
		}
	}
	sort.Strings(keys)
	return keys
}

// someNames lists the first maxNamesInWhy names, quoted, and how many
// more there are; "none" for none.
func someNames(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, n := range names {
		if i == maxNamesInWhy {
			fmt.Fprintf(&b, " and %d more", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", n)
	}
	return b.String()
}
