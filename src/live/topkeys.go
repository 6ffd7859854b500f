package live

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// maxKeyBytes bounds the bytes of a key's entries kept in a slot; a
// longer key is kept cut (Key.Truncated) and still told apart from
// others by the hash of all its entries.
const maxKeyBytes = 256

// At each tick an entry's count loses 1/sketchDecay of itself (1/8 a
// second: it halves in about 5 s), so that "right now" wins over "an
// hour ago": a key that stopped pushing on its limit sinks and is the
// first to make room. Counts are kept in 1/countScale units so that the
// decay of small counts is smooth.
const (
	sketchDecay = 8
	countScale  = 256
)

// keyIdle is how long a key that has not been seen near or over its
// limit is still shown.
const keyIdle = time.Minute

// sketch is the top-keys table: a Space-Saving summary (Metwally,
// Agrawal, El Abbadi, "Efficient computation of frequent and top-k
// elements in data streams", 2005) of the decisions near or over their
// limit, split into shards of their own lock. Each shard holds a fixed
// number of slots allocated up front; a key not in a full shard takes the
// slot of the smallest count and inherits that count, so a key seen more
// often than that count is never missed, whatever the number of distinct
// keys. Memory is fixed at creation: the slots, an open-addressing index
// and a min-heap, none of which grows.
//
// It is hand-written rather than a library's because it must not
// allocate on the hot path (Go maps may allocate when deletions force a
// rehash, and keys are copied into fixed slots rather than into strings),
// and because its entries carry the limit's state besides the count.
type sketch struct {
	seed   maphash.Seed
	shards []shard
	mask   uint64
	// heldUntil is a Unix time in nanoseconds before which every slot
	// holds a key at or over its limit, in a window that has not ended,
	// seen within keyIdle; 0 when some slot does not. Until then only
	// keys over their limit may take a slot (see tick).
	heldUntil atomic.Int64
}

// shard is one lock's part of the sketch. The heap and the index hold
// what their loops compare (counts, hashes) so that they stay in a few
// cache lines instead of reading the slots, which are large.
type shard struct {
	// mu guards every field below.
	mu    sync.Mutex
	slots []slot      // len grows to cap, never beyond
	heap  []heapEntry // min-heap by count
	pos   []int32     // pos[i] is slot i's place in heap
	index []indexEntry
	_     [64]byte
}

// heapEntry is a slot's count: the Space-Saving estimate of its decisions
// near or over the limit (in 1/countScale), decayed.
type heapEntry struct {
	count uint64
	slot  int32
}

// indexEntry is one place of the open-addressing index: slot + 1, 0 when
// empty.
type indexEntry struct {
	hash uint64
	slot int32
}

// slot is one tracked key and what its last decision said.
type slot struct {
	hash uint64
	err  uint64 // the count inherited when the key took the slot (overestimate bound)

	domain  string
	rule    *ruleInfo    // nil for a per-request override
	limit   *rules.Limit // the limit applied
	used    uint64
	cap     uint64
	over    bool
	resetAt int64 // Unix nanoseconds
	seen    int64 // Unix nanoseconds

	key keyBytes
}

// keyBytes holds a descriptor's entries in place, without a string of
// their own: each entry as uvarint length + bytes, key then value, cut
// at maxKeyBytes.
type keyBytes struct {
	truncated bool
	n         uint16
	b         [maxKeyBytes]byte
}

// newSketch returns a sketch of about capacity slots (at least 1).
func newSketch(capacity int) *sketch {
	capacity = max(capacity, 1)
	// Shards of 64 slots or more, at most 16 of them: enough to spread
	// two cores' worth of near-limit traffic, few enough that a shard's
	// smallest count is close to the whole table's.
	n := 1
	for n < 16 && capacity/(n*2) >= 64 {
		n *= 2
	}
	k := &sketch{seed: maphash.MakeSeed(), shards: make([]shard, n), mask: uint64(n - 1)}
	per := (capacity + n - 1) / n
	size := 1 << bits.Len(uint(per*2-1)) // a power of two, at least twice the slots
	for i := range k.shards {
		sh := &k.shards[i]
		sh.slots = make([]slot, 0, per)
		sh.heap = make([]heapEntry, 0, per)
		sh.pos = make([]int32, per)
		sh.index = make([]indexEntry, size)
	}
	return k
}

// capacity returns the number of slots.
func (k *sketch) capacity() int { return len(k.shards) * cap(k.shards[0].slots) }

// hashKey hashes what tells two keys apart: the rule (or the override's
// limit) and the entries. Entries are written with a 0xff byte after each
// key and value: a byte that valid UTF-8 never holds, and gRPC and
// /json only let valid UTF-8 strings through, so no two entry lists hash
// the same bytes.
func (k *sketch) hashKey(domain string, rule *ruleInfo, lim *rules.Limit, entries []rules.Entry) uint64 {
	var h maphash.Hash
	h.SetSeed(k.seed)
	if rule != nil {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rule.hash)
		_, _ = h.Write(b[:])
	} else {
		var b [13]byte
		binary.LittleEndian.PutUint32(b[0:], lim.RequestsPerUnit)
		binary.LittleEndian.PutUint32(b[4:], uint32(lim.Unit))
		binary.LittleEndian.PutUint32(b[8:], lim.UnitMultiplier)
		b[12] = 0xff
		_, _ = h.Write(b[:])
		_, _ = h.WriteString(domain)
		_ = h.WriteByte(0xff)
	}
	for i := range entries {
		_, _ = h.WriteString(entries[i].Key)
		_ = h.WriteByte(0xff)
		_, _ = h.WriteString(entries[i].Value)
		_ = h.WriteByte(0xff)
	}
	return h.Sum64()
}

// observation is one decision to record.
type observation struct {
	domain  string
	rule    *ruleInfo
	limit   *rules.Limit
	entries []rules.Entry
	used    uint64
	cap     uint64
	over    bool
	resetAt int64
	now     int64
	weight  uint64
}

// observe records o under hash.
func (k *sketch) observe(hash uint64, o *observation) {
	// The shard from the high bits: the index uses the low ones.
	sh := &k.shards[(hash>>48)&k.mask]
	sh.mu.Lock()
	i := sh.find(hash)
	var s *slot
	switch {
	case i >= 0:
		s = &sh.slots[i]
		sh.heap[sh.pos[i]].count += o.weight
		sh.down(int(sh.pos[i]))
	case len(sh.slots) < cap(sh.slots):
		i = int32(len(sh.slots))
		sh.slots = sh.slots[:i+1]
		s = &sh.slots[i]
		s.hash, s.err = hash, 0
		sh.pos[i] = int32(len(sh.heap))
		sh.heap = append(sh.heap, heapEntry{count: o.weight, slot: i})
		sh.up(len(sh.heap) - 1)
		sh.insert(hash, i)
		s.key.set(o.entries, true)
	default:
		// Space-Saving: the new key replaces the smallest count and
		// inherits it, since it may have been seen that often unnoticed.
		least := &sh.heap[0]
		i = least.slot
		s = &sh.slots[i]
		sh.remove(s.hash)
		s.hash, s.err = hash, least.count
		least.count += o.weight
		sh.insert(hash, i)
		sh.down(0)
		s.key.set(o.entries, true)
	}
	s.domain, s.rule, s.limit = o.domain, o.rule, o.limit
	s.used, s.cap, s.over = o.used, o.cap, o.over
	s.resetAt, s.seen = o.resetAt, o.now
	sh.mu.Unlock()
}

// set copies entries into k, their values too or only their keys (as
// empty values), cut at maxKeyBytes on a character boundary.
func (k *keyBytes) set(entries []rules.Entry, values bool) {
	b := k.b[:0]
	k.truncated = false
	for _, e := range entries {
		value := ""
		if values {
			value = e.Value
		}
		for _, part := range [2]string{e.Key, value} {
			room := maxKeyBytes - len(b) - binary.MaxVarintLen16
			if room < len(part) {
				k.truncated = true
				part = part[:max(cutRune(part, room), 0)]
			}
			b = binary.AppendUvarint(b, uint64(len(part)))
			b = append(b, part...)
			if k.truncated {
				k.n = uint16(len(b))
				return
			}
		}
	}
	k.n = uint16(len(b))
}

// cutRune returns the largest n <= max at which s can be cut without
// splitting a character.
func cutRune(s string, n int) int {
	if n <= 0 {
		return 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// entries decodes k.
func (k *keyBytes) entries() []rules.Entry {
	b := k.b[:k.n]
	var out []rules.Entry
	for len(b) > 0 {
		var parts [2]string
		for j := range parts {
			n, w := binary.Uvarint(b)
			if w <= 0 || n > uint64(len(b)-w) {
				return out
			}
			parts[j] = string(b[w : w+int(n)])
			b = b[w+int(n):]
			if len(b) == 0 && j == 0 {
				out = append(out, rules.Entry{Key: parts[0]})
				return out
			}
		}
		out = append(out, rules.Entry{Key: parts[0], Value: parts[1]})
	}
	return out
}

// find returns the slot index of hash, or -1.
func (sh *shard) find(hash uint64) int32 {
	mask := uint64(len(sh.index) - 1)
	for p := hash & mask; ; p = (p + 1) & mask {
		e := &sh.index[p]
		if e.slot == 0 {
			return -1
		}
		if e.hash == hash {
			return e.slot - 1
		}
	}
}

// insert indexes slot i under hash, which is not indexed yet. The index
// is at least twice the slots, so there is always an empty place.
func (sh *shard) insert(hash uint64, i int32) {
	mask := uint64(len(sh.index) - 1)
	p := hash & mask
	for sh.index[p].slot != 0 {
		p = (p + 1) & mask
	}
	sh.index[p] = indexEntry{hash: hash, slot: i + 1}
}

// remove drops hash from the index, moving back the entries after it so
// that every lookup still finds its entry without tombstones (Knuth's
// algorithm R for linear probing).
func (sh *shard) remove(hash uint64) {
	mask := uint64(len(sh.index) - 1)
	p := hash & mask
	for sh.index[p].hash != hash || sh.index[p].slot == 0 {
		p = (p + 1) & mask
	}
	sh.index[p] = indexEntry{}
	for q := (p + 1) & mask; sh.index[q].slot != 0; q = (q + 1) & mask {
		home := sh.index[q].hash & mask
		// The entry at q may move to p unless its home lies cyclically
		// in (p, q].
		if (q > p && (home <= p || home > q)) || (q < p && home <= p && home > q) {
			sh.index[p], sh.index[q] = sh.index[q], indexEntry{}
			p = q
		}
	}
}

func (sh *shard) less(a, b int) bool { return sh.heap[a].count < sh.heap[b].count }

func (sh *shard) swap(a, b int) {
	sh.heap[a], sh.heap[b] = sh.heap[b], sh.heap[a]
	sh.pos[sh.heap[a].slot] = int32(a)
	sh.pos[sh.heap[b].slot] = int32(b)
}

func (sh *shard) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !sh.less(j, p) {
			return
		}
		sh.swap(j, p)
		j = p
	}
}

func (sh *shard) down(j int) {
	n := len(sh.heap)
	for {
		c := 2*j + 1
		if c >= n {
			return
		}
		if c+1 < n && sh.less(c+1, c) {
			c++
		}
		if !sh.less(c, j) {
			return
		}
		sh.swap(j, c)
		j = c
	}
}

// tick takes 1/sketchDecay off every count (the heap stays ordered: the
// decay never reverses two counts) and sets heldUntil.
//
// When every slot holds a key that is at or over its limit right now,
// the table shows a thousand keys being limited (an incident, a flood):
// a key that merely comes near or fills its limit would take the slot
// of one of them, and would not show among the first of its domain
// anyway. Observe then skips such decisions without hashing them, until
// the first of those keys resets or goes idle; keys refused keep
// entering by Space-Saving. Without it, ten thousand keys filling their
// limit each window cost the hot path a replacement each.
func (k *sketch) tick(now time.Time) {
	t := now.UnixNano()
	held := int64(math.MaxInt64)
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for j := range sh.heap {
			sh.heap[j].count -= sh.heap[j].count / sketchDecay
		}
		if len(sh.slots) < cap(sh.slots) {
			held = 0
		}
		for j := range sh.slots {
			s := &sh.slots[j]
			s.err -= s.err / sketchDecay
			if until := min(s.resetAt, s.seen+int64(keyIdle)); s.used < s.cap || until <= t {
				held = 0
			} else {
				held = min(held, until)
			}
		}
		sh.mu.Unlock()
	}
	k.heldUntil.Store(held)
}

// Key is one key near or over its limit.
type Key struct {
	Domain string
	// Entries are the descriptor's entries the key is counted under (for
	// a share_threshold rule, the wildcard pattern stands for the value).
	// They are request data: escape them before showing them.
	Entries []rules.Entry
	// Truncated reports that Entries were cut to 256 bytes.
	Truncated bool
	// RuleID is the ID of the rule (see Rule), or "" for a per-request
	// override.
	RuleID string
	// Limit is the limit applied.
	Limit *rules.Limit
	// Used and Capacity are the key's use of its limit at its last
	// decision: the hits counted and the most it admits (a token
	// bucket's burst). Over the limit, Used is Capacity.
	Used, Capacity uint64
	// Over reports that the last decision was over the limit; for a
	// shadow limit (Limit.Shadow) that it would have been refused.
	Over bool
	// ResetIn is the time until the limit resets (a token bucket: until
	// it is full), counted from the read.
	ResetIn time.Duration
	// Count estimates the decisions near or over the limit recently,
	// decayed by half about every 5 s; CountError bounds its
	// overestimate.
	Count, CountError uint64
	// Seen is when the key was last decided near or over its limit.
	Seen time.Time
}

// top returns, per domain, the n keys nearest to or over their limit at
// now: those whose limit has not reset since they were last seen and that
// were seen within keyIdle; over-limit keys first, then by use of the
// limit, then by count.
func (k *sketch) top(n int, now time.Time) map[string][]Key {
	t := now.UnixNano()
	out := map[string][]Key{}
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			s := &sh.slots[j]
			if s.resetAt <= t || t-s.seen > int64(keyIdle) {
				continue
			}
			key := Key{
				Domain: s.domain, Entries: s.key.entries(), Truncated: s.key.truncated, Limit: s.limit,
				Used: s.used, Capacity: s.cap, Over: s.over, ResetIn: time.Duration(s.resetAt - t),
				Count: sh.heap[sh.pos[j]].count / countScale, CountError: s.err / countScale, Seen: time.Unix(0, s.seen),
			}
			if s.rule != nil {
				key.RuleID = s.rule.id
			}
			out[s.domain] = append(out[s.domain], key)
		}
		sh.mu.Unlock()
	}
	for d, keys := range out {
		slices.SortFunc(keys, compareKeys)
		if len(keys) > n {
			keys = keys[:n]
		}
		out[d] = keys
	}
	return out
}

// compareKeys orders keys over their limit first, then by the share of
// the limit used, then by count, then by entries (a stable order).
func compareKeys(a, b Key) int {
	if a.Over != b.Over {
		if a.Over {
			return -1
		}
		return 1
	}
	// a.Used/a.Capacity > b.Used/b.Capacity, without division; the
	// products fit: Used <= Capacity < 2^32.
	if x, y := a.Used*b.Capacity, b.Used*a.Capacity; x != y {
		if x > y {
			return -1
		}
		return 1
	}
	if a.Count != b.Count {
		if a.Count > b.Count {
			return -1
		}
		return 1
	}
	return slices.CompareFunc(a.Entries, b.Entries, func(x, y rules.Entry) int {
		return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Value, y.Value))
	})
}
