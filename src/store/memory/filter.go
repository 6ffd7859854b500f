package memory

import (
	"hash/maphash"
	"math"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// The filters hold the keys over their limit that the store can no longer
// keep one by one, a filter per rule (limiter.Op.Rule), in a few bytes a
// key instead of a record's 112 (see Store). A rule's filter is a few
// groups, one per time at which their keys' state becomes that of a new
// key again (their idle time); a group is a chain of Bloom filters, each
// an array of 512-bit blocks (one cache line) in which a key sets one bit
// in each word of one block. A key is over its limit until the latest
// idle time of the live groups whose filters hold it.
//
// Every error refuses too much, never too little: a key a filter holds
// (or seems to, with the false-positive rate of filterRate) is answered
// from the most its state can have used until that time (foldedState), a
// group's time is its keys' idle time rounded up, and a filter halved to
// make room ORs its halves together.

const (
	// blockWords is the 64-bit words of a block, one cache line; a key
	// sets and tests one bit in each.
	blockWords = 8
	// keyBits is the bits a filter is given for each key it holds before
	// a group chains a new one: 64, for a false-positive rate of about
	// 3e-7 (filterRate, TestFilterRate).
	keyBits = 64
	// firstBlocks is the smallest filter a group chains (1 KiB, 128 keys
	// at keyBits); each next one is at least twice the last.
	firstBlocks = 16
	// maxBlocks is the largest filter: 2^22 blocks, 256 MiB.
	maxBlocks = 1 << 22
	// maxGroups is the most groups of a rule. A key whose time would make
	// one more joins the group that ends next after it, or the last one,
	// whose time it then moves later.
	maxGroups = 32
	// groupSteps is how finely a group's time splits a window: a key's
	// idle time is rounded up to the next eighth of its window (exact for
	// fixed and sliding windows, whose idle times fall on whole windows).
	groupSteps = 8
)

// What the filters cost, as Bytes accounts them
// (TestFilterAccountingCoversTheHeap measures the heap against these
// numbers).
const (
	// filterBytes is a rule's filter: its map slot and ruleFilter.
	filterBytes = 128
	// groupBytes is a group: its place in the rule's slice (48 bytes,
	// twice that just after the slice grew) and its slice of blooms.
	groupBytes = 128
	// bloomBytes is a bloom apart from its words: the struct and its
	// place in the group's slice.
	bloomBytes = 48
)

// groupKey names a group: its rule and its time.
type groupKey struct {
	rule uint32
	idle int64
}

// ruleFilter is the filter of one rule.
type ruleFilter struct {
	groups []group
	// bytes is what the filter costs, as Bytes accounts it.
	bytes int64
}

// group is the keys of a rule over their limit until one time.
type group struct {
	// idle is when (Unix µs) its keys' state is that of a new key.
	idle   int64
	blooms []*bloom
	// added counts the keys added; a group that found no room for a new
	// filter tries again once added reaches retry.
	added, retry int
}

// bloom is one Bloom filter of a group's chain.
type bloom struct {
	words []uint64 // blocks × blockWords
	keys  int      // keys added, counted again when added again
}

// cost is what b costs, as Bytes accounts it.
func (b *bloom) cost() int64 { return int64(len(b.words))*8 + bloomBytes }

// bloomCost is what a bloom of blocks blocks costs.
func bloomCost(blocks int) int64 { return int64(blocks)*blockWords*8 + bloomBytes }

func (b *bloom) blocks() int { return len(b.words) / blockWords }

// capacity is how many keys b holds at keyBits each; it takes more when
// no other can be made, each raising its false-positive rate.
func (b *bloom) capacity() int { return b.blocks() * 512 / keyBits }

func newBloom(blocks int) *bloom { return &bloom{words: make([]uint64, blocks*blockWords)} }

// probe returns the first word of h's block in b and the bits h sets in
// its words, one in each (a split-block Bloom filter, as Parquet's). The
// block is picked by h's high bits, which the shard index (its low bits)
// leaves free, modulo the power-of-two number of blocks: the block of a
// halved filter is that of the full one modulo the half, so ORing the
// halves keeps every key. The bits are 6 each of h mixed again.
func (b *bloom) probe(h uint64) (int, [blockWords]uint64) {
	first := int((h>>32)&uint64(b.blocks()-1)) * blockWords
	z := h ^ h>>31 // splitmix64's finalizer
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	var set [blockWords]uint64
	for i := range set {
		set[i] = 1 << (z >> (6 * i) & 63)
	}
	return first, set
}

func (b *bloom) add(h uint64) {
	first, set := b.probe(h)
	for i, w := range set {
		b.words[first+i] |= w
	}
	b.keys++
}

func (b *bloom) has(h uint64) bool {
	first, set := b.probe(h)
	for i, w := range set {
		if b.words[first+i]&w != w {
			return false
		}
	}
	return true
}

// halve ORs the upper half of b into the lower and keeps that half.
func (b *bloom) halve() {
	half := len(b.words) / 2
	w := make([]uint64, half) // a new array, so that the old one is freed
	for i := range w {
		w[i] = b.words[i] | b.words[half+i]
	}
	b.words = w
}

// rate is b's expected false-positive rate.
func (b *bloom) rate() float64 {
	if b.keys == 0 {
		return 0
	}
	return filterRate(float64(len(b.words)*64) / float64(b.keys))
}

// filterRate is the false-positive rate of a filter giving each key
// bitsPerKey bits: the chance that a key not in it finds its bit set in
// each of the 8 words of its block. A block holds k keys, k of Poisson's
// law of mean λ = 512/bitsPerKey, and each key sets one bit of 64 in a
// word, so the rate is the mean over k of (1 − (63/64)^k)^8. It is 3e-7 at
// 64 bits a key, 1.7e-5 at 32, 9e-4 at 16, 2.9% at 8 and 32% at 4, as
// TestFilterRate measures.
func filterRate(bitsPerKey float64) float64 {
	if bitsPerKey <= 0 {
		return 1
	}
	lambda := 512 / bitsPerKey
	spread := 10*math.Sqrt(lambda) + 40
	rate := 0.0
	for k := max(0, math.Floor(lambda-spread)); k <= lambda+spread; k++ {
		lg, _ := math.Lgamma(k + 1)
		p := math.Exp(k*math.Log(lambda) - lambda - lg)
		rate += p * math.Pow(1-math.Pow(63.0/64, k), blockWords)
	}
	return min(rate, 1)
}

// ruleID names a rule in the filters: 32 bits of its name's hash. Two
// rules of one hash would share a filter, which only raises its
// false-positive rate; among 10,000 rules the chance is 1 in 86,000.
func (s *Store) ruleID(rule string) uint32 { return uint32(maphash.String(s.seed, rule)) }

// groupIdle is idle (Unix µs) rounded up to the next eighth of window
// seconds (at least 1 s, at most math.MaxInt64).
func groupIdle(idle int64, window uint32) int64 {
	q := max(int64(window)*int64(time.Second/time.Microsecond)/groupSteps, int64(time.Second/time.Microsecond))
	if idle > math.MaxInt64-q {
		return math.MaxInt64
	}
	if r := idle % q; r > 0 {
		idle += q - r
	} else if r < 0 {
		idle -= r
	}
	return idle
}

// windowSeconds is op's window in whole seconds, at most math.MaxUint32.
func windowSeconds(op *limiter.Op) uint32 {
	return uint32(min(int64(op.Window/time.Second), math.MaxUint32))
}

// foldedIdle returns the latest idle time after t (Unix µs) of rule's
// groups whose filters hold h, or 0 when none does.
func (s *Store) foldedIdle(rule uint32, h uint64, t int64) int64 {
	s.fmu.RLock()
	defer s.fmu.RUnlock()
	f := s.filters[rule]
	if f == nil {
		return 0
	}
	var idle int64
	for i := range f.groups {
		g := &f.groups[i]
		if g.idle <= t || g.idle <= idle {
			continue
		}
		for _, b := range g.blooms {
			if b.has(h) {
				idle = g.idle
				break
			}
		}
	}
	return idle
}

// fold adds the key of hash h, over its limit until idle (Unix µs), with a
// window of window seconds, to rule's filter; hint is how many keys the
// caller is folding into its group at once, to size a new filter for
// them. The caller holds s.fmu.
func (s *Store) fold(rule uint32, h uint64, idle int64, window uint32, t, hint int64) {
	f := s.filters[rule]
	if f == nil {
		f = &ruleFilter{bytes: filterBytes}
		s.filters[rule] = f
		s.nfilters.Store(int32(len(s.filters)))
		s.account(nil, filterBytes)
	}
	s.dropDead(f, t)
	gi := groupIdle(idle, window)
	g := f.group(gi, s.filterRoom(groupBytes+bloomCost(firstBlocks)))
	if g == nil {
		f.groups = append(f.groups, group{idle: gi})
		g = &f.groups[len(f.groups)-1]
		s.account(f, groupBytes)
	}
	g.added++
	if n := len(g.blooms); n > 0 && g.blooms[n-1].keys < g.blooms[n-1].capacity() {
		g.blooms[n-1].add(h)
		return
	}
	if g.added >= g.retry {
		if s.chain(f, g, hint) {
			g.blooms[len(g.blooms)-1].add(h)
			return
		}
		// Looking for room costs a pass over the rules: not again
		// before the group has a 16th more keys.
		g.retry = g.added + max(g.added/16, firstBlocks*512/keyBits)
	}
	// No room for a new filter: the least loaded one takes the key, so
	// that the group's rate rises evenly.
	least := g.blooms[0]
	for _, b := range g.blooms[1:] {
		if b.keys*least.blocks() < least.keys*b.blocks() {
			least = b
		}
	}
	least.add(h)
}

// chain adds a new, empty filter to g, f's group, and reports whether it
// did: for hint keys at keyBits each, and at least twice the last one
// (firstBlocks for the first), or the largest that f may take (see
// growFilter), at least firstBlocks. A group's first filter is made even
// when there is no room, of one block. The caller holds s.fmu.
func (s *Store) chain(f *ruleFilter, g *group, hint int64) bool {
	want := firstBlocks
	if n := len(g.blooms); n > 0 {
		want = 2 * g.blooms[n-1].blocks()
	}
	for want < maxBlocks && int64(want)*512 < hint*keyBits {
		want *= 2
	}
	for blocks := want; blocks >= firstBlocks; blocks /= 2 {
		if s.growFilter(f, bloomCost(blocks)) {
			g.blooms = append(g.blooms, newBloom(blocks))
			s.account(f, bloomCost(blocks))
			return true
		}
	}
	if len(g.blooms) == 0 {
		g.blooms = append(g.blooms, newBloom(1))
		s.account(f, bloomCost(1))
		return true
	}
	return false
}

// group returns f's group of time idle, or one ending later, or nil when a
// new one should be made for it: when there is none, and f has fewer than
// maxGroups groups and room for one (room); else the group that ends next
// after idle, or the last one, whose time moves to idle.
func (f *ruleFilter) group(idle int64, room bool) *group {
	var next, last *group
	for i := range f.groups {
		g := &f.groups[i]
		switch {
		case g.idle == idle:
			return g
		case g.idle > idle && (next == nil || g.idle < next.idle):
			next = g
		}
		if last == nil || g.idle > last.idle {
			last = g
		}
	}
	switch {
	case last == nil || len(f.groups) < maxGroups && room:
		return nil
	case next != nil:
		return next
	}
	last.idle = idle // later: its keys are refused longer, never shorter
	return last
}

// account adds n bytes to the totals, and to f's when f is not nil. The
// caller holds s.fmu.
func (s *Store) account(f *ruleFilter, n int64) {
	if f != nil {
		f.bytes += n
	}
	s.filterBytes += n
	s.bytes.Add(n)
}

// filterBudget is the most the filters may take: half of MaxBytes, so that
// the keys the store holds one by one always have the other half; no bound
// without a byte ceiling.
func (s *Store) filterBudget() int64 {
	if s.maxBytes <= 0 {
		return math.MaxInt64
	}
	return s.maxBytes / 2
}

// filterRoom reports whether n more bytes of filters fit the budget, and
// the ceiling with a 16th to spare: a filter made when the ceiling is near
// is paid for by the next new keys, which make room as for themselves.
// The caller holds s.fmu.
func (s *Store) filterRoom(n int64) bool {
	return s.filterBytes+n <= s.filterBudget() && (s.maxBytes <= 0 || s.bytes.Load()+n <= s.maxBytes+s.maxBytes/16)
}

// growFilter reports whether f may take n more bytes for a filter: when
// they fit, or once halving the largest filters of the rules that take
// more than f would with them has made room (each rule gets an equal
// share of the budget, and more while the others leave it unused). The
// caller holds s.fmu.
func (s *Store) growFilter(f *ruleFilter, n int64) bool {
	for !s.filterRoom(n) {
		var largest *bloom
		var owner *ruleFilter
		for _, o := range s.filters {
			if o == f || o.bytes <= f.bytes+n {
				continue
			}
			for i := range o.groups {
				for _, b := range o.groups[i].blooms {
					if len(b.words) > blockWords && (largest == nil || len(b.words) > len(largest.words)) {
						largest, owner = b, o
					}
				}
			}
		}
		if largest == nil {
			return false
		}
		freed := int64(len(largest.words)) * 4
		largest.halve()
		s.account(owner, -freed)
		s.halved.Add(1)
	}
	return true
}

// dropDead removes f's groups whose time is past. The caller holds s.fmu.
func (s *Store) dropDead(f *ruleFilter, t int64) {
	live := f.groups[:0]
	for _, g := range f.groups {
		if g.idle > t {
			live = append(live, g)
			continue
		}
		n := int64(groupBytes)
		for _, b := range g.blooms {
			n += b.cost()
		}
		s.account(f, -n)
	}
	clear(f.groups[len(live):])
	f.groups = live
}

// sweepFilters removes the groups whose time is past, and the filters of
// rules left with none.
func (s *Store) sweepFilters(t int64) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	for id, f := range s.filters {
		if s.dropDead(f, t); len(f.groups) == 0 {
			s.account(f, -filterBytes)
			delete(s.filters, id)
		}
	}
	s.nfilters.Store(int32(len(s.filters)))
}

// FilterFalsePositive returns the largest false-positive rate among the
// rules' filters: the chance that a new key of that rule, which no filter
// holds, is answered as over its limit. It is 0 while no key was folded
// into a filter (see Store).
func (s *Store) FilterFalsePositive() float64 {
	s.fmu.RLock()
	defer s.fmu.RUnlock()
	worst := 0.0
	for _, f := range s.filters {
		missed := 1.0 // the chance that no filter of f holds a new key
		for i := range f.groups {
			for _, b := range f.groups[i].blooms {
				missed *= 1 - b.rate()
			}
		}
		worst = max(worst, 1-missed)
	}
	return worst
}

// foldedState is the state a key of op's algorithm that only its rule's
// filter holds, over its limit until idle (Unix µs), is answered from: the
// most a key over its limit until then can have used, so that whatever it
// admits the key's own state would admit too. A fixed window holds its
// limit (refused until the window ends); a sliding window its limit in the
// window that ends a window before idle and in the one before that
// (refused while the first is current, then as that count leaves); a token
// bucket is full again only at idle (it admits as it refills). A sliding
// log is answered by foldedLog.
func foldedState(op *limiter.Op, idle int64) state {
	switch op.Algorithm {
	case rules.SlidingWindow:
		w := max(op.Window.Microseconds(), 1)
		start := idle - 2*w
		start -= ((start % w) + w) % w // the window's start, on whole windows as the key's
		return state{idle: idle, t: start, n1: op.Limit, n2: op.Limit}
	case rules.TokenBucket, rules.SlidingLog:
		return state{idle: idle, t: idle}
	default:
		return state{idle: idle, n1: op.Limit}
	}
}

// foldedLog is the result of op on a sliding log that only its rule's
// filter holds, over its limit until idle: a log of as many hits as its
// limit, the newest leaving the window at idle, so no hit fits before. A
// refund gives nothing back (there is no count to take it from).
func foldedLog(op *limiter.Op, now time.Time, idle int64) limiter.Result {
	c := op.Capacity()
	r := limiter.Result{Before: c, After: c + op.Hits, Allowed: op.Hits == 0,
		ResetAfter: time.Duration(idle-now.UnixMicro()) * time.Microsecond}
	if op.Refund {
		r.After, r.Allowed = c, true
	}
	return r
}
