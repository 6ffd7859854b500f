// Package memory is the embedded store: every key's state in this process,
// in sharded maps, with idle keys reclaimed by a sweeper. It is the default
// backend (one instance, nothing to install) and runs every algorithm by
// calling the limiter's pure functions under a shard lock. It knows nothing
// of rules files, gRPC or the other stores.
package memory

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// DefaultMaxBytes is the byte ceiling of a Store whose Config.MaxBytes is
// 0, and the default of MEMORY_MAX_BYTES: 64 MiB of keys, about 280,000
// keys of 50 bytes or 12,000 of 4 KB. The keys' live heap stays under it
// (TestDefaultCeilingHeap); with Go's GC pacing the heap peaks near twice
// the live data, and the service stays under about 200 MiB RSS however many
// keys its clients make up (181 MiB measured after 800,000 small keys, then
// 80,000 of 4 KB). It fits a 256 MiB container.
const DefaultMaxBytes = 64 << 20

// Config tunes a Store. The zero value is usable: a ceiling of
// DefaultMaxBytes, no key-count ceiling, the system clock, a sweep every
// 10 seconds, 256 shards.
type Config struct {
	// MaxBytes is the most memory the keys may take, in bytes, as Bytes
	// accounts it; 0 means DefaultMaxBytes and a negative value no byte
	// ceiling. At the ceiling a new key makes room by evicting others,
	// compacting keys over their limit, and at last folding them into
	// their rule's filter, which takes at most half of it (see Store).
	MaxBytes int64
	// MaxKeys is the most keys the store holds, compact records included
	// (a filter's keys are not counted); 0 (the default) means no
	// key-count ceiling. At it a new key makes room as at MaxBytes, but
	// compacting a key frees no key: with only keys over their limit
	// left, one is folded. Both ceilings may apply.
	MaxKeys int
	// Now is the clock of the sweeper; default time.Now. Ops use Batch.Now.
	Now func() time.Time
	// SweepInterval is how often the sweeper removes idle keys; default
	// 10 s. A negative value starts no sweeper: call Sweep yourself.
	SweepInterval time.Duration
	// Shards is the number of independently locked maps, rounded up to a
	// power of two; default 256, fewer when a ceiling leaves room for
	// under 16 keys a shard (MaxKeys below 4,096, MaxBytes below 1 MiB).
	Shards int
}

// Store keeps every key's state in memory. It is safe for concurrent use:
// ops on keys of different shards never wait for each other, and each op
// (or, for an AllOrNothing batch, the whole batch) holds its shards' locks
// while it reads and writes. Make one with New and stop its sweeper with
// Close.
//
// A key over its limit (no further hit fits: the last op was refused or
// left Remaining 0) is never forgotten before its state is that of a new
// key again, whatever the flood of new keys (issue 24), and such a flood
// does not cost the other rules their new keys (issue 36). A new key that
// would pass Config.MaxBytes or Config.MaxKeys makes room in its own shard,
// under the lock the op already holds, in this order:
//
//  1. idle keys, whose state is that of a new key again (the whole shard
//     is reclaimed at most once a second, and any idle key sampled below
//     goes first): nothing is lost;
//  2. keys under their limit, approximately least recently used first (the
//     oldest of 5 sampled, as Redis samples for maxmemory-policy): their
//     hits are forgotten, which admits those clients at most one limit more
//     in their window;
//  3. keys over their limit give up their entry and key for a compact
//     record, the least recently used of 5 sampled first: the key's 64-bit
//     hash and its state, recordBytes (112 bytes) however long the key.
//     Nothing is lost for fixed_window, sliding_window and token_bucket; a
//     sliding_log keeps its count with every hit at its newest one's time,
//     so it is refused until its newest hit leaves the window (at most one
//     window longer than its log says, never shorter). The next op on the
//     key turns the record back into an entry.
//
// (A key of 13 bytes or less is not compacted: its entry is no larger.)
// When its shard has none of these left, the new key evicts or compacts a
// key of another shard, among 8 drawn at random that it can lock at once.
// When it finds none and its shard holds keys over their limit:
//
//  4. the records of its shard, and of the next shards it can lock at
//     once until a 256th of the ceiling is freed (foldShare), are folded
//     into a filter of their rule (limiter.Op.Rule), about 8 bytes a key
//     instead of 112 (see filter.go); when there is no record (at MaxKeys,
//     or with keys too short to compact), one entry over its limit of its
//     shard is. A filter only says that a key is over its limit until a
//     time, its idle time rounded up to an eighth of its window (exact for
//     fixed and sliding windows): the key is answered from the most such a
//     key can have used (foldedState), so a filter refuses more than the
//     key's state would, never less. It refuses no more once that time
//     comes; it refuses a new key that it takes for one of its keys, with
//     the false-positive rate FilterFalsePositive reports: about 3e-7 for
//     each filter of the chain of a group of keys while the filters have
//     64 bits a key, rising as they fill (filterRate).
//
// The filters take at most half of MaxBytes, so the keys held one by one
// always keep the other half. A rule's filters grow while there is room;
// a rule short of room halves the largest filter of a rule that takes more
// than it, so that each rule flooded gets an equal share of that half
// (Evictions.Halved); a filter that cannot grow takes more keys than its
// 64 bits a key, and its rate rises. A flood of one rule's keys thus costs
// the other rules none of their new keys and no false positive, and costs
// the flooded rule's new keys the false-positive rate of its filters.
//
// No op is refused: a new key always makes room as above or, when its
// shard has nothing left it may give up, passes the ceiling (below). An
// op on a key the store holds, as an entry, a record or in a filter, is
// answered from it, as is a read. Records and filters' groups stay until
// their state is idle; the sweeper, and the new keys of a full shard,
// remove them then.
//
// The ops of one batch never evict each other's keys. When a shard has
// nothing it may evict and nothing over its limit (it is empty, or holds
// only keys of the batch at hand) the new key is added anyway, and two ops
// on different shards that check a ceiling at the same moment may both add
// theirs; so is a record turned back into an entry. Bytes and Len then pass
// the ceiling by those keys, at most one per shard plus the keys of the
// batches in flight, until the next new key of a shard that has keys to
// evict brings them back under it. A filter made when the store is near
// its ceiling may pass it by a 16th of it, until the next new keys make
// room as for themselves.
type Store struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	maxKeys  int64
	maxBytes int64
	now      func() time.Time
	// keys, records and bytes are the totals of all shards, for the
	// ceilings, Len, Records and Bytes; keys counts the records too.
	keys    atomic.Int64
	records atomic.Int64
	bytes   atomic.Int64
	// The counts Evictions reports.
	reclaimed, evictedUnder, compacted, folded, halved atomic.Uint64
	// foldNext is where the next fold starts looking for shards with
	// records, so that folds go round the store.
	foldNext atomic.Uint32

	// fmu guards filters, the filters in it and filterBytes: the keys over
	// their limit folded into a filter per rule (see filter.go), and what
	// they cost. nfilters is len(filters), read without fmu: while it is 0
	// a new key looks at no filter.
	fmu         sync.RWMutex
	filters     map[uint32]*ruleFilter
	filterBytes int64
	nfilters    atomic.Int32

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Evictions counts what a Store did at its ceilings since New: the keys it
// dropped or compacted, by class, and the new keys it refused.
type Evictions struct {
	// ReclaimedIdle counts keys removed because their state was that of a
	// new key again (the sweeper's and those reclaimed at a ceiling):
	// nothing was lost.
	ReclaimedIdle uint64
	// UnderLimit counts keys evicted at a ceiling while under their limit:
	// their hits are forgotten, which admits at most one limit more for
	// those clients.
	UnderLimit uint64
	// Compacted counts keys over their limit that gave up their entry for
	// a compact record at a ceiling: nothing was lost (a sliding log keeps
	// its count at its newest hit's time).
	Compacted uint64
	// Folded counts keys over their limit that gave up their record (or
	// entry) for a place in their rule's filter, at a ceiling that nothing
	// else could make room under: their state is then the most a key over
	// its limit until the same time can have used (see Store).
	Folded uint64
	// Halved counts filters halved to give another rule's filter its share
	// of the room (see Store).
	Halved uint64
}

// What one key costs, as Bytes accounts it. TestAccountingCoversTheHeap
// measures the heap against these numbers.
const (
	// entryBytes is one entry: unsafe.Sizeof(entry{}) is 72 bytes, in Go's
	// 80-byte size class (TestEntrySize keeps it so).
	entryBytes = 80
	// logBytes is a sliding log's SlidingLogState (40 bytes, in the
	// 48-byte class); its ring is counted apart, by capacity.
	logBytes = 48
	// slotBytes is the share of one key in its shard's map and order
	// slice, charged for every key of the shard's peak since neither gives
	// memory back when keys go. A map slot is 25 bytes (16 for the string
	// header, 8 for the pointer, 1 control byte) and a map is as little as
	// 7/16 full just after it grew: 57 bytes a key. The order slice holds
	// 8 bytes a key, up to 16 just after append doubled it.
	slotBytes = 80
	// recordBytes is one compact record's share of its shard's map of
	// records, charged for every record of the map's peak: a slot of the
	// map is 41 bytes (the 8-byte hash, the 32-byte record, a control
	// byte), and a map just grown holds as few as 7/16 of its slots plus
	// its directory: 110 bytes a record measured at the worst sizes.
	recordBytes = 112
)

// allocBytes bounds what Go's allocator takes for an object of n bytes: a
// small object's size class is at most 19% above it (4097 bytes take
// 4864) past 64 bytes and at most 16 bytes above it below; a large object
// is rounded up to whole 8 KiB pages, at most n/4 from 32 KiB on.
func allocBytes(n int) int64 { return int64(n + n/4 + 16) }

// ringBytes is a sliding log's ring of capacity c.
func ringBytes(c int) int64 {
	if c == 0 {
		return 0
	}
	return allocBytes(8 * c)
}

const (
	// evictSamples is how many keys of a class eviction compares, as Redis's
	// maxmemory-samples.
	evictSamples = 5
	// reclaimEvery is how often (µs) a shard at a ceiling scans all its
	// keys for idle ones: often enough to reclaim before evicting, rarely
	// enough that a flood of new keys costs no full scan each.
	reclaimEvery = int64(time.Second / time.Microsecond)
)

// shard is one lock and the keys it guards; padded so that neighbouring
// shards' locks do not share a cache line.
type shard struct {
	// mu guards every field below and the entries of m.
	mu sync.Mutex
	m  map[string]*entry
	// order holds the entries of m for eviction to sample: order[:under]
	// are the keys under their limit, order[under:] those over it, and
	// each entry's pos is its index.
	order []*entry
	under int
	// peak is the largest len(m) since the map was last rebuilt: Go maps
	// never give back the memory of deleted keys, so the sweeper rebuilds a
	// map that has shrunk to a quarter of it, and Bytes charges slotBytes
	// for every key of it.
	peak int
	// lastReclaim is when (Unix µs) a full store last scanned this shard
	// for idle keys.
	lastReclaim int64
	// rec holds the keys over their limit that gave up their entry at a
	// ceiling, by the key's hash (nil until the first); recPeak is the
	// largest len(rec) since rec was made, charged recordBytes a record as
	// peak is for m; recIdle is at or before the earliest idle time of the
	// records, so that a shard about to refuse a new key knows whether a
	// reclaim would make room.
	rec     map[uint64]record
	recPeak int
	recIdle int64
	_       [64]byte
}

// state is what the algorithms keep for one key. Which fields are used
// depends on the algorithm: fixed_window n1 = count; sliding_window t =
// start, n1 = prev, n2 = curr; token_bucket t = TAT; sliding_log log.
type state struct {
	// idle is when (Unix µs) the state becomes that of a new key, so the
	// key can go (see the IdleAt methods of the limiter's states).
	idle   int64
	t      int64
	n1, n2 uint64
	log    *limiter.SlidingLogState
}

// record is a key over its limit kept without its key and entry (see
// Store): its state, with a sliding log's ring folded into t, the time of
// its newest hit, and n1, the number of hits logged; and its entry's rule
// and window.
type record struct {
	idle         int64
	t            int64
	n1, n2       uint64
	rule, window uint32
}

// record returns e's state as a record.
func (e *entry) record() record {
	r := record{idle: e.idle, t: e.t, n1: e.n1, n2: e.n2, rule: e.rule, window: e.window}
	if e.log != nil {
		// Every hit at the newest one's time: refused until the newest
		// leaves the window, as long as the log or longer, never shorter.
		r.t, _ = e.log.Newest()
		r.n1 = uint64(e.log.Len())
	}
	return r
}

// state returns the state r keeps, for a key of algorithm a.
func (r record) state(a rules.Algorithm) state {
	if a != rules.SlidingLog {
		return state{idle: r.idle, t: r.t, n1: r.n1, n2: r.n2}
	}
	log := limiter.SlidingLogStateOf(slices.Repeat([]int64{r.t}, int(r.n1))) // the ring it had, at most
	return state{idle: r.idle, log: &log}
}

// entry is one key: its state and what eviction needs to know of it.
type entry struct {
	state
	// key is the key of the entry in its shard's map, to delete it when
	// the entry is evicted.
	key string
	// used is when (Unix µs, the op's time) an op last used the key.
	used int64
	// pos is the entry's index in its shard's order.
	pos int32
	// rule and window are those of the op that made the entry
	// (Store.ruleID, windowSeconds): the filter and the group its key
	// goes to if it is folded.
	rule   uint32
	window uint32
	// pinned keeps the entry from being evicted while the op or batch that
	// uses it still holds the shard's lock.
	pinned bool
}

// bytes is what e costs, as Bytes accounts it, apart from its slot.
func (e *entry) bytes() int64 { return entryCost(len(e.key), &e.state) }

// entryCost is what an entry of a key of n bytes and state st costs.
func entryCost(n int, st *state) int64 {
	c := allocBytes(n) + entryBytes
	if st.log != nil {
		c += logBytes + ringBytes(st.log.Cap())
	}
	return c
}

// New returns a Store and starts its sweeper (unless cfg.SweepInterval is
// negative).
func New(cfg Config) *Store {
	s := &Store{
		seed:     maphash.MakeSeed(),
		maxKeys:  int64(max(cfg.MaxKeys, 0)),
		maxBytes: cfg.MaxBytes,
		now:      cfg.Now,
		filters:  make(map[uint32]*ruleFilter),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	switch {
	case s.maxBytes == 0:
		s.maxBytes = DefaultMaxBytes
	case s.maxBytes < 0:
		s.maxBytes = 0 // no byte ceiling
	}
	n := 1
	if cfg.Shards > 0 {
		for n < cfg.Shards {
			n <<= 1
		}
	} else {
		n = s.defaultShards()
	}
	s.shards, s.mask = make([]shard, n), uint64(n-1)
	if s.now == nil {
		s.now = time.Now
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
		s.shards[i].recIdle = math.MaxInt64
	}
	interval := cmp.Or(cfg.SweepInterval, 10*time.Second)
	if interval < 0 {
		close(s.done)
		return s
	}
	go s.sweeper(interval)
	return s
}

// defaultShards is 256, halved until each shard has room under the
// ceilings for shardKeys keys (of shardKeyBytes each for MaxBytes). A
// shard evicts only its own keys and one with none passes the ceiling by
// its new key, so a small ceiling spread over many shards would hardly
// bind: MaxKeys 100 over 256 shards could hold about 256 keys.
func (s *Store) defaultShards() int {
	const shardKeys, shardKeyBytes = 16, 256
	n := int64(256)
	for n > 1 && (s.maxKeys > 0 && n*shardKeys > s.maxKeys ||
		s.maxBytes > 0 && n*shardKeys*shardKeyBytes > s.maxBytes) {
		n >>= 1
	}
	return int(n)
}

// Close stops the sweeper and waits for it to return. The store stays
// usable but no longer reclaims idle keys by itself. Close is idempotent.
func (s *Store) Close() {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
}

func (s *Store) sweeper(interval time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.Sweep()
		}
	}
}

// Sweep removes every idle key (one whose state is that of a new key again
// at Config.Now) and returns how many it removed. The sweeper calls it every
// SweepInterval; it locks one shard at a time.
func (s *Store) Sweep() int {
	now := s.now().UnixMicro()
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		removed += s.reclaim(sh, now)
		sh.mu.Unlock()
	}
	s.sweepFilters(now)
	return removed
}

// reclaim deletes sh's idle keys and records, and rebuilds its maps when
// they have shrunk to a quarter of their peak. The caller holds sh.mu.
func (s *Store) reclaim(sh *shard, now int64) int {
	n := 0
	for _, e := range sh.m {
		if e.idle <= now && !e.pinned {
			s.drop(sh, e)
			n++
		}
	}
	sh.recIdle = math.MaxInt64
	for h, r := range sh.rec {
		if r.idle <= now {
			s.unrecord(sh, h)
			n++
		} else {
			sh.recIdle = min(sh.recIdle, r.idle)
		}
	}
	s.reclaimed.Add(uint64(n))
	if len(sh.m) <= sh.peak/4 && (sh.peak >= 64 || len(sh.m) == 0) {
		m := make(map[string]*entry, len(sh.m))
		maps.Copy(m, sh.m)
		s.bytes.Add(-int64(sh.peak-len(m)) * slotBytes)
		sh.m, sh.peak = m, len(m)
		sh.order = slices.Clone(sh.order)
	}
	if len(sh.rec) <= sh.recPeak/4 && (sh.recPeak >= 64 || len(sh.rec) == 0) {
		var rec map[uint64]record
		if len(sh.rec) > 0 {
			rec = make(map[uint64]record, len(sh.rec))
			maps.Copy(rec, sh.rec)
		}
		s.bytes.Add(-int64(sh.recPeak-len(rec)) * recordBytes)
		sh.rec, sh.recPeak = rec, len(rec)
	}
	return n
}

// Len returns the number of keys held, compact records and idle keys not
// yet swept included.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Records returns how many of the keys held are compact records of keys
// over their limit (see Store).
func (s *Store) Records() int { return int(s.records.Load()) }

// Bytes returns the memory the keys take, as the store accounts it against
// Config.MaxBytes: for each key its bytes, its entry, a sliding log's ring
// (by capacity), and its share of the shard's map, rounded up to what Go's
// allocator takes; and the rules' filters. It leaves out a fixed 0.1 MiB or
// so of empty shards.
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// Evictions returns what the store did at its ceilings since New.
func (s *Store) Evictions() Evictions {
	return Evictions{
		ReclaimedIdle: s.reclaimed.Load(),
		UnderLimit:    s.evictedUnder.Load(),
		Compacted:     s.compacted.Load(),
		Folded:        s.folded.Load(),
		Halved:        s.halved.Load(),
	}
}

// Do applies the batch's ops at b.Now (or Config.Now when b.Now is zero)
// with the limiter's pure functions. Without AllOrNothing each op locks its
// own shard, and the ops of one group (limiter.Op.Group) the shards of the
// group's keys together; with it, the shards of all the batch's keys are
// locked in index order, the ops applied, and all undone if any op was
// refused. It fails only when ctx is done before it starts: a new key
// always finds room (see Store).
func (s *Store) Do(ctx context.Context, b *limiter.Batch) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %w: %w", limiter.ErrUnavailable, err)
	}
	now := b.Now
	if now.IsZero() {
		now = s.now()
	}
	b.SizeResults()
	if b.AllOrNothing {
		s.doAll(now, b)
		return nil
	}
	t := now.UnixMicro()
	for i := 0; i < len(b.Ops); {
		if g := b.Ops[i].Group; g != 0 {
			// One descriptor's limits: one atomic step, so that
			// concurrent requests meet them in one order.
			end := i + 1
			for end < len(b.Ops) && b.Ops[end].Group == g {
				end++
			}
			var buf [8]uint64
			locked := s.lock(b.Ops[i:end], buf[:0])
			for j := i; j < end; j++ {
				s.applyLocked(s.shard(b.Ops[j].Key), &b.Ops[j], now, t, &b.Results[j])
			}
			s.unlock(locked)
			i = end
			continue
		}
		op := &b.Ops[i]
		sh := s.shard(op.Key)
		sh.mu.Lock()
		s.applyLocked(sh, op, now, t, &b.Results[i])
		sh.mu.Unlock()
		i++
	}
	return nil
}

// applyLocked applies one op of a batch that is not AllOrNothing; the
// caller holds sh.mu, sh being the op's shard.
func (s *Store) applyLocked(sh *shard, op *limiter.Op, now time.Time, t int64, res *limiter.Result) {
	f := s.lookup(sh, op, now, t)
	e := f.e
	if e == nil { // a read, or a refund, of a key without an entry: not stored
		*res = f.answer(now, op)
		return
	}
	var grown int64
	e.pinned = true
	*res, _, grown = apply(e, now, op)
	s.grow(sh, grown, t)
	e.pinned = false
	sh.used(e, t, res)
}

// lock locks the shards of ops in one global order (shard index), so that
// batches sharing shards cannot deadlock, and returns their indexes, in
// idx (a buffer of 8 covers most batches without an allocation), for
// unlock.
func (s *Store) lock(ops []limiter.Op, idx []uint64) []uint64 {
	for i := range ops {
		idx = append(idx, s.shardIndex(ops[i].Key))
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		s.shards[i].mu.Lock()
	}
	return idx
}

func (s *Store) unlock(idx []uint64) {
	for _, i := range idx {
		s.shards[i].mu.Unlock()
	}
}

// undo is what it takes to take back one op of an AllOrNothing batch.
type undo struct {
	sh      *shard
	e       *entry
	op      int   // the op's index in the batch
	old     state // the state before the op (for a sliding log: its idle time)
	created bool
	pushed  int // hits the op logged, for a sliding log
	// shadow marks a shadow op's undo, never taken back with the
	// batch's; undone says it was taken back alone, being refused.
	shadow, undone bool
}

// doAll applies an AllOrNothing batch under the locks of all its shards.
// A shadow op (limiter.Op.Shadow) is all-or-nothing by itself: taken back
// at once when it is refused, kept whatever the others are.
func (s *Store) doAll(now time.Time, b *limiter.Batch) {
	var buf [8]uint64
	defer s.unlock(s.lock(b.Ops, buf[:0]))

	t := now.UnixMicro()
	var undoBuf [8]undo
	undos := undoBuf[:0]
	for i := range b.Ops {
		op := &b.Ops[i]
		sh := s.shard(op.Key)
		f := s.lookup(sh, op, now, t)
		e := f.e
		if e == nil { // a read of a key without an entry: nothing to store or undo
			b.Results[i] = f.answer(now, op)
			continue
		}
		// Pinned until the batch is over: a later op making room for its
		// key must not evict a key this batch counts on (or will undo).
		e.pinned = true
		u := undo{sh: sh, e: e, op: i, old: e.state, created: f.created, shadow: op.Shadow}
		var grown int64
		b.Results[i], u.pushed, grown = apply(e, now, op)
		s.grow(sh, grown, t)
		if op.Shadow && !b.Results[i].Allowed {
			// Its own all-or-nothing: the newest op on its key, so
			// restoring its state takes back exactly its hits.
			s.takeBack(&u)
			s.readUnchanged(sh, op, now, t, &b.Results[i])
			u.undone = true
		}
		undos = append(undos, u)
	}
	refused := false
	for i := range b.Results[:len(b.Ops)] {
		refused = refused || !b.Results[i].Allowed && !b.Ops[i].Shadow
	}
	if refused {
		s.rollback(undos)
		// Allowed, Before and After stay those of the evaluation in
		// order; Remaining and ResetAfter become those of the unchanged
		// state.
		for i := range b.Ops {
			if op := &b.Ops[i]; !op.Shadow {
				s.readUnchanged(s.shard(op.Key), op, now, t, &b.Results[i])
			}
		}
	}
	for i := range undos {
		u := &undos[i]
		u.e.pinned = false
		// A key this batch created and took back is gone, for every op
		// of the batch on it: a read of it (Hits 0) after the op that
		// created it did not create it.
		if u.sh.m[u.e.key] == u.e {
			u.sh.used(u.e, t, &b.Results[u.op])
		}
	}
}

// readUnchanged sets res's Remaining and ResetAfter to those of op's key
// as it is now (a read with Hits 0), for an op of an AllOrNothing batch
// that recorded nothing. The caller holds sh.mu.
func (s *Store) readUnchanged(sh *shard, op *limiter.Op, now time.Time, t int64, res *limiter.Result) {
	read := *op
	read.Hits = 0
	f := s.lookup(sh, &read, now, t)
	var r limiter.Result
	if f.e == nil {
		r = f.answer(now, &read)
	} else {
		r, _, _ = apply(f.e, now, &read)
	}
	res.Remaining, res.ResetAfter = r.Remaining, r.ResetAfter
}

// rollback undoes the ops in reverse order, but for shadow ops', which are
// never taken back with the batch. The caller holds the locks, so
// no op came between: restoring the saved state is what taking the hits
// back gives then (see the take-back rules in src/limiter/takeback.go,
// which the stores that cannot lock follow), and Forget is
// SlidingLogState.TakeBack of the op's own entries, the newest.
func (s *Store) rollback(undos []undo) {
	for i := len(undos) - 1; i >= 0; i-- {
		if u := &undos[i]; !u.shadow {
			s.takeBack(u)
		}
	}
}

// takeBack undoes one op (see rollback).
func (s *Store) takeBack(u *undo) {
	switch {
	case u.created:
		s.drop(u.sh, u.e)
	case u.e.log != nil:
		u.e.log.Forget(u.pushed)
		u.e.idle = u.old.idle
	default:
		u.e.state = u.old
	}
}

// found is what lookup found of an op's key.
type found struct {
	// e is the key's entry. It is nil when the key has none and the op
	// makes none (a read, a refund, an op a filter's state refuses), st
	// being then the state to answer from (see answer).
	e  *entry
	st state
	// created says e was made for the op, from nothing or from a filter:
	// taking the op back drops it (a filter still holds the key).
	created bool
	// folded says st is a filter's (see foldedState).
	folded bool
}

// answer is the result of op on a key without an entry, in state f.st,
// which it leaves as it is. A key a filter holds gives nothing back to a
// refund: its state is the most it can have used, not what it used.
func (f *found) answer(now time.Time, op *limiter.Op) limiter.Result {
	if f.folded && op.Algorithm == rules.SlidingLog {
		return foldedLog(op, now, f.st.idle)
	}
	o := *op
	if f.folded && op.Refund {
		o.Hits, o.Refund = 0, false
	}
	tmp := entry{state: f.st}
	r, _, _ := apply(&tmp, now, &o)
	r.Allowed = r.Allowed || op.Refund
	return r
}

// lookup returns what sh holds of op's key. A key without an entry gets
// one when op records hits, from its record or its rule's filter if it is
// there, after making room for it at a ceiling (see Store). A key a filter
// holds gets an entry only when its state admits the op. A refund turns a
// record back into an entry, but never creates a key: a key never hit has
// nothing to give back. An entry or record idle at t (Unix µs, now's) is
// reset: its key may not have been swept yet. The caller holds sh.mu.
func (s *Store) lookup(sh *shard, op *limiter.Op, now time.Time, t int64) found {
	create := op.Hits > 0 && !op.Refund
	key := op.Key
	if e := sh.m[key]; e != nil {
		if e.idle <= t {
			// Reset what the pure functions would not: a fixed-window
			// count whose window is over. A sliding log drops its old
			// hits itself and keeps its ring.
			e.state = state{log: e.log}
		}
		return found{e: e}
	}
	var f found
	var h uint64
	if len(sh.rec) > 0 || s.nfilters.Load() > 0 {
		h = s.hash(key)
	}
	r, kept := record{}, false
	if len(sh.rec) > 0 {
		if r, kept = sh.rec[h]; kept && r.idle <= t {
			s.unrecord(sh, h)
			s.reclaimed.Add(1)
			kept = false
		}
	}
	switch {
	case kept:
		f.st = r.state(op.Algorithm)
	case s.nfilters.Load() > 0:
		if idle := s.foldedIdle(s.ruleID(op.Rule), h, t); idle > t {
			f.st, f.folded = foldedState(op, idle), true
		}
	}
	if !create && !(kept && op.Refund && op.Hits > 0) {
		return f
	}
	if f.folded && (op.Algorithm == rules.SlidingLog || !f.answer(now, op).Allowed) {
		return f // refused: nothing to store, the filter keeps the key
	}
	sh.expireSome(s, t)
	if kept {
		s.unrecord(sh, h)
	}
	s.makeRoom(sh, 1, entryCost(len(key), &f.st), t, !kept && !f.folded)
	// The key is copied: the batch's strings are the caller's (see
	// limiter.Store), and a key sharing a larger buffer would keep all of
	// it alive, unaccounted.
	e := &entry{state: f.st, key: strings.Clone(key), used: t, rule: s.ruleID(op.Rule), window: windowSeconds(op)}
	sh.m[e.key] = e
	cost := e.bytes()
	if len(sh.m) > sh.peak {
		sh.peak = len(sh.m)
		cost += slotBytes
	}
	sh.add(e)
	s.keys.Add(1)
	s.bytes.Add(cost)
	return found{e: e, created: !kept}
}

// expireSamples is how many keys of its shard a new key looks at, and
// removes when idle: Redis's active expiry, paid by the keys that make the
// garbage. Where every request brings a new key (a chain whose last level
// is a user, a flood of random values), the sweeper alone would hold
// SweepInterval's worth of idle keys, which the garbage collector marks
// at every cycle: 10 s of per-second keys are ten times the live ones.
// With k looks per new key, idle keys settle at about 1/k of the shard
// (each new key removes k × that fraction, and every key goes idle once),
// for k random reads of memory per new key.
const expireSamples = 3

// expireSome removes the idle keys among expireSamples of sh drawn at
// random. The caller holds sh.mu.
func (sh *shard) expireSome(s *Store, t int64) {
	removed := 0
	for range expireSamples {
		n := len(sh.order)
		if n == 0 {
			break
		}
		if e := sh.order[rand.IntN(n)]; e.idle <= t && !e.pinned {
			s.drop(sh, e)
			removed++
		}
	}
	if removed > 0 {
		s.reclaimed.Add(uint64(removed))
	}
}

// makeRoom evicts, compacts or folds keys until keys more keys (0 or 1,
// an entry of sh.m) and bytes more bytes fit under the ceilings. For a key
// the store holds already (newKey false: a record or a filter's key turned
// back into an entry, a sliding log's ring grown) it stops when sh has
// nothing it may evict or compact; for a new key it goes on as the Store
// doc says, and stops when sh has nothing left but keys of the batches in
// flight. The key then passes the ceiling (see Store). The caller holds
// sh.mu.
func (s *Store) makeRoom(sh *shard, keys, bytes, t int64, newKey bool) {
	for {
		b := bytes
		if keys > 0 && len(sh.m) >= sh.peak { // the new key raises the peak
			b += slotBytes
		}
		keysFull := s.maxKeys > 0 && s.keys.Load()+keys > s.maxKeys
		bytesFull := s.maxBytes > 0 && s.bytes.Load()+b > s.maxBytes
		switch {
		case !keysFull && !bytesFull:
			return
		case s.evict(sh, t, !keysFull): // compacting frees no key
		case !newKey:
			return
		case sh.recIdle <= t && s.reclaim(sh, t) > 0:
		case len(sh.rec) == 0 && !sh.holdsSpent():
			return
		case s.evictElsewhere(sh, t, !keysFull):
		case s.foldRecords(sh, t) || s.foldSpent(sh, t):
		default:
			// Not reached: sh held a record, which foldRecords folds
			// (sh is locked), or an entry over its limit that no batch
			// uses, which foldSpent folds.
			return
		}
	}
}

// elsewhereTries is how many other shards a new key that would be refused
// looks at for a key to evict or compact: a shard can be emptied of what
// it may give up while the others hold the bytes.
const elsewhereTries = 8

// evictElsewhere evicts or compacts, as evict, one key of a shard other
// than own, among elsewhereTries drawn at random, and reports whether it
// found one. It never waits for a lock: the caller holds own's (and maybe
// others', for its batch), so it skips a shard it cannot lock at once. It
// looks at none when every entry of the store is own's.
func (s *Store) evictElsewhere(own *shard, t int64, compact bool) bool {
	if s.keys.Load()-s.records.Load() <= int64(len(own.m)) || len(s.shards) == 1 {
		return false
	}
	for range elsewhereTries {
		sh := &s.shards[rand.IntN(len(s.shards))]
		if sh == own || !sh.mu.TryLock() {
			continue
		}
		ok := s.evict(sh, t, compact)
		sh.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// foldShare bounds the work of one fold: it folds whole shards' records
// until it has freed a 256th of the ceilings (about 2,300 records of the
// default 64 MiB), so that the new key that folds waits a millisecond or
// so, and the next new keys find room for a while.
const foldShare = 256

// foldRecords moves the records of some shards into their rules' filters,
// and reports whether there was one: own's (whose lock the caller holds),
// then those of the next shards it can lock at once, until it has freed
// what foldShare says. Whole shards: a record takes 112 bytes and its place
// in a filter about 8, but a shard's map of records gives its memory back
// only when it is rebuilt. The shards stay locked until their records are
// in the filters, so that no op finds a key in neither.
func (s *Store) foldRecords(own *shard, t int64) bool {
	if s.records.Load() == 0 {
		return false
	}
	var locked []*shard
	var freed, n int64
	visited := 0
	enough := func() bool {
		return n > 0 && (s.maxBytes <= 0 || freed >= s.maxBytes/foldShare) && (s.maxKeys <= 0 || n >= s.maxKeys/foldShare)
	}
	next := int(s.foldNext.Add(1))
	for k := -1; k < len(s.shards) && !enough(); k++ {
		sh := own
		if k >= 0 {
			if sh = &s.shards[(next+k)%len(s.shards)]; sh == own || !sh.mu.TryLock() {
				continue
			}
		} else if sh == nil {
			continue
		}
		visited++
		if len(sh.rec) == 0 {
			if sh != own {
				sh.mu.Unlock()
			}
			continue
		}
		locked = append(locked, sh)
		n += int64(len(sh.rec))
		freed += int64(sh.recPeak) * recordBytes
	}
	s.keys.Add(-n)
	s.records.Add(-n)
	s.bytes.Add(-freed) // first, so that the filters find the room
	// How many keys each group has in the store, as these shards say, to
	// size its new filters.
	hints := make(map[groupKey]int64)
	for _, sh := range locked {
		for _, r := range sh.rec {
			hints[groupKey{r.rule, groupIdle(r.idle, r.window)}] += int64(len(s.shards))
		}
	}
	var idle int64 // records whose state is that of a new key: reclaimed
	s.fmu.Lock()
	for _, sh := range locked {
		for h, r := range sh.rec {
			if r.idle <= t {
				idle++
				continue
			}
			s.fold(r.rule, h, r.idle, r.window, t, hints[groupKey{r.rule, groupIdle(r.idle, r.window)}]/int64(visited))
		}
		sh.rec, sh.recPeak, sh.recIdle = nil, 0, math.MaxInt64
	}
	s.fmu.Unlock()
	for _, sh := range locked {
		if sh != own {
			sh.mu.Unlock()
		}
	}
	s.reclaimed.Add(uint64(idle))
	s.folded.Add(uint64(n - idle))
	return n > 0
}

// foldSpent moves one entry of sh over its limit into its rule's filter,
// the least recently used of evictSamples, and reports whether there was
// one: what is left when compacting frees no key (at MaxKeys) or no byte.
// The caller holds sh.mu.
func (s *Store) foldSpent(sh *shard, t int64) bool {
	e := sh.sample(sh.under, len(sh.order), t)
	if e == nil {
		return false
	}
	if e.idle > t { // else its state is that of a new key: nothing to keep
		s.fmu.Lock()
		s.fold(e.rule, s.hash(e.key), e.idle, e.window, t, 1)
		s.fmu.Unlock()
		s.folded.Add(1)
	} else {
		s.reclaimed.Add(1)
	}
	s.drop(sh, e)
	return true
}

// holdsSpent reports whether sh has an entry over its limit that no batch
// in flight uses.
func (sh *shard) holdsSpent() bool {
	// Past the batch's few pinned keys.
	return slices.ContainsFunc(sh.order[sh.under:], func(e *entry) bool { return !e.pinned })
}

// grow accounts the bytes a sliding log's ring grew by and makes room for
// them at the ceiling. The caller holds sh.mu and has pinned the entry.
func (s *Store) grow(sh *shard, grown, t int64) {
	if grown == 0 {
		return
	}
	s.bytes.Add(grown)
	s.makeRoom(sh, 0, 0, t, false)
}

// evict removes one key of sh chosen as the Store doc says, or when none is
// idle or under its limit and compact is set, turns one over its limit
// into a record; it reports whether there was one. The caller holds sh.mu.
func (s *Store) evict(sh *shard, t int64, compact bool) bool {
	if t-sh.lastReclaim >= reclaimEvery || t < sh.lastReclaim {
		sh.lastReclaim = t
		if s.reclaim(sh, t) > 0 {
			return true
		}
	}
	e := sh.sample(0, sh.under, t)
	spent := e == nil
	if spent {
		e = sh.sample(sh.under, len(sh.order), t)
	}
	switch {
	case e == nil:
		return false
	case e.idle <= t:
		s.drop(sh, e)
		s.reclaimed.Add(1)
	case !spent:
		s.drop(sh, e)
		s.evictedUnder.Add(1)
	case !compact || e.bytes() <= recordBytes && len(sh.rec) >= sh.recPeak:
		return false // compacting frees no key, or no byte
	default:
		s.compact(sh, e)
		s.compacted.Add(1)
	}
	return true
}

// sample returns the entry of sh.order[lo:hi] to evict first among
// evictSamples unpinned ones drawn at random (all of them when there are
// few): an idle one if it meets one, else the least recently used. It
// returns nil when every entry there is pinned.
func (sh *shard) sample(lo, hi int, t int64) *entry {
	var best *entry
	consider := func(e *entry) bool { // reports whether e is idle: take it
		if e.pinned {
			return false
		}
		if e.idle <= t {
			best = e
			return true
		}
		if best == nil || e.used < best.used {
			best = e
		}
		return false
	}
	if n := hi - lo; n <= evictSamples {
		for _, e := range sh.order[lo:hi] {
			if consider(e) {
				break
			}
		}
	} else {
		for range evictSamples {
			if consider(sh.order[lo+rand.IntN(n)]) {
				break
			}
		}
	}
	if best == nil { // every draw was pinned; there are few pinned keys
		for _, e := range sh.order[lo:hi] {
			if !e.pinned {
				return e
			}
		}
	}
	return best
}

// compact turns e, a key over its limit, into a record of sh. The caller
// holds sh.mu.
func (s *Store) compact(sh *shard, e *entry) {
	h := s.hash(e.key)
	r := e.record()
	s.drop(sh, e)
	if old, ok := sh.rec[h]; ok {
		// Two keys of one hash: 64 bits (less the shard's), from a seed
		// of this process, so about one pair in 10^16. Keep the later end.
		if old.idle > r.idle {
			r = old
		}
	} else {
		s.keys.Add(1)
		s.records.Add(1)
	}
	if sh.rec == nil {
		sh.rec = make(map[uint64]record)
	}
	sh.rec[h] = r
	if len(sh.rec) > sh.recPeak {
		sh.recPeak = len(sh.rec)
		s.bytes.Add(recordBytes)
	}
	sh.recIdle = min(sh.recIdle, r.idle)
}

// unrecord deletes the record of hash h from sh and the totals; its slot
// stays charged until the map is rebuilt (see reclaim). The caller holds
// sh.mu.
func (s *Store) unrecord(sh *shard, h uint64) {
	delete(sh.rec, h)
	s.keys.Add(-1)
	s.records.Add(-1)
}

// drop deletes e from sh and the totals. The caller holds sh.mu.
func (s *Store) drop(sh *shard, e *entry) {
	delete(sh.m, e.key)
	sh.remove(e)
	s.keys.Add(-1)
	s.bytes.Add(-e.bytes())
}

// used records that an op with result r used e at t: when, for the least
// recently used order, and whether e is now over its limit (no further hit
// fits). The caller holds sh.mu.
func (sh *shard) used(e *entry, t int64, r *limiter.Result) {
	e.used = t
	sh.classify(e, !r.Allowed || r.Remaining == 0)
}

// add puts a new entry in sh.order, among the keys under their limit.
func (sh *shard) add(e *entry) {
	e.pos = int32(len(sh.order))
	sh.order = append(sh.order, e)
	sh.swap(int(e.pos), sh.under)
	sh.under++
}

// classify moves e among the keys over their limit or back. Each class is
// a contiguous part of sh.order, so a move is one swap across the border.
func (sh *shard) classify(e *entry, over bool) {
	switch isOver := int(e.pos) >= sh.under; {
	case over && !isOver:
		sh.under--
		sh.swap(int(e.pos), sh.under)
	case !over && isOver:
		sh.swap(int(e.pos), sh.under)
		sh.under++
	}
}

// remove takes e out of sh.order.
func (sh *shard) remove(e *entry) {
	sh.classify(e, true) // the over part is unordered: swap e to its end
	last := len(sh.order) - 1
	sh.swap(int(e.pos), last)
	sh.order[last] = nil
	sh.order = sh.order[:last]
}

func (sh *shard) swap(i, j int) {
	o := sh.order
	o[i], o[j] = o[j], o[i]
	o[i].pos, o[j].pos = int32(i), int32(j)
}

// apply runs op's pure function on e and returns its result, how many hits
// a sliding log logged, and how many bytes its ring grew by.
func apply(e *entry, now time.Time, op *limiter.Op) (r limiter.Result, pushed int, grown int64) {
	switch op.Algorithm {
	case rules.SlidingWindow:
		var st limiter.SlidingWindowState
		st, r = limiter.SlidingWindow(limiter.SlidingWindowState{Start: e.t, Prev: e.n1, Curr: e.n2}, now, *op)
		e.t, e.n1, e.n2 = st.Start, st.Prev, st.Curr
		e.idle = st.IdleAt(op.Window)
	case rules.SlidingLog:
		if e.log == nil {
			e.log = new(limiter.SlidingLogState)
			grown = logBytes
		}
		c := e.log.Cap()
		*e.log, r = limiter.SlidingLog(*e.log, now, *op)
		if r.Allowed && !op.Refund {
			pushed = int(op.Hits)
		}
		grown += ringBytes(e.log.Cap()) - ringBytes(c)
		e.idle = e.log.IdleAt(op.Window)
	case rules.TokenBucket:
		var st limiter.TokenBucketState
		st, r = limiter.TokenBucket(limiter.TokenBucketState{TAT: e.t}, now, *op)
		e.t = st.TAT
		e.idle = st.IdleAt()
	default:
		var st limiter.FixedWindowState
		st, r = limiter.FixedWindow(limiter.FixedWindowState{Count: e.n1}, now, *op)
		e.n1 = st.Count
		e.idle = limiter.FixedWindowEnd(now, op.Window).UnixMicro()
	}
	return r, pushed, grown
}

func (s *Store) shard(key string) *shard { return &s.shards[s.shardIndex(key)] }

func (s *Store) shardIndex(key string) uint64 { return s.hash(key) & s.mask }

// hash is the hash of key that picks its shard and names its record.
func (s *Store) hash(key string) uint64 { return maphash.String(s.seed, key) }
