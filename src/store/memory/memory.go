// Package memory is the embedded store: every key's state in this process,
// in sharded maps, with idle keys reclaimed by a sweeper. It is the default
// backend (one instance, nothing to install) and runs every algorithm by
// calling the limiter's pure functions under a shard lock. It knows nothing
// of rules files, gRPC or the other stores.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
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
	// ceiling. At the ceiling a new key makes room by evicting others (see
	// Store); it is never refused.
	MaxBytes int64
	// MaxKeys is the most keys the store holds; 0 (the default) means no
	// key-count ceiling. At it a new key makes room as at MaxBytes. Both
	// ceilings may apply.
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
// The store stays under Config.MaxBytes and Config.MaxKeys without ever
// refusing an op: a new key that would pass a ceiling first evicts keys of
// its own shard, under the lock the op already holds, in this order:
//
//  1. idle keys, whose state is that of a new key again (the whole shard
//     is reclaimed at most once a second, and any idle key sampled below
//     goes first): nothing is lost;
//  2. keys under their limit, approximately least recently used first (the
//     oldest of 5 sampled, as Redis samples for maxmemory-policy);
//  3. only when the shard holds no key under its limit: keys over it (no
//     further hit fits: the last op was refused or left Remaining 0), the
//     one of 5 sampled whose state resets soonest, the least recently used
//     on a tie.
//
// Over-limit keys are what enforce the limits: evicting one resets a spent
// counter, while evicting a key under its limit only forgets hits that
// limited no one yet. So a client flooding the store with new keys cannot
// reset the spent counters of others; it only makes the store forget,
// least recently used first, the keys of clients still within their
// limits. The classes are per shard: a shard with no key under its limit
// gives up the over-limit key nearest its reset. A client that puts its
// own keys over their limit at once (a hits_addend above the limit) fills
// that class too, and can then push out the spent keys of others, those
// nearest their reset and least recently used first; Evictions.OverLimit
// counts them, and a MaxBytes that holds all the keys over their limit at
// once prevents it.
//
// The ops of one batch never evict each other's keys. When a shard has
// nothing it may evict (it is empty, or holds only keys of the batch at
// hand) the new key is added anyway, and two ops on different shards that
// check a ceiling at the same moment may both add theirs: Bytes and Len
// then pass the ceiling by those keys, at most one per shard plus the keys
// of the batches in flight, until the next new key of a shard that has
// keys to evict brings them back under it.
type Store struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	maxKeys  int64
	maxBytes int64
	now      func() time.Time
	// keys and bytes are the totals of all shards, for the ceilings, Len
	// and Bytes.
	keys  atomic.Int64
	bytes atomic.Int64
	// The counts Evictions reports.
	reclaimed, evictedUnder, evictedOver atomic.Uint64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Evictions counts the keys a Store has dropped since New, by class.
type Evictions struct {
	// ReclaimedIdle counts keys removed because their state was that of a
	// new key again (the sweeper's and those reclaimed at a ceiling):
	// nothing was lost.
	ReclaimedIdle uint64
	// UnderLimit counts keys evicted at a ceiling while under their limit:
	// their hits are forgotten, which admits at most one limit more for
	// those clients.
	UnderLimit uint64
	// OverLimit counts keys evicted at a ceiling while over their limit,
	// because their shard held no key under it: those clients may start
	// afresh before their reset. It stays 0 unless the store is too small
	// for the keys over their limit; raise MaxBytes when it grows.
	OverLimit uint64
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
)

// allocBytes bounds what Go's allocator takes for an object of n bytes: a
// small object's size class is at most 19% above it (4097 bytes take
// 4864) past 64 bytes and at most 16 bytes above it below; a large object
// is rounded up to whole 8 KiB pages, at most n/4 from 32 KiB on.
func allocBytes(n int) int64 {
	return int64(n + n/4 + 16)
}

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
	_           [64]byte
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

// entry is one key: its state and what eviction needs to know of it.
type entry struct {
	state
	// key is the key of the entry in its shard's map, to delete it when
	// the entry is evicted.
	key string
	// used is when (Unix µs, the op's time) an op last used the key.
	used int64
	// pos is the entry's index in its shard's order.
	pos int
	// pinned keeps the entry from being evicted while the op or batch that
	// uses it still holds the shard's lock.
	pinned bool
}

// bytes is what e costs, as Bytes accounts it, apart from its slot.
func (e *entry) bytes() int64 {
	n := allocBytes(len(e.key)) + entryBytes
	if e.log != nil {
		n += logBytes + ringBytes(e.log.Cap())
	}
	return n
}

// New returns a Store and starts its sweeper (unless cfg.SweepInterval is
// negative).
func New(cfg Config) *Store {
	s := &Store{
		seed:     maphash.MakeSeed(),
		maxKeys:  int64(max(cfg.MaxKeys, 0)),
		maxBytes: cfg.MaxBytes,
		now:      cfg.Now,
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
	}
	interval := cfg.SweepInterval
	if interval == 0 {
		interval = 10 * time.Second
	}
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
	return removed
}

// reclaim deletes sh's idle keys and rebuilds its map when it has shrunk to
// a quarter of its peak. The caller holds sh.mu.
func (s *Store) reclaim(sh *shard, now int64) int {
	n := 0
	for _, e := range sh.m {
		if e.idle <= now && !e.pinned {
			s.drop(sh, e)
			n++
		}
	}
	s.reclaimed.Add(uint64(n))
	if sh.peak >= 64 && len(sh.m) <= sh.peak/4 {
		m := make(map[string]*entry, len(sh.m))
		for k, e := range sh.m {
			m[k] = e
		}
		s.bytes.Add(-int64(sh.peak-len(m)) * slotBytes)
		sh.m, sh.peak = m, len(m)
		sh.order = slices.Clone(sh.order)
	}
	return n
}

// Len returns the number of keys held, idle ones not yet swept included.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Bytes returns the memory the keys take, as the store accounts it against
// Config.MaxBytes: for each key its bytes, its entry, a sliding log's ring
// (by capacity), and its share of the shard's map, rounded up to what Go's
// allocator takes. It leaves out a fixed 0.1 MiB or so of empty shards.
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// Evictions returns how many keys the store has dropped, by class.
func (s *Store) Evictions() Evictions {
	return Evictions{
		ReclaimedIdle: s.reclaimed.Load(),
		UnderLimit:    s.evictedUnder.Load(),
		OverLimit:     s.evictedOver.Load(),
	}
}

// Do applies the batch's ops at b.Now (or Config.Now when b.Now is zero)
// with the limiter's pure functions. Without AllOrNothing each op locks its
// own shard, and the ops of one group (limiter.Op.Group) the shards of the
// group's keys together; with it, the shards of all the batch's keys are
// locked in index order, the ops applied, and all undone if any op was
// refused. It
// fails only when ctx is done before it starts: at a ceiling it evicts.
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
	e, _ := s.lookup(sh, op.Key, t, op.Hits > 0)
	if e == nil { // a read of a missing key: the zero state, not stored
		var zero entry
		*res, _, _ = apply(&zero, now, op)
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
}

// doAll applies an AllOrNothing batch under the locks of all its shards.
func (s *Store) doAll(now time.Time, b *limiter.Batch) {
	var buf [8]uint64
	defer s.unlock(s.lock(b.Ops, buf[:0]))

	t := now.UnixMicro()
	var undoBuf [8]undo
	undos := undoBuf[:0]
	for i := range b.Ops {
		op := &b.Ops[i]
		sh := s.shard(op.Key)
		e, created := s.lookup(sh, op.Key, t, op.Hits > 0)
		if e == nil { // a read of a missing key: nothing to store or undo
			var zero entry
			b.Results[i], _, _ = apply(&zero, now, op)
			continue
		}
		// Pinned until the batch is over: a later op making room for its
		// key must not evict a key this batch counts on (or will undo).
		e.pinned = true
		u := undo{sh: sh, e: e, op: i, old: e.state, created: created}
		var grown int64
		b.Results[i], u.pushed, grown = apply(e, now, op)
		s.grow(sh, grown, t)
		undos = append(undos, u)
	}
	refused := false
	for i := range b.Results[:len(b.Ops)] {
		refused = refused || !b.Results[i].Allowed
	}
	if refused {
		s.rollback(undos)
		// Allowed, Before and After stay those of the evaluation in
		// order; Remaining and ResetAfter become those of the unchanged
		// state.
		for i := range b.Ops {
			op := b.Ops[i]
			op.Hits = 0
			e := s.shard(op.Key).m[op.Key]
			if e == nil {
				e = &entry{}
			}
			read, _, _ := apply(e, now, &op)
			b.Results[i].Remaining, b.Results[i].ResetAfter = read.Remaining, read.ResetAfter
		}
	}
	for i := range undos {
		u := &undos[i]
		u.e.pinned = false
		if !(refused && u.created) { // a key undone is gone
			u.sh.used(u.e, t, &b.Results[u.op])
		}
	}
}

// rollback undoes the ops in reverse order. The caller holds the locks, so
// no op came between: restoring the saved state is what taking the hits
// back gives then (see the take-back rules in src/limiter/takeback.go,
// which the stores that cannot lock follow), and Forget is
// SlidingLogState.TakeBack of the op's own entries, the newest.
func (s *Store) rollback(undos []undo) {
	for i := len(undos) - 1; i >= 0; i-- {
		u := &undos[i]
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
}

// lookup returns key's entry in sh, creating it when create is set (after
// making room for it at a ceiling); else a missing key gives nil. An entry
// idle at t (Unix µs) is reset: its key may not have been swept yet. The
// caller holds sh.mu.
func (s *Store) lookup(sh *shard, key string, t int64, create bool) (e *entry, created bool) {
	if e = sh.m[key]; e != nil {
		if e.idle <= t {
			// Reset what the pure functions would not: a fixed-window
			// count whose window is over. A sliding log drops its old
			// hits itself and keeps its ring.
			e.state = state{log: e.log}
		}
		return e, false
	}
	if !create {
		return nil, false
	}
	sh.expireSome(s, t)
	cost := allocBytes(len(key)) + entryBytes
	s.makeRoom(sh, cost, t)
	// The key is copied: the batch's strings are the caller's (see
	// limiter.Store), and a key sharing a larger buffer would keep all of
	// it alive, unaccounted.
	e = &entry{key: strings.Clone(key), used: t}
	sh.m[e.key] = e
	if len(sh.m) > sh.peak {
		sh.peak = len(sh.m)
		cost += slotBytes
	}
	sh.add(e)
	s.keys.Add(1)
	s.bytes.Add(cost)
	return e, true
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

// makeRoom evicts keys of sh until one more key of cost bytes (0: none,
// after a sliding log grew) fits under the ceilings, or sh has nothing left
// it may evict. The caller holds sh.mu.
func (s *Store) makeRoom(sh *shard, cost, t int64) {
	for {
		keys, bytes := int64(0), cost
		if cost > 0 {
			keys = 1
			if len(sh.m) >= sh.peak { // the new key raises the peak
				bytes += slotBytes
			}
		}
		full := s.maxKeys > 0 && s.keys.Load()+keys > s.maxKeys ||
			s.maxBytes > 0 && s.bytes.Load()+bytes > s.maxBytes
		if !full || !s.evict(sh, t) {
			return
		}
	}
}

// grow accounts the bytes a sliding log's ring grew by and makes room for
// them at the ceiling. The caller holds sh.mu and has pinned the entry.
func (s *Store) grow(sh *shard, grown, t int64) {
	if grown == 0 {
		return
	}
	s.bytes.Add(grown)
	s.makeRoom(sh, 0, t)
}

// evict removes one key of sh, chosen as the Store doc says, and reports
// whether there was one it may remove. The caller holds sh.mu.
func (s *Store) evict(sh *shard, t int64) bool {
	if t-sh.lastReclaim >= reclaimEvery || t < sh.lastReclaim {
		sh.lastReclaim = t
		if s.reclaim(sh, t) > 0 {
			return true
		}
	}
	count := &s.evictedUnder
	e := sh.sample(0, sh.under, t, usedFirst)
	if e == nil {
		count = &s.evictedOver
		e = sh.sample(sh.under, len(sh.order), t, resetsFirst)
	}
	if e == nil {
		return false
	}
	if e.idle <= t {
		count = &s.reclaimed
	}
	s.drop(sh, e)
	count.Add(1)
	return true
}

// sample returns the entry of sh.order[lo:hi] to evict first among
// evictSamples unpinned ones drawn at random (all of them when there are
// few): an idle one if it meets one, else the first by less. It returns nil
// when every entry there is pinned.
func (sh *shard) sample(lo, hi int, t int64, less func(a, b *entry) bool) *entry {
	var best *entry
	consider := func(e *entry) bool { // reports whether e is idle: take it
		if e.pinned {
			return false
		}
		if e.idle <= t {
			best = e
			return true
		}
		if best == nil || less(e, best) {
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

// usedFirst orders keys under their limit: least recently used first.
func usedFirst(a, b *entry) bool { return a.used < b.used }

// resetsFirst orders keys over their limit: the one whose state resets
// soonest first (it would have let its client in again the soonest), then
// the least recently used.
func resetsFirst(a, b *entry) bool {
	return a.idle < b.idle || a.idle == b.idle && a.used < b.used
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
	e.pos = len(sh.order)
	sh.order = append(sh.order, e)
	sh.swap(e.pos, sh.under)
	sh.under++
}

// classify moves e among the keys over their limit or back. Each class is
// a contiguous part of sh.order, so a move is one swap across the border.
func (sh *shard) classify(e *entry, over bool) {
	switch isOver := e.pos >= sh.under; {
	case over && !isOver:
		sh.under--
		sh.swap(e.pos, sh.under)
	case !over && isOver:
		sh.swap(e.pos, sh.under)
		sh.under++
	}
}

// remove takes e out of sh.order.
func (sh *shard) remove(e *entry) {
	sh.classify(e, true) // the over part is unordered: swap e to its end
	last := len(sh.order) - 1
	sh.swap(e.pos, last)
	sh.order[last] = nil
	sh.order = sh.order[:last]
}

func (sh *shard) swap(i, j int) {
	o := sh.order
	o[i], o[j] = o[j], o[i]
	o[i].pos, o[j].pos = i, j
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
		if r.Allowed {
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

func (s *Store) shard(key string) *shard {
	return &s.shards[s.shardIndex(key)]
}

func (s *Store) shardIndex(key string) uint64 {
	return maphash.String(s.seed, key) & s.mask
}
