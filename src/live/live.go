// Package live keeps what the live view shows of the traffic right now:
// each rule's decisions, over-limit and near-limit decisions per second
// over the last five minutes, the keys nearest to or over their limits
// (a bounded heavy-hitters sketch), the requests that matched no rule
// (unknown domains, descriptors' key chains), and the store's round-trip
// latency and errors. The service feeds it on the hot path, which it costs a few
// nanoseconds and no allocation; a ticker closes each second.
//
// Its memory is fixed whatever the traffic: Config.MaxKeys slots for the
// keys, one series of Window seconds for each of at most Config.MaxRules
// rules, MaxUnknownDomains and MaxUnmatchedKeys slots for what matched
// nothing, and a fixed latency histogram. It knows nothing of gRPC, HTTP,
// stores or where rules come from.
package live

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// Window is the length, in seconds, of the traffic series: one point per
// second for the last five minutes.
const Window = 300

// Defaults of Config.
const (
	// DefaultMaxKeys is the sketch's capacity (LIVE_VIEW_MAX_KEYS): about
	// 400 bytes a key, 400 KiB in all.
	DefaultMaxKeys = 1024
	// DefaultMaxRules bounds the rules with traffic series: 3.6 KB each,
	// 3.6 MB in all.
	DefaultMaxRules = 1000
)

// Which decisions go to the sketch. A decision that fills its limit (no
// room left after it) or crosses it always goes, so that a key pushed to
// or over its limit is always seen at once. Of the others near the limit,
// one in nearSample goes, counted nearSample times; of those already over
// it, one in overSample, counted overSample times. The keys that matter
// are asked again and again, so sampling loses none of them, and a flood
// of over-limit requests (the usual attack) or of keys all hovering near
// their limit costs the sketch a fraction of what it would: a new key in
// a full sketch costs some 150-200 ns (docs/BENCHMARKS.md), and an
// over-limit decision, the cheapest there is, about 1 µs.
const (
	nearSample = 4
	overSample = 64
)

// Config tunes a Recorder. The zero value is usable: the defaults above
// and the system clock.
type Config struct {
	// MaxKeys is the number of keys tracked at once, all domains
	// together (LIVE_VIEW_MAX_KEYS; default DefaultMaxKeys). A new key
	// past it replaces the one with the fewest recent decisions near or
	// over its limit.
	MaxKeys int
	// MaxRules is the number of rules with traffic series (default
	// DefaultMaxRules), the first in the rules' order; the others are
	// listed without series.
	MaxRules int
	// Now is the clock of Run's ticks and of the reads; default time.Now.
	Now func() time.Time
}

// Recorder records the live traffic. It is safe for concurrent use; a nil
// *Recorder records nothing. Make one with New and tick it with Run.
type Recorder struct {
	cfg   Config
	seed  maphash.Seed
	rules atomic.Pointer[ruleSet]
	// recent caches ruleSet.byLimit, direct-mapped by the limit's
	// address: a load and two comparisons instead of a map lookup, which
	// profiles showed was half of the recorder's cost per decision. Its
	// entries are the ruleInfos themselves, so a miss allocates nothing.
	recent [64]atomic.Pointer[ruleInfo]
	keys   *sketch
	// unknownDomains and unmatchedKeys are the requests that matched
	// nothing (unmatched.go).
	unknownDomains, unmatchedKeys *tally
	store                         storeLatency
	// nearCache counts the decisions answered from the near cache in the
	// second under way.
	nearCache atomic.Uint64

	// mu guards every field below.
	mu sync.Mutex
	// last is the Unix second of the last tick; 0 before the first.
	last int64
	// series holds the tracked rules' series by rule ID; they outlive
	// reloads that keep the rule.
	series map[string]*series
	totals totals
	// ticked is closed at the next tick.
	ticked chan struct{}
	// version counts the rule sets published with SetRules.
	version uint64
}

// Rule is one rule as the live view knows it.
type Rule struct {
	// ID names the rule across reloads: its statistics key (FullKey;
	// for a limit of a rate_limits list, FullKey "." its StatLevel),
	// followed by "#2", "#3"... for further limits of the same key.
	ID string
	// Limit is the rule; never modify it.
	Limit *rules.Limit
	// Tracked reports whether the rule has traffic series.
	Tracked bool
	// Twins are the IDs of the limits of the same rate_limits list in the
	// other role: for an enforced limit the shadow limits beside it
	// (rules.Limit.Shadow), for a shadow limit the enforced ones; nil
	// when there are none.
	Twins []string
}

// ruleSet is one published rule set, read on the hot path.
type ruleSet struct {
	rules   []Rule
	byLimit map[*rules.Limit]*ruleInfo
	version uint64
}

// ruleInfo is what the hot path needs of a rule.
type ruleInfo struct {
	id     string
	hash   uint64
	series *series // nil when the rule is not tracked
	// limit and version say what the info is of, for Recorder.recent: a
	// number, not the rule set, so that an info kept by a top-keys slot
	// pins its one limit and not a replaced rule set whole.
	limit   *rules.Limit
	version uint64
}

// series is one rule's traffic. The hot path adds to the counts of the
// second under way; Tick moves them into the rings.
// Each decision costs one atomic add: other counts the decisions neither
// over nor near the limit, events the over-limit ones in its upper half
// and the near-limit ones in its lower half.
type series struct {
	other  atomic.Uint64
	events atomic.Uint64
	// shadow marks a shadow limit's series (rules.Limit.Shadow): its
	// over-limit decisions are those it would have refused, and it is
	// left out of the totals, which count each decision once, under the
	// limit that decided. Guarded by Recorder.mu, set at each SetRules.
	shadow bool

	// The rings, one slot per second (Unix second mod Window), guarded by
	// Recorder.mu.
	ring [3][Window]uint32
}

// The rings of a series and of totals.
const (
	ringDecisions = iota
	ringOver
	ringNear
	ringNearCache
	ringStoreErrors
	numTotals
)

type totals struct {
	ring [numTotals][Window]uint32
}

// New returns a Recorder with no rules.
func New(cfg Config) *Recorder {
	cfg.MaxKeys = cmp.Or(max(cfg.MaxKeys, 0), DefaultMaxKeys)
	cfg.MaxRules = cmp.Or(max(cfg.MaxRules, 0), DefaultMaxRules)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Recorder{
		cfg:            cfg,
		seed:           maphash.MakeSeed(),
		keys:           newSketch(cfg.MaxKeys),
		unknownDomains: newTally(MaxUnknownDomains, cfg.Now()),
		unmatchedKeys:  newTally(MaxUnmatchedKeys, cfg.Now()),
		series:         map[string]*series{},
		ticked:         make(chan struct{}),
	}
}

// SetRules publishes the rules that decisions will be observed with. A
// rule that keeps its ID keeps its series.
func (r *Recorder) SetRules(c *rules.Config) {
	if r == nil {
		return
	}
	limits := c.Limits()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.version++
	set := &ruleSet{
		rules:   make([]Rule, 0, len(limits)),
		byLimit: make(map[*rules.Limit]*ruleInfo, len(limits)),
		version: r.version,
	}
	kept := make(map[string]*series, min(len(limits), r.cfg.MaxRules))
	ids := ruleIDs(limits)
	for i, id := range ids {
		l := limits[i]
		info := &ruleInfo{id: id, hash: maphash.String(r.seed, id), limit: l, version: set.version}
		if len(kept) < r.cfg.MaxRules {
			s := r.series[id]
			if s == nil {
				s = &series{}
			}
			s.shadow = l.Shadow
			kept[id] = s
			info.series = s
		}
		set.byLimit[l] = info
		set.rules = append(set.rules, Rule{ID: id, Limit: l, Tracked: info.series != nil})
	}
	linkTwins(set.rules)
	r.series = kept
	r.rules.Store(set)
	// The cache's infos are of the replaced set: let it go.
	for i := range r.recent {
		r.recent[i].Store(nil)
	}
}

// linkTwins sets the Twins of the limits of each rate_limits list that
// has shadow limits among enforced ones. A list's limits are next to each
// other in rs (rules.Config.Limits' order).
func linkTwins(rs []Rule) {
	for i := 0; i < len(rs); {
		l := rs[i].Limit
		if !l.InList() {
			i++
			continue
		}
		end := i + 1
		for end < len(rs) && rs[end].Limit.InList() && rs[end].Limit.Limits[0] == l.Limits[0] {
			end++
		}
		for j := i; j < end; j++ {
			for k := i; k < end; k++ {
				a, b := rs[j].Limit, rs[k].Limit
				if a.Shadow != b.Shadow && !a.Unlimited && !b.Unlimited {
					rs[j].Twins = append(rs[j].Twins, rs[k].ID)
				}
			}
		}
		i = end
	}
}

// ruleIDs returns the ID of each limit (see Rule).
func ruleIDs(limits []*rules.Limit) []string {
	ids := make([]string, len(limits))
	seen := make(map[string]int, len(limits))
	for i, l := range limits {
		// A limit of a rate_limits list is named as in its own
		// statistics: the descriptor's key, then its name or window.
		id := l.FullKey
		if l.StatLevel != "" {
			id += "." + l.StatLevel
		}
		ids[i] = id
		if n := seen[id]; n > 0 {
			ids[i] += "#" + strconv.Itoa(n+1)
		}
		seen[id]++
	}
	return ids
}

// Rules returns the rules in use and the number of the rule set, which
// changes with each SetRules.
func (r *Recorder) Rules() ([]Rule, uint64) {
	if r == nil {
		return nil, 0
	}
	set := r.rules.Load()
	if set == nil {
		return nil, 0
	}
	return set.rules, set.version
}

// Observe records one descriptor's decision: domain and entries as the
// limit counted them, the limit applied (a rule, or a per-request
// override), and the status the limiter gave at now; for a shadow limit
// (rules.Limit.Shadow), its own status, OverLimit when it would have
// refused, recorded as over the limit in its series and among the top
// keys under its own ID. It is the hot path:
// no allocation, and for a decision that is not near its limit a cached
// lookup of the rule and one atomic add.
func (r *Recorder) Observe(domain string, entries []rules.Entry, lim *rules.Limit, st *limiter.Status, now time.Time) {
	if r == nil || lim == nil {
		return
	}
	over := st.Code == limiter.OverLimit || st.Counts.ShadowMode > 0
	near := st.Counts.NearLimit > 0
	info := r.info(lim)
	if info != nil && info.series != nil {
		s := info.series
		switch {
		case over:
			s.events.Add(1 << 32)
		case near:
			s.events.Add(1)
		default:
			s.other.Add(1)
		}
	}
	if st.Counts.OverLimitWithLocalCache > 0 {
		r.nearCache.Add(1)
	}
	if !over && !near {
		return
	}
	capacity := uint64(lim.Capacity())
	used := capacity
	if !over {
		used = capacity - min(uint64(st.Remaining), capacity)
	}
	// The samples follow bits of now's nanoseconds, which cost nothing,
	// unlike a random number: requests do not arrive in step with them.
	weight := uint64(countScale)
	ns := uint64(now.UnixNano())
	if !over && int64(ns) < r.keys.heldUntil.Load() {
		// Every slot holds a key limited right now (see sketch.tick).
		return
	}
	switch {
	case over && near, !over && used >= capacity:
		// Crossed or filled the limit: always recorded.
	case over:
		if (ns>>6)%overSample != 0 {
			return
		}
		weight *= overSample
	default:
		if (ns>>12)%nearSample != 0 {
			return
		}
		weight *= nearSample
	}
	if info == nil && lim.Source != "" {
		// A rule of rules not (yet) published here: nothing to name it by.
		return
	}
	o := observation{
		domain: domain, rule: info, limit: lim, entries: entries,
		used: used, cap: capacity, over: over,
		resetAt: now.Add(st.ResetAfter).UnixNano(), now: now.UnixNano(), weight: weight,
	}
	r.keys.observe(r.keys.hashKey(domain, info, lim, entries), &o)
}

// info returns what the rules in use say of lim, nil when they do not
// hold it (a per-request override).
func (r *Recorder) info(lim *rules.Limit) *ruleInfo {
	set := r.rules.Load()
	if set == nil {
		return nil
	}
	// Limits are allocated apart, more than 64 bytes each.
	c := &r.recent[(uintptr(unsafe.Pointer(lim))>>6)%uintptr(len(r.recent))]
	if info := c.Load(); info != nil && info.limit == lim && info.version == set.version {
		return info
	}
	info := set.byLimit[lim]
	if info != nil {
		c.Store(info)
	}
	return info
}

// Run ticks every second until ctx is done.
func (r *Recorder) Run(ctx context.Context) {
	if r == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Tick(r.cfg.Now())
		}
	}
}

// Tick closes the second under way: what was counted since the last tick
// becomes the figures of now's second, and the sketch's counts decay.
// Run calls it every second; tests call it with their own clock.
func (r *Recorder) Tick(now time.Time) {
	if r == nil {
		return
	}
	r.keys.tick(now)
	r.unknownDomains.tick(now)
	r.unmatchedKeys.tick(now)
	sec := now.Unix()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.last == 0:
		r.last = sec
	case sec > r.last:
		// Seconds without a tick (a stalled process, a clock step)
		// count nothing.
		for s := r.last + 1; s <= sec && s <= r.last+Window; s++ {
			r.clearSecond(ringSlot(s))
		}
		r.last = sec
	}
	// A tick in the same second as the last one (or earlier, when the
	// clock stepped back) adds to the last second.
	i := ringSlot(r.last)
	var sum [3]uint64
	for _, se := range r.series {
		ev := se.events.Swap(0)
		over, near := ev>>32, ev&math.MaxUint32
		v := [3]uint64{se.other.Swap(0) + over + near, over, near}
		for k := range v {
			se.ring[k][i] = add32(se.ring[k][i], v[k])
			if !se.shadow {
				sum[k] += v[k]
			}
		}
	}
	for k := range sum {
		r.totals.ring[k][i] = add32(r.totals.ring[k][i], sum[k])
	}
	r.totals.ring[ringNearCache][i] = add32(r.totals.ring[ringNearCache][i], r.nearCache.Swap(0))
	r.totals.ring[ringStoreErrors][i] = add32(r.totals.ring[ringStoreErrors][i], r.store.tick())
	close(r.ticked)
	r.ticked = make(chan struct{})
}

// clearSecond zeroes slot i of every ring. Called with r.mu held.
func (r *Recorder) clearSecond(i int) {
	for _, se := range r.series {
		for k := range se.ring {
			se.ring[k][i] = 0
		}
	}
	for k := range r.totals.ring {
		r.totals.ring[k][i] = 0
	}
}

// ringSlot returns the ring slot of a Unix second.
func ringSlot(sec int64) int { return int((sec%Window + Window) % Window) }

// add32 adds v to a, saturating.
func add32(a uint32, v uint64) uint32 { return uint32(min(uint64(a)+v, math.MaxUint32)) }

// Ticked returns a channel closed at the next tick. A nil *Recorder's
// never closes.
func (r *Recorder) Ticked() <-chan struct{} {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ticked
}

// Series is the figures of one rule, or of all, one per second, oldest
// first.
type Series struct {
	Decisions, OverLimit, NearLimit []uint32
}

// Totals is the figures of the whole service, one per second, oldest
// first. Decisions, OverLimit and NearLimit add up the tracked rules but
// shadow limits, whose decisions are counted under the limits that
// decided too.
type Totals struct {
	Series
	// NearCacheHits counts the decisions answered from the near cache.
	NearCacheHits []uint32
	// StoreErrors counts the decisions that failed in the store.
	StoreErrors []uint32
}

// Traffic is the traffic of the last seconds up to End.
type Traffic struct {
	// End is the last second counted; zero before the first tick.
	End time.Time
	// Rules holds each tracked rule's series by rule ID.
	Rules  map[string]Series
	Totals Totals
}

// Traffic returns the figures of the last seconds (at most Window), up to
// the last tick.
func (r *Recorder) Traffic(seconds int) Traffic {
	if r == nil {
		return Traffic{}
	}
	seconds = min(max(seconds, 1), Window)
	set := r.rules.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := Traffic{Rules: map[string]Series{}}
	if r.last == 0 {
		return t
	}
	t.End = time.Unix(r.last, 0)
	read := func(ring *[Window]uint32) []uint32 {
		out := make([]uint32, seconds)
		for j := range out {
			out[j] = ring[ringSlot(r.last-int64(seconds-1-j))]
		}
		return out
	}
	if set != nil {
		for _, rule := range set.rules {
			se := r.series[rule.ID]
			if se == nil {
				continue
			}
			t.Rules[rule.ID] = Series{read(&se.ring[ringDecisions]), read(&se.ring[ringOver]), read(&se.ring[ringNear])}
		}
	}
	tr := &r.totals.ring
	t.Totals = Totals{
		Series:        Series{read(&tr[ringDecisions]), read(&tr[ringOver]), read(&tr[ringNear])},
		NearCacheHits: read(&tr[ringNearCache]),
		StoreErrors:   read(&tr[ringStoreErrors]),
	}
	return t
}

// TopKeys returns, per domain, the n keys nearest to or over their limit
// right now (see Key): over-limit keys first, then by the share of the
// limit used.
func (r *Recorder) TopKeys(n int) map[string][]Key {
	if r == nil {
		return map[string][]Key{}
	}
	return r.keys.top(max(n, 1), r.cfg.Now())
}

// MaxKeys returns the sketch's capacity.
func (r *Recorder) MaxKeys() int {
	if r == nil {
		return 0
	}
	return r.keys.capacity()
}
