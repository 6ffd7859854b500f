package rules

import (
	"strings"
	"time"
)

// Unit is the time unit of a limit. Its values equal those of Envoy's
// RateLimitResponse.RateLimit.Unit enum, so the service converts with a cast.
type Unit int32

// The units of envoyproxy/ratelimit; Unknown is the zero value and never valid in a rule.
const (
	Unknown Unit = 0
	Second  Unit = 1
	Minute  Unit = 2
	Hour    Unit = 3
	Day     Unit = 4
	Month   Unit = 5
	Year    Unit = 6
	Week    Unit = 7
)

// unitSeconds and unitNames are each unit's length in seconds, as
// envoyproxy/ratelimit counts them (a month is 30 days, a year 365 days),
// and its name in Envoy's proto.
var (
	unitSeconds = [...]int64{Second: 1, Minute: 60, Hour: 3600, Day: 86400, Week: 7 * 86400, Month: 30 * 86400, Year: 365 * 86400}
	unitNames   = [...]string{Unknown: "UNKNOWN", Second: "SECOND", Minute: "MINUTE", Hour: "HOUR", Day: "DAY", Week: "WEEK", Month: "MONTH", Year: "YEAR"}
)

// valid reports whether u is one of the units, not Unknown.
func (u Unit) valid() bool { return u > Unknown && int(u) < len(unitNames) }

// Seconds returns the length of one unit in seconds, or 0 for Unknown.
func (u Unit) Seconds() int64 {
	if !u.valid() {
		return 0
	}
	return unitSeconds[u]
}

// String returns the upper-case name used by Envoy's proto (SECOND, MINUTE, ...).
func (u Unit) String() string {
	if !u.valid() {
		return unitNames[Unknown]
	}
	return unitNames[u]
}

// ParseUnit reads a unit name, case-insensitively. It reports false for
// anything that is not a valid unit, including "unknown".
func ParseUnit(s string) (Unit, bool) {
	for u := Second; u <= Week; u++ {
		if strings.EqualFold(s, u.String()) {
			return u, true
		}
	}
	return Unknown, false
}

// Algorithm is how a limit counts hits.
type Algorithm uint8

// The algorithms a rule may choose with rate_limit.algorithm.
const (
	FixedWindow Algorithm = iota
	SlidingWindow
	SlidingLog
	TokenBucket
)

// algorithms is the registry of the algorithms: each one's YAML name and
// the traits that the rules, the cache keys, the near cache and the
// service's answers and bounds read, instead of naming algorithms. What
// is left to each algorithm's own code is its arithmetic
// (src/limiter/algorithm.go, takeback.go) and each store's atomic form of
// it (docs/ARCHITECTURE.md, "Where a change goes"). Every value of an
// Algorithm indexes it, with no bounds check on the hot path; those that
// are no algorithm have no name and no trait.
var algorithms = [256]struct {
	name string
	// windowed: the state is a count of the current window, whose start
	// is part of the key; hits are counted even over the limit, and the
	// reset is whole seconds (the anchor's fixed window). The others are
	// continuous: one key whatever the time, a refused hit changes nothing.
	windowed bool
	// burst: a rule may give a capacity (burst) other than its
	// requests_per_unit.
	burst bool
	// perHit: the state keeps one timestamp per admitted hit, so a rule's
	// requests_per_unit is at most MaxSlidingLog and a request's hits on
	// such rules at most MaxSlidingLog in all.
	perHit bool
	// overUntilReset: a key over its limit stays over until its reset
	// (Result.ResetAfter), so the near cache may answer for it; a token
	// bucket's reset is when it is full again, and a hit fits sooner.
	overUntilReset bool
}{
	FixedWindow:   {name: "fixed_window", windowed: true, overUntilReset: true},
	SlidingWindow: {name: "sliding_window", overUntilReset: true},
	SlidingLog:    {name: "sliding_log", perHit: true, overUntilReset: true},
	TokenBucket:   {name: "token_bucket", burst: true},
}

// Algorithms lists every algorithm, in declaration order.
var Algorithms = []Algorithm{FixedWindow, SlidingWindow, SlidingLog, TokenBucket}

// known reports whether a is one of Algorithms.
func (a Algorithm) known() bool { return algorithms[a].name != "" }

// String returns the YAML name of the algorithm.
func (a Algorithm) String() string {
	if !a.known() {
		return "unknown"
	}
	return algorithms[a].name
}

// Windowed reports whether a counts hits per window, the window's start in
// its key (fixed_window), rather than continuously.
func (a Algorithm) Windowed() bool { return algorithms[a].windowed }

// Continuous reports whether a is an algorithm whose key stays the same
// whatever the time (all but fixed_window), keeping a state that a store
// reads and rewrites rather than a counter it adds to.
func (a Algorithm) Continuous() bool { return a.known() && !a.Windowed() }

// HasBurst reports whether a rule of a may set a burst.
func (a Algorithm) HasBurst() bool { return algorithms[a].burst }

// PerHit reports whether a keeps one timestamp per admitted hit (see
// MaxSlidingLog).
func (a Algorithm) PerHit() bool { return algorithms[a].perHit }

// OverUntilReset reports whether a key of a refused now stays refused
// until its reset, so that the near cache may answer for it.
func (a Algorithm) OverUntilReset() bool { return algorithms[a].overUntilReset }

// algorithmNames lists the names of the algorithms for which has holds,
// as a message writes them: "a", "a or b", "a, b or c".
func algorithmNames(has func(Algorithm) bool) string {
	var names []string
	for _, a := range Algorithms {
		if has(a) {
			names = append(names, a.String())
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// ParseAlgorithm reads an algorithm's YAML name; the empty string is FixedWindow.
func ParseAlgorithm(s string) (Algorithm, bool) {
	if s == "" {
		return FixedWindow, true
	}
	for _, a := range Algorithms {
		if s == a.String() {
			return a, true
		}
	}
	return 0, false
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}

// Limit is a resolved rate limit: a rule of the YAML tree, or a per-request
// override built by the service. A Limit is immutable once built and shared
// by all requests that match it.
type Limit struct {
	// FullKey is the statistics key: "domain.key_value.key2", as envoyproxy/ratelimit builds it.
	FullKey string
	// Domain and Levels are FullKey's parts: the domain and the composite
	// key ("key" or "key_value") of each level of the rule's chain. They
	// name the rule's statistics without parsing FullKey, whose parts may
	// hold dots themselves. Empty for overrides.
	Domain string
	Levels []string
	// Source is "file:line" of the rule, for error messages; empty for overrides.
	Source string

	RequestsPerUnit uint32
	Unit            Unit
	// UnitMultiplier makes a window of N units; always >= 1.
	UnitMultiplier uint32
	Algorithm      Algorithm
	// Burst is the token bucket capacity; 0 means RequestsPerUnit.
	Burst uint32

	Name      string
	Replaces  []string
	Unlimited bool

	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool

	// Shadow marks a limit of a rate_limits list that carries
	// shadow_mode: true itself (our extension): it counts every hit as it
	// would alone, as the descriptor's only limit, and reports the hits it
	// would refuse, but never makes the descriptor OVER_LIMIT, never
	// decides its status, and never changes what the other limits count.
	// ShadowMode, the descriptor's flag, is another thing: the descriptor
	// is answered OK whatever its limits say. Always false outside a list.
	Shadow bool

	// ValueToMetric and ShareThreshold echo the flags of the descriptor that
	// holds this rule, for Dump. Match applies the flags of every level of
	// the matched chain, not only these.
	ValueToMetric  bool
	ShareThreshold bool

	// Metadata is the rule's `metadata`, sent to Envoy in dynamic_metadata
	// when the descriptor is within its limit. Nil when absent. Its values
	// are nil, bool, int64, float64, string, []any and map[string]any, so
	// structpb.NewStruct accepts it as is. Shared: never modify it.
	Metadata map[string]any

	// Limits is every limit of a descriptor that has rate_limits (our
	// extension) instead of rate_limit: this Limit and its siblings, in
	// file order, all sharing FullKey, Domain, Levels, the descriptor's
	// flags and Metadata. Every one of them applies to every hit. Nil for
	// a single rate_limit, whose keys and statistics are the anchor's.
	// Match returns the first; Config.Limits lists them all. Shared:
	// never modify it.
	Limits []*Limit
	// Index is the limit's place in Limits; 0 for a single rate_limit.
	Index int
	// StatLevel names a limit of a list in its own statistics, one level
	// below the descriptor's key: its name when it has one, else its
	// window and, for algorithms other than fixed_window, its algorithm
	// ("second", "5_minute", "hour_token_bucket"). Unique within the list.
	// Empty for a single rate_limit.
	StatLevel string
}

// MaxLimits is the most limits a descriptor's rate_limits may list. Each
// is one more key and store operation per hit; a ladder of second,
// minute, hour, day, week and month fits with room to spare.
const MaxLimits = 8

// InList reports whether the limit is one of a descriptor's rate_limits.
func (l *Limit) InList() bool { return len(l.Limits) > 0 }

// Enforced reports whether the limit can refuse a hit: it is limited and
// not a shadow limit (see Shadow).
func (l *Limit) Enforced() bool { return !l.Unlimited && !l.Shadow }

// Window is the length of the limit's window: Unit × UnitMultiplier.
func (l *Limit) Window() time.Duration {
	return time.Duration(l.Unit.Seconds()) * time.Duration(max(l.UnitMultiplier, 1)) * time.Second
}

// Capacity is the most hits the limit admits at once: Burst for a token
// bucket when set, RequestsPerUnit otherwise.
func (l *Limit) Capacity() uint32 {
	if l.Algorithm.HasBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.RequestsPerUnit
}
