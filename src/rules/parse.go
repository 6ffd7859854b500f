package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxSlidingLog is the largest requests_per_unit a sliding_log rule may
// have. A sliding log keeps one timestamp per admitted request, so the
// state of one key grows with the limit; above this, use sliding_window,
// which keeps two counters whatever the limit.
const MaxSlidingLog = 10000

// maxAliases bounds alias expansions per file, so that a "billion laughs"
// document is refused instead of walked.
const maxAliases = 10000

// The bounds of what rules may make the service build (docs/SECURITY.md, "Limits and
// hostile input"). An alias expands to its whole subtree at every use, so
// the aliases' count alone does not bound the rules: a 103 KB file of one
// list used many times built 1,000,000 rules (1.2 GB). Every descriptor
// walked is counted, aliases expanded, against MaxDescriptors.
const (
	// MaxDepth bounds how deep descriptors nest: a request carries at
	// most this many entries in a descriptor (the service refuses more),
	// so nothing deeper could ever match; and the cost of building a chain
	// grows with its depth times its length.
	MaxDepth = 64
	// MaxDescriptors bounds the descriptors of all the rules together,
	// aliases expanded: each is a rule or a node of the tree.
	MaxDescriptors = 100000
	// MaxFileBytes bounds one rule file (a Kubernetes ConfigMap holds 1 MiB).
	MaxFileBytes = 4 << 20
)

// maxWindowSeconds is the longest window a time.Duration can hold.
const maxWindowSeconds = int64(math.MaxInt64 / 1_000_000_000)

// File is one rule file to parse.
type File struct {
	// Name is how the file is shown in errors, usually its base name.
	Name string
	// Data is the file's YAML.
	Data []byte
}

// Options tunes Parse. The zero value accepts every algorithm and one
// file per domain.
type Options struct {
	// MergeDomains lets several files share a domain; their descriptors
	// are merged into one tree (MERGE_DOMAIN_CONFIG). Off by default: a
	// domain defined twice is an error naming both files.
	MergeDomains bool
	// Supports reports whether the store can run an algorithm atomically.
	// Rules whose algorithm it refuses are errors. Nil accepts every
	// algorithm.
	Supports func(a Algorithm) bool
	// StoreName names the store in the message for a refused algorithm,
	// e.g. "memcached".
	StoreName string
	// Unsupported says why Supports refuses, in the same message;
	// default "it cannot run it atomically".
	Unsupported string
}

// The keys each kind of YAML map accepts. Anything else is an error.
var (
	rootKeys       = []string{"domain", "descriptors", "quota_buckets"}
	descriptorKeys = []string{
		"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata",
		"rate_limits", "value_regex",
	}
	rateLimitKeys = []string{
		"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "burst", "unit_multiplier",
	}
	// listItemKeys are those of an item of rate_limits: a rate_limit's,
	// and shadow_mode, which makes it a shadow limit (Limit.Shadow).
	listItemKeys = append(slices.Clip(rateLimitKeys), "shadow_mode")
	replacesKeys = []string{"name"}
)

// Parse reads rule files in the envoyproxy/ratelimit YAML format (plus the
// algorithm, burst, unit_multiplier, rate_limits, value_regex and
// quota_buckets extensions) and builds an immutable
// Config. It reports every problem of every file, each as an *Error, joined
// with errors.Join; on error the Config is nil.
func Parse(files []File, opts Options) (*Config, error) {
	b := &builder{opts: opts, domains: map[string]*domainState{}}
	for _, f := range files {
		p := &fileParser{b: b, name: f.Name}
		if len(f.Data) > MaxFileBytes {
			p.errorf(0, "larger than the %d bytes a rule file may hold", MaxFileBytes)
			continue
		}
		p.parse(f.Data)
	}
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	return b.build(), nil
}

// builder collects the domains of all files and their problems.
type builder struct {
	opts    Options
	domains map[string]*domainState
	errs    []error
	// walked counts the descriptors walked, against MaxDescriptors; full
	// is set once the bound was reported.
	walked int
	full   bool
}

// count charges one descriptor at depth (1 for a top-level one) and
// returns the problem that stops it, or "": too deep (the descriptor and
// those below it are left out), or past MaxDescriptors (building stops).
func (b *builder) count(depth int) (msg string, stop bool) {
	if depth > MaxDepth {
		return fmt.Sprintf("descriptors nested %d deep, more than %d: a request carries at most %d entries, so no request can reach them", depth, MaxDepth, MaxDepth), false
	}
	if b.walked++; b.walked > MaxDescriptors {
		if b.full {
			return "", true
		}
		b.full = true
		return fmt.Sprintf("more than %d descriptors in all, aliases expanded; refusing to build further", MaxDescriptors), true
	}
	return "", false
}

type domainState struct {
	root *node
	file string // the first file that defined the domain
	// quotas are the domain's quota_buckets, in file order; quotasFull
	// is set once MaxQuotaRules was reported.
	quotas     []*QuotaRule
	quotasFull bool
}

// fileParser walks the YAML nodes of one file.
type fileParser struct {
	b       *builder
	name    string
	domain  string // of the file, once read
	aliases int
	aborted bool
}

// field is one key/value pair of a YAML map.
type field struct {
	key, val *yaml.Node
}

func (p *fileParser) errorf(line int, format string, args ...any) {
	p.b.errs = append(p.b.errs, &Error{File: p.name, Line: line, Msg: fmt.Sprintf(format, args...)})
}

func (p *fileParser) source(n *yaml.Node) string { return p.name + ":" + strconv.Itoa(n.Line) }

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func (p *fileParser) yamlError(err error) {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		p.errorf(line, "invalid YAML: %s", m[2])
		return
	}
	p.errorf(0, "invalid YAML: %s", strings.TrimPrefix(msg, "yaml: "))
}

// decode reads the file's single YAML document. It returns nil for an
// empty file.
func (p *fileParser) decode(data []byte) (doc *yaml.Node, ok bool) {
	// yaml.v3 has panicked on hostile input before; a rule file must give
	// an error, never take the process down.
	defer func() {
		if r := recover(); r != nil {
			p.errorf(0, "invalid YAML: parser failed: %v", r)
			doc, ok = nil, false
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var first yaml.Node
	if err := dec.Decode(&first); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, true
		}
		p.yamlError(err)
		return nil, false
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		p.yamlError(err)
		return nil, false
	case !isEmptyDocument(&next):
		// envoyproxy/ratelimit silently ignores every document after the
		// first; a rule nobody applies is a trap.
		p.errorf(next.Line, "more than one YAML document; put each domain in its own file")
	}
	return &first, true
}

func isEmptyDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode {
		return len(n.Content) == 0 || isNull(n.Content[0])
	}
	return n.Kind == 0 || isNull(n)
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// deref follows aliases. It returns nil once the file used up its alias
// budget.
func (p *fileParser) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		p.aliases++
		if p.aliases > maxAliases {
			if !p.aborted {
				p.errorf(n.Line, "more than %d alias expansions; refusing to expand further", maxAliases)
				p.aborted = true
			}
			return nil
		}
		n = n.Alias
	}
	return n
}

func (p *fileParser) parse(data []byte) {
	doc, ok := p.decode(data)
	if !ok {
		return
	}
	var root *yaml.Node
	if doc != nil && doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = p.deref(doc.Content[0])
	}
	line := 1
	var fs map[string]field
	switch {
	case root == nil || isNull(root):
	case root.Kind != yaml.MappingNode:
		p.errorf(root.Line, "want a map with domain and descriptors, got %s", describe(root))
		return
	default:
		line = root.Line
		fs = p.fields(p.pairs(root), rootKeys, "")
	}
	domain, _ := p.str(fs["domain"], "domain")
	if domain == "" {
		if f, ok := fs["domain"]; ok {
			line = f.key.Line
		}
		p.errorf(line, "empty domain")
		return
	}
	domainLine := fs["domain"].key.Line
	d, msg := p.b.domain(domain, p.name, p.name+":"+strconv.Itoa(domainLine))
	if msg != "" {
		p.errorf(domainLine, "%s", msg)
	}
	p.domain = domain
	if f, ok := fs["descriptors"]; ok {
		p.descriptors(f.val, d.root, domain, nil)
	}
	if f, ok := fs["quota_buckets"]; ok && d != nil {
		p.quotaBuckets(f, d)
	}
}

// pairs lists the key/value pairs of a map, expanding YAML merge keys
// (<<). Explicit pairs come first, so they win over merged ones.
func (p *fileParser) pairs(m *yaml.Node) []field {
	var explicit, merged []field
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			v = p.deref(v)
			if v == nil {
				continue
			}
			switch v.Kind {
			case yaml.MappingNode:
				merged = append(merged, p.pairs(v)...)
			case yaml.SequenceNode:
				for _, s := range v.Content {
					if s = p.deref(s); s != nil && s.Kind == yaml.MappingNode {
						merged = append(merged, p.pairs(s)...)
					} else if s != nil {
						p.errorf(s.Line, "merge key (<<): want a map, got %s", describe(s))
					}
				}
			default:
				p.errorf(v.Line, "merge key (<<): want a map, got %s", describe(v))
			}
			continue
		}
		explicit = append(explicit, field{key: k, val: v})
	}
	// Mark merged keys, so that fields lets explicit keys override them
	// without calling them duplicates.
	for i, f := range merged {
		if f.key.Kind == yaml.ScalarNode && f.key.Tag == "!!str" {
			merged[i].key = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!merged", Value: f.key.Value, Line: f.key.Line}
		}
	}
	return append(explicit, merged...)
}

// lookup finds a key among pairs without validating anything.
func lookup(pairs []field, key string) field {
	for _, f := range pairs {
		if f.key.Kind == yaml.ScalarNode && f.key.Value == key {
			return f
		}
	}
	return field{}
}

// fields checks the keys of a map against allowed and returns the pairs
// by key. where prefixes the messages ("descriptor \"a.b\"").
func (p *fileParser) fields(pairs []field, allowed []string, where string) map[string]field {
	out := make(map[string]field, len(pairs))
	for _, f := range pairs {
		k := f.key
		if k.Kind != yaml.ScalarNode || (k.Tag != "!!str" && k.Tag != "!!merged") {
			p.errorf(k.Line, "%skey is not a string: %s", prefix(where), describe(k))
			continue
		}
		if _, dup := out[k.Value]; dup {
			if k.Tag != "!!merged" {
				p.errorf(k.Line, "%sduplicate key %q", prefix(where), k.Value)
			}
			continue
		}
		if !slices.Contains(allowed, k.Value) {
			msg := fmt.Sprintf("%sunknown key %q", prefix(where), k.Value)
			if s := suggest(k.Value, allowed); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			} else if where == "" && slices.Contains(descriptorKeys, k.Value) {
				msg += " (descriptor keys belong in a list under descriptors)"
			}
			p.errorf(k.Line, "%s", msg)
			continue
		}
		out[k.Value] = f
	}
	return out
}

func prefix(where string) string {
	if where == "" {
		return ""
	}
	return where + ": "
}

// describe shows a node in a message: its value for a scalar, its kind
// otherwise.
func describe(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "nothing"
	case n.Kind == yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return strconv.Quote(v)
	case n.Kind == yaml.MappingNode:
		return "a map"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	}
	return "nothing"
}

// str reads a string field; absent and null give "". Numbers and booleans
// are taken as written, as envoyproxy/ratelimit does (value: 8080).
func (p *fileParser) str(f field, what string) (string, bool) {
	v := p.deref(f.val)
	if v == nil || isNull(v) {
		return "", true
	}
	if v.Kind != yaml.ScalarNode {
		p.errorf(v.Line, "%s: want a string, got %s", what, describe(v))
		return "", false
	}
	return v.Value, true
}

// yaml11Bools are the plain booleans of YAML 1.1, which the yaml.v2 parser
// of envoyproxy/ratelimit accepts and yaml.v3 reads as strings.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// boolean reads a bool field; absent and null give false.
func (p *fileParser) boolean(f field, what string) bool {
	v := p.deref(f.val)
	if v == nil || isNull(v) {
		return false
	}
	if v.Kind == yaml.ScalarNode {
		if v.Tag == "!!bool" {
			var b bool
			if err := v.Decode(&b); err == nil {
				return b
			}
		}
		if b, ok := yaml11Bools[v.Value]; ok && v.Style == 0 {
			return b
		}
	}
	p.errorf(v.Line, "%s: want true or false, got %s", what, describe(v))
	return false
}

// uint32Field reads a whole number from 0 to MaxUint32; absent and null
// give 0. It reports false, after reporting the problem, for anything else.
func (p *fileParser) uint32Field(f field, what string) (uint32, bool) {
	v := p.deref(f.val)
	if v == nil || isNull(v) {
		return 0, true
	}
	var n uint32
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || v.Decode(&n) != nil {
		p.errorf(v.Line, "%s: want a whole number from 0 to %d, got %s", what, uint32(math.MaxUint32), describe(v))
		return 0, false
	}
	return n, true
}

func (p *fileParser) descriptors(seq *yaml.Node, parent *node, parentKey string, levels []string) {
	seq = p.deref(seq)
	if seq == nil || isNull(seq) || p.aborted {
		return
	}
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq.Line, "descriptors of %q: want a list of descriptors, got %s", parentKey, describe(seq))
		return
	}
	for i, item := range seq.Content {
		item = p.deref(item)
		if item == nil || p.aborted {
			return
		}
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "descriptor %d of %q: want a map with key, value, rate_limit and descriptors, got %s",
				i+1, parentKey, describe(item))
			continue
		}
		p.descriptor(item, i+1, parent, parentKey, levels)
	}
}

func (p *fileParser) descriptor(item *yaml.Node, index int, parent *node, parentKey string, levels []string) {
	if msg, stop := p.b.count(len(levels) + 1); msg != "" || stop {
		if msg != "" {
			p.errorf(item.Line, "descriptor %d of %q: %s", index, parentKey, msg)
		}
		p.aborted = p.aborted || stop
		return
	}
	pairs := p.pairs(item)
	// The key and value name the descriptor in every other message, so
	// read them before checking the rest.
	keyField, valueField := lookup(pairs, "key"), lookup(pairs, "value")
	key, keyOK := p.quietStr(keyField)
	value, _ := p.quietStr(valueField)
	regexField := lookup(pairs, "value_regex")
	pattern, _ := p.quietStr(regexField)
	if regexField.key != nil && value == "" {
		// The pattern stands in for the value in every name.
		value = regexMark + pattern
	}
	names := descriptorNames(parentKey, key, value, index)
	composite, fullKey, where := names.composite, names.fullKey, names.where
	levels = append(slices.Clip(levels), composite)

	fs := p.fields(pairs, descriptorKeys, where)
	p.str(fs["key"], where+": key")
	p.str(fs["value"], where+": value")
	if key == "" && keyOK {
		line := item.Line
		if keyField.key != nil {
			line = keyField.key.Line
		}
		p.errorf(line, "%s: %s", where, msgEmptyKey)
	}

	flags := descriptorFlags{
		shadow:         p.boolean(fs["shadow_mode"], where+": shadow_mode"),
		quota:          p.boolean(fs["quota_mode"], where+": quota_mode"),
		detailed:       p.boolean(fs["detailed_metric"], where+": detailed_metric"),
		valueToMetric:  p.boolean(fs["value_to_metric"], where+": value_to_metric"),
		shareThreshold: p.boolean(fs["share_threshold"], where+": share_threshold"),
	}
	n := newNode(composite, p.source(item))
	n.descKey = key
	n.valueToMetric = flags.valueToMetric
	n.shareThreshold = flags.shareThreshold
	if f, ok := fs["value_regex"]; ok {
		p.valueRegex(f, fs, n, key, where)
	}
	if msg := checkShareThreshold(flags, composite, n.regex != nil); msg != "" {
		p.errorf(fs["share_threshold"].key.Line, "%s: %s", where, msg)
	}
	list := p.limits(fs, n, where, fullKey, flags, levels)
	if key != "" {
		if msg := addChild(parent, n); msg != "" {
			p.errorf(item.Line, "%s: %s", where, msg)
		}
	}
	if f, ok := fs["descriptors"]; ok {
		p.descriptors(f.val, n, fullKey, levels)
	}
	for _, msg := range checkStatLevels(list, n) {
		p.errorf(fs["rate_limits"].key.Line, "%s: rate_limits: %s", where, msg)
	}
}

// limits reads a descriptor's rate_limit or rate_limits, and metadata,
// into n; it returns the list of rate_limits, if any.
func (p *fileParser) limits(fs map[string]field, n *node, where, fullKey string, flags descriptorFlags, levels []string) []*Limit {
	var list []*Limit
	rl, hasOne := fs["rate_limit"]
	rls, hasList := fs["rate_limits"]
	switch {
	case hasOne && hasList:
		p.errorf(rls.key.Line, "%s: %s", where, msgOneAndList)
	case hasOne:
		n.limit = p.rateLimit(rl.val, "rate_limit", where, fullKey, n.source, flags, false)
	case hasList:
		list = p.rateLimits(rls, where, fullKey, flags)
		if len(list) > 0 {
			n.limit = list[0]
		}
	}
	if n.limit != nil {
		for _, l := range all(n.limit) {
			l.Domain, l.Levels = p.domain, levels
		}
	}
	if f, ok := fs["metadata"]; ok {
		md := p.metadata(f.val, where+": metadata")
		if n.limit != nil {
			for _, l := range all(n.limit) {
				l.Metadata = md
			}
		}
	}
	return list
}

// valueRegex compiles a descriptor's value_regex into n.
func (p *fileParser) valueRegex(f field, fs map[string]field, n *node, key, where string) {
	where += ": value_regex"
	pattern, ok := p.str(f, where)
	if !ok {
		return
	}
	if _, both := fs["value"]; both {
		p.errorf(f.key.Line, "%s: give value or value_regex, not both", where)
		return
	}
	re, msg := compileValueRegex(pattern)
	if msg != "" {
		line := f.key.Line
		if v := p.deref(f.val); v != nil {
			line = v.Line
		}
		p.errorf(line, "%s: %s", where, msg)
		return
	}
	n.regex, n.entryKey = re, key
	n.regexPrefix, _ = re.LiteralPrefix()
}

// quietStr reads a scalar without reporting problems; fields reports them.
func (p *fileParser) quietStr(f field) (string, bool) {
	v := f.val
	for v != nil && v.Kind == yaml.AliasNode {
		v = v.Alias
	}
	if v == nil || isNull(v) {
		return "", true
	}
	if v.Kind != yaml.ScalarNode {
		return "", false
	}
	return v.Value, true
}

type descriptorFlags struct {
	shadow, quota, detailed, valueToMetric, shareThreshold bool
}

// rateLimit reads one rate_limit (what names it: "rate_limit", or
// "rate_limits[2]" for an item of a list, which item says, and which may
// carry shadow_mode).
func (p *fileParser) rateLimit(val *yaml.Node, what, where, fullKey, source string, flags descriptorFlags, item bool) *Limit {
	m := p.deref(val)
	if m == nil || isNull(m) {
		// As in envoyproxy/ratelimit, an empty rate_limit sets no limit.
		return nil
	}
	if m.Kind != yaml.MappingNode {
		p.errorf(m.Line, "%s: %s: want a map with unit and requests_per_unit, got %s", where, what, describe(m))
		return nil
	}
	where += ": " + what
	keys := rateLimitKeys
	if item {
		keys = listItemKeys
	}
	fs := p.fields(p.pairs(m), keys, where)
	var s limitSpec
	s.shadow = p.boolean(fs["shadow_mode"], where+": shadow_mode")
	s.unlimited = p.boolean(fs["unlimited"], where+": unlimited")
	s.requests, _ = p.uint32Field(fs["requests_per_unit"], where+": requests_per_unit")
	s.name, _ = p.str(fs["name"], where+": name")
	var unitOK bool
	_, s.hasUnit = fs["unit"]
	s.unit, unitOK = p.str(fs["unit"], where+": unit")
	s.badUnit = !unitOK
	var replaceLines []int
	s.replaces, replaceLines = p.replaces(fs["replaces"], where)
	_, s.hasAlgorithm = fs["algorithm"]
	s.algorithm, _ = p.str(fs["algorithm"], where+": algorithm")
	if !s.unlimited {
		// An unlimited rule reads neither: their presence is its problem.
		var isNum bool
		if f, present := fs["burst"]; present {
			s.burst, isNum = p.uint32Field(f, where+": burst")
			s.hasBurst, s.badBurst = true, !isNum
		}
		if f, present := fs["unit_multiplier"]; present {
			s.multiplier, isNum = p.uint32Field(f, where+": unit_multiplier")
			s.hasMultiplier, s.badMultiplier = true, !isNum
		}
	} else {
		_, s.hasBurst = fs["burst"]
		_, s.hasMultiplier = fs["unit_multiplier"]
	}

	l, probs := newLimit(s, fullKey, source, flags, p.b.opts)
	for _, pr := range probs {
		line := m.Line
		if f, present := fs[pr.field]; present && pr.field != fieldLimit {
			line = f.key.Line
			switch {
			case pr.field == fieldReplaces:
				line = replaceLines[pr.index]
			case pr.atValue:
				line = f.val.Line
			}
		}
		p.errorf(line, "%s: %s", where, pr.msg)
	}
	return l
}

// rateLimits reads a descriptor's rate_limits: a list of rate_limit maps,
// every one of which applies to every hit. It returns the list, or nil
// when it is empty or has a problem (reported).
func (p *fileParser) rateLimits(f field, where, fullKey string, flags descriptorFlags) []*Limit {
	seq := p.deref(f.val)
	if seq == nil || isNull(seq) {
		return nil
	}
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq.Line, "%s: rate_limits: want a list of rate_limit maps, got %s", where, describe(seq))
		return nil
	}
	if msg := checkListLen(len(seq.Content)); msg != "" {
		p.errorf(f.key.Line, "%s: rate_limits: %s", where, msg)
		return nil
	}
	list := make([]*Limit, 0, len(seq.Content))
	lines := make([]int, 0, len(seq.Content))
	ok := true
	for i, item := range seq.Content {
		item = p.deref(item)
		if item == nil {
			return nil
		}
		what := "rate_limits[" + strconv.Itoa(i+1) + "]"
		if isNull(item) {
			p.errorf(item.Line, "%s: %s: want a map with unit and requests_per_unit, got nothing", where, what)
			ok = false
			continue
		}
		l := p.rateLimit(item, what, where, fullKey, p.source(item), flags, true)
		if l == nil {
			ok = false
			continue
		}
		list = append(list, l)
		lines = append(lines, item.Line)
	}
	if !ok {
		return nil
	}
	probs := linkList(list)
	for _, pr := range probs {
		p.errorf(lines[pr.index], "%s: rate_limits[%d]: %s", where, pr.index+1, pr.msg)
	}
	if len(probs) > 0 {
		return nil
	}
	return list
}

// replaces reads the names of a replaces list, empty ones included, and
// the line of each; newLimit checks them.
func (p *fileParser) replaces(f field, where string) ([]string, []int) {
	seq := p.deref(f.val)
	if seq == nil || isNull(seq) {
		return nil, nil
	}
	where += ": replaces"
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq.Line, "%s: want a list of {name: ...}, got %s", where, describe(seq))
		return nil, nil
	}
	var names []string
	var lines []int
	for _, item := range seq.Content {
		item = p.deref(item)
		if item == nil {
			break
		}
		if item.Kind != yaml.MappingNode {
			p.errorf(item.Line, "%s: want a list of {name: ...}, got %s", where, describe(item))
			continue
		}
		fs := p.fields(p.pairs(item), replacesKeys, where)
		name, _ := p.str(fs["name"], where+": name")
		names = append(names, name)
		lines = append(lines, item.Line)
	}
	return names, lines
}

// metadata converts the metadata map to plain Go values that
// structpb.NewStruct accepts.
func (p *fileParser) metadata(n *yaml.Node, where string) map[string]any {
	n = p.deref(n)
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, "%s: want a map, got %s", where, describe(n))
		return nil
	}
	v, _ := p.value(n, where).(map[string]any)
	if len(v) == 0 {
		return nil
	}
	return v
}

func (p *fileParser) value(n *yaml.Node, where string) any {
	n = p.deref(n)
	if n == nil {
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := map[string]any{}
		for _, f := range p.pairs(n) {
			k := p.deref(f.key)
			if k == nil || k.Kind != yaml.ScalarNode {
				p.errorf(f.key.Line, "%s: key is not a string: %s", where, describe(f.key))
				continue
			}
			if _, dup := m[k.Value]; dup {
				if k.Tag != "!!merged" {
					p.errorf(k.Line, "%s: duplicate key %q", where, k.Value)
				}
				continue
			}
			m[k.Value] = p.value(f.val, where+"."+k.Value)
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			l = append(l, p.value(c, where))
		}
		return l
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b
			}
		case "!!int":
			var i int64
			if n.Decode(&i) == nil {
				return i
			}
			var f float64
			if n.Decode(&f) == nil {
				return f
			}
		case "!!float":
			var f float64
			if n.Decode(&f) == nil {
				return f
			}
		case "!!str":
			if b, ok := yaml11Bools[n.Value]; ok && n.Style == 0 {
				return b
			}
		}
		return n.Value
	}
	return nil
}

// suggest returns the allowed key closest to a misspelled one, or "".
func suggest(key string, allowed []string) string {
	norm := func(s string) string {
		return strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(s))
	}
	best, bestDist := "", 3
	for _, a := range allowed {
		if norm(a) == norm(key) {
			return a
		}
		if d := editDistance(key, a); d < bestDist {
			best, bestDist = a, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// build freezes the parsed domains into a Config.
func (b *builder) build() *Config {
	c := &Config{domains: make(map[string]*node, len(b.domains)), quotas: map[string][]*QuotaRule{}}
	for name, d := range b.domains {
		c.domains[name] = d.root
		c.names = append(c.names, name)
		if len(d.quotas) > 0 {
			c.quotas[name] = d.quotas
		}
	}
	sort.Strings(c.names)
	for _, name := range c.names {
		c.limits = c.domains[name].collect(c.limits)
	}
	return c
}
