package limiter

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// nearCacheEntryOverhead approximates the bytes one entry costs beyond its
// key: the entry itself, its slot in the eviction queue and the map's share
// (bucket slot, string header, tophash). It keeps the byte budget honest
// for short keys.
const nearCacheEntryOverhead = 96

// nearCacheShardBytes is the budget above which the cache is split into
// shards (each with its own lock), up to maxNearCacheShards.
const (
	nearCacheShardBytes = 64 << 10
	maxNearCacheShards  = 64
)

// NearCache remembers keys known to be over their limit until a given time,
// so that the limiter can answer them without a store round trip
// (LOCAL_CACHE_SIZE_IN_BYTES). An entry holds the limit it was over: the
// same key asked with another limit (a per-request override) misses, which
// fixes envoyproxy/ratelimit's bug #1077, where a stale entry answered a
// request whose override had raised the limit.
//
// The cache is bounded by bytes (key length plus a fixed overhead per entry)
// and evicts the oldest entries first; since entries of one rule expire in
// the order they were added, that drops expired entries first. Expired
// entries are never returned. It keeps the counters envoyproxy/ratelimit
// exports of its own local cache (see Stats). It is safe for concurrent use;
// a nil *NearCache is a valid cache that remembers nothing.
type NearCache struct {
	seed   maphash.Seed
	shards []nearCacheShard
}

type nearCacheShard struct {
	// mu guards the fields up to max; a lookup, under the read lock,
	// changes only atomics (the counters below, an entry's access).
	mu    sync.RWMutex
	m     map[string]*nearCacheEntry
	queue []*nearCacheEntry // insertion order, oldest at head
	head  int
	bytes int
	max   int

	// epoch counts the Forget calls of the shard's keys (under mu); a
	// Remember of a caller that looked its key up before one of them is
	// dropped (see rememberSince).
	epoch uint64

	// The counters of Stats. accessSum is the sum of the entries'
	// access, so that their mean costs no walk over them.
	hits, misses, expired, evacuated, overwrites atomic.Uint64
	accessSum                                    atomic.Int64
}

type nearCacheEntry struct {
	key   string
	limit uint64
	until int64 // Unix nanoseconds
	// access is the Unix second of the entry's last Remember or hit;
	// expiredSeen is set once the entry was counted as expired (see
	// Stats), so that it counts once however often it is looked up.
	access      atomic.Int64
	expiredSeen atomic.Bool
}

// NewNearCache returns a cache that holds about maxBytes; it returns nil
// (remembering nothing) when maxBytes is not positive.
func NewNearCache(maxBytes int) *NearCache {
	if maxBytes <= 0 {
		return nil
	}
	n := min(max(maxBytes/nearCacheShardBytes, 1), maxNearCacheShards)
	c := &NearCache{seed: maphash.MakeSeed(), shards: make([]nearCacheShard, n)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*nearCacheEntry)
		c.shards[i].max = maxBytes / n
	}
	return c
}

func (c *NearCache) shard(key string) *nearCacheShard {
	if len(c.shards) == 1 {
		return &c.shards[0]
	}
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// Over reports whether key was remembered as over limit until a time after
// now, and returns that time. Each call is a lookup of Stats: a hit when it
// reports true, a miss otherwise.
func (c *NearCache) Over(key string, limit uint64, now time.Time) (until time.Time, over bool) {
	until, over, _ = c.lookup(key, limit, now)
	return until, over
}

// lookup is Over, and the epoch of key's shard at the lookup, for
// rememberSince.
func (c *NearCache) lookup(key string, limit uint64, now time.Time) (until time.Time, over bool, epoch uint64) {
	if c == nil {
		return time.Time{}, false, 0
	}
	s := c.shard(key)
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.m[key]
	if e == nil || e.limit != limit {
		s.misses.Add(1)
		return time.Time{}, false, s.epoch
	}
	if now.UnixNano() >= e.until {
		s.misses.Add(1)
		if e.expiredSeen.CompareAndSwap(false, true) {
			s.expired.Add(1)
		}
		return time.Time{}, false, s.epoch
	}
	s.hits.Add(1)
	s.touch(e, now.Unix())
	return time.Unix(0, e.until), true, s.epoch
}

// Forget drops what c knows of key: a refund gave some of its hits back
// (is_negative_hits), so it may not be over its limit any more. A
// Remember of key by a caller that looked it up before Forget, and so may
// hold an answer of the store from before the refund, is dropped (see
// rememberSince). The entry stays in the eviction queue, past its time,
// and counts neither as expired nor as evacuated.
func (c *NearCache) Forget(key string) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	if e := s.m[key]; e != nil {
		e.until = math.MinInt64
		e.expiredSeen.Store(true)
	}
}

// touch sets e's access to sec. Most hits fall in the second of the last
// one, and then write nothing: a hot key's lookups share no written word.
func (s *nearCacheShard) touch(e *nearCacheEntry, sec int64) {
	if old := e.access.Load(); old != sec && e.access.CompareAndSwap(old, sec) {
		s.accessSum.Add(sec - old)
	}
}

// Remember records, at now, that key is over limit until the given time,
// replacing what was known of key. The key is copied.
func (c *NearCache) Remember(key string, limit uint64, now, until time.Time) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remember(key, limit, now, until)
}

// rememberSince is Remember for a caller that looked key up (lookup) at
// epoch, before it asked the store: it records nothing when a Forget of a
// key of the shard came since, whose refund the store's answer may
// predate. (A Forget of another key of the shard drops it too: rare, and
// it only costs a store round trip.)
func (c *NearCache) rememberSince(epoch uint64, key string, limit uint64, now, until time.Time) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch != epoch {
		return
	}
	s.remember(key, limit, now, until)
}

// remember is Remember; the caller holds s.mu.
func (s *nearCacheShard) remember(key string, limit uint64, now, until time.Time) {
	size := len(key) + nearCacheEntryOverhead
	if e := s.m[key]; e != nil {
		e.limit, e.until = limit, until.UnixNano()
		e.expiredSeen.Store(false)
		s.touch(e, now.Unix())
		s.overwrites.Add(1)
		return
	}
	if size > s.max {
		return
	}
	for s.bytes+size > s.max {
		s.evictOldest(now)
	}
	e := &nearCacheEntry{key: strings.Clone(key), limit: limit, until: until.UnixNano()}
	e.access.Store(now.Unix())
	s.accessSum.Add(now.Unix())
	s.m[e.key] = e
	s.queue = append(s.queue, e)
	s.bytes += size
}

// evictOldest drops the entry at the head of the queue, counting it as
// expired or, when it was still in force at now, as evacuated.
func (s *nearCacheShard) evictOldest(now time.Time) {
	e := s.queue[s.head]
	s.queue[s.head] = nil
	s.head++
	delete(s.m, e.key)
	s.accessSum.Add(-e.access.Load())
	switch {
	case now.UnixNano() < e.until:
		s.evacuated.Add(1)
	case e.expiredSeen.CompareAndSwap(false, true):
		s.expired.Add(1)
	}
	s.bytes -= len(e.key) + nearCacheEntryOverhead
	// Compact when the dead head is half the slice, so the queue's memory
	// stays proportional to the live entries.
	if s.head > len(s.queue)/2 {
		n := copy(s.queue, s.queue[s.head:])
		clear(s.queue[n:])
		s.queue = s.queue[:n]
		s.head = 0
	}
}

// Len returns the number of entries held, expired ones included.
func (c *NearCache) Len() int {
	if c == nil {
		return 0
	}
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

// NearCacheStats are the counters of a NearCache since it was made: those
// of freecache, the cache envoyproxy/ratelimit keeps with
// LOCAL_CACHE_SIZE_IN_BYTES, which it exports under ratelimit.localcache
// (hitCount, missCount, lookupCount, entryCount, evacuateCount,
// expiredCount, overwriteCount, averageAccessTime), with the same meanings.
type NearCacheStats struct {
	// Hits counts the lookups (Over) that found the key over its limit;
	// Misses the others: no entry, one for another limit, or one whose
	// time has passed. Their sum is the lookups.
	Hits, Misses uint64
	// Entries is the number of entries held, expired ones not yet dropped
	// included (Len).
	Entries int64
	// Evacuated counts the entries dropped, still in force, to make room
	// for new ones: a sign that LOCAL_CACHE_SIZE_IN_BYTES is too small.
	Evacuated uint64
	// Expired counts the entries found past their time, by a lookup or
	// when dropped to make room; each counts once.
	Expired uint64
	// Overwrites counts the Remember calls for a key held already.
	Overwrites uint64
	// AverageAccessTime is the mean, over the entries held, of the Unix
	// time in seconds of their last Remember or hit; 0 when none is held.
	AverageAccessTime int64
}

// Lookups returns the number of lookups: Hits plus Misses.
func (s NearCacheStats) Lookups() uint64 { return s.Hits + s.Misses }

// Stats returns c's counters; zero for a nil cache.
func (c *NearCache) Stats() NearCacheStats {
	var st NearCacheStats
	if c == nil {
		return st
	}
	var access int64
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		st.Entries += int64(len(s.m))
		access += s.accessSum.Load()
		s.mu.RUnlock()
		st.Hits += s.hits.Load()
		st.Misses += s.misses.Load()
		st.Evacuated += s.evacuated.Load()
		st.Expired += s.expired.Load()
		st.Overwrites += s.overwrites.Load()
	}
	if st.Entries > 0 {
		st.AverageAccessTime = access / st.Entries
	}
	return st
}
