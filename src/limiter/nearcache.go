package limiter

import (
	"hash/maphash"
	"strings"
	"sync"
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
// entries are never returned. It is safe for concurrent use; a nil
// *NearCache is a valid cache that remembers nothing.
type NearCache struct {
	seed   maphash.Seed
	shards []nearCacheShard
}

type nearCacheShard struct {
	// mu guards every field below.
	mu    sync.RWMutex
	m     map[string]*nearCacheEntry
	queue []*nearCacheEntry // insertion order, oldest at head
	head  int
	bytes int
	max   int
}

type nearCacheEntry struct {
	key   string
	limit uint64
	until int64 // Unix nanoseconds
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
// now, and returns that time.
func (c *NearCache) Over(key string, limit uint64, now time.Time) (until time.Time, over bool) {
	if c == nil {
		return time.Time{}, false
	}
	s := c.shard(key)
	s.mu.RLock()
	e := s.m[key]
	var u int64
	if e != nil && e.limit == limit {
		u = e.until
	}
	s.mu.RUnlock()
	if u == 0 || now.UnixNano() >= u {
		return time.Time{}, false
	}
	return time.Unix(0, u), true
}

// Remember records that key is over limit until the given time, replacing
// what was known of key. The key is copied.
func (c *NearCache) Remember(key string, limit uint64, until time.Time) {
	if c == nil {
		return
	}
	size := len(key) + nearCacheEntryOverhead
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[key]; e != nil {
		e.limit, e.until = limit, until.UnixNano()
		return
	}
	if size > s.max {
		return
	}
	for s.bytes+size > s.max {
		s.evictOldest()
	}
	e := &nearCacheEntry{key: strings.Clone(key), limit: limit, until: until.UnixNano()}
	s.m[e.key] = e
	s.queue = append(s.queue, e)
	s.bytes += size
}

// evictOldest drops the entry at the head of the queue.
func (s *nearCacheShard) evictOldest() {
	e := s.queue[s.head]
	s.queue[s.head] = nil
	s.head++
	delete(s.m, e.key)
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
