package limiter

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestNearCache(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c := NewNearCache(1 << 20)
	c.Remember("rl_api_user_alice_1700000000", 10, t0, t0.Add(time.Minute))

	tests := []struct {
		name  string
		key   string
		limit uint64
		now   time.Time
		want  bool
	}{
		{"hit", "rl_api_user_alice_1700000000", 10, t0, true},
		{"hit_just_before_until", "rl_api_user_alice_1700000000", 10, t0.Add(time.Minute - time.Nanosecond), true},
		{"expired_at_until", "rl_api_user_alice_1700000000", 10, t0.Add(time.Minute), false},
		// envoyproxy/ratelimit #1077: an override that raises the limit
		// must not be answered from the entry of the old limit.
		{"other_limit", "rl_api_user_alice_1700000000", 100, t0, false},
		{"other_key", "rl_api_user_bob_1700000000", 10, t0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			until, got := c.Over(tt.key, tt.limit, tt.now)
			if got != tt.want {
				t.Fatalf("Over(%q, %d) = %v, want %v", tt.key, tt.limit, got, tt.want)
			}
			if got && !until.Equal(t0.Add(time.Minute)) {
				t.Errorf("Over(%q) until = %v, want %v", tt.key, until, t0.Add(time.Minute))
			}
		})
	}
}

func TestNearCacheReplace(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c := NewNearCache(1 << 20)
	c.Remember("k", 10, t0, t0.Add(time.Second))
	c.Remember("k", 20, t0, t0.Add(time.Minute))
	if _, over := c.Over("k", 10, t0); over {
		t.Error("Over(k, 10) = true after Remember(k, 20), want false")
	}
	if _, over := c.Over("k", 20, t0.Add(30*time.Second)); !over {
		t.Error("Over(k, 20) = false, want true")
	}
	if n := c.Len(); n != 1 {
		t.Errorf("Len() = %d, want 1", n)
	}
}

func TestNearCacheCopiesKey(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c := NewNearCache(1 << 20)
	buf := []byte("key_one")
	c.Remember(string(buf), 1, t0, t0.Add(time.Minute))
	copy(buf, "key_two") // the limiter reuses its key buffers
	if _, over := c.Over("key_one", 1, t0); !over {
		t.Error("Over(key_one) = false after the caller reused its buffer, want true")
	}
}

func TestNearCacheBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		maxBytes int
	}{
		{"one_shard", 10 << 10},
		{"many_shards", 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewNearCache(tt.maxBytes)
			const keyLen = 32
			for i := range 100_000 {
				key := strconv.Itoa(1e9 + i)
				key += string(make([]byte, keyLen-len(key)))
				c.Remember(key, 5, t0, t0.Add(time.Hour))
			}
			maxEntries := tt.maxBytes / (keyLen + nearCacheEntryOverhead)
			if n := c.Len(); n > maxEntries || n < maxEntries/2 {
				t.Errorf("Len() = %d after 100000 inserts into %d bytes, want about %d", n, tt.maxBytes, maxEntries)
			}
			for i := range c.shards {
				s := &c.shards[i]
				if s.bytes > s.max {
					t.Errorf("shard %d holds %d bytes, more than its %d", i, s.bytes, s.max)
				}
				if len(s.queue)-s.head != len(s.m) {
					t.Errorf("shard %d queue has %d live entries, map %d", i, len(s.queue)-s.head, len(s.m))
				}
			}
			// The newest entry survives; the oldest was evicted.
			last := strconv.Itoa(1e9 + 99_999)
			last += string(make([]byte, keyLen-len(last)))
			if _, over := c.Over(last, 5, t0); !over {
				t.Error("newest entry was evicted")
			}
			first := strconv.Itoa(1e9)
			first += string(make([]byte, keyLen-len(first)))
			if _, over := c.Over(first, 5, t0); over {
				t.Error("oldest entry is still there")
			}
		})
	}
}

func TestNearCacheTooSmall(t *testing.T) {
	c := NewNearCache(10) // below one entry
	c.Remember("key", 1, time.Unix(1e9, 0), time.Unix(2e9, 0))
	if _, over := c.Over("key", 1, time.Unix(1e9, 0)); over {
		t.Error("a cache smaller than one entry remembered it")
	}
}

func TestNearCacheNil(t *testing.T) {
	var c *NearCache = NewNearCache(0)
	if c != nil {
		t.Fatal("NewNearCache(0) != nil")
	}
	c.Remember("key", 1, time.Unix(1e9, 0), time.Unix(2e9, 0))
	if _, over := c.Over("key", 1, time.Unix(1e9, 0)); over {
		t.Error("nil cache: Over = true")
	}
	if c.Len() != 0 {
		t.Error("nil cache: Len != 0")
	}
}

func TestNearCacheConcurrent(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c := NewNearCache(256 << 10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				key := strconv.Itoa(i % 500)
				if i%3 == g%3 {
					c.Remember(key, uint64(i%2), t0, t0.Add(time.Minute))
				} else {
					c.Over(key, uint64(i%2), t0)
				}
			}
		})
	}
	wg.Wait()
	if n := c.Len(); n > 500 {
		t.Errorf("Len() = %d, want <= 500 distinct keys", n)
	}
}

func BenchmarkNearCacheOver(b *testing.B) {
	t0 := time.Unix(1_700_000_000, 0)
	c := NewNearCache(8 << 20)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "rl_api_user_" + strconv.Itoa(i) + "_1700000000"
		c.Remember(keys[i], 100, t0, t0.Add(time.Minute))
	}
	if n := c.Len(); n != len(keys) {
		b.Fatalf("Len() = %d, want %d", n, len(keys))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i, hits := 0, 0
		for pb.Next() {
			if _, over := c.Over(keys[i%len(keys)], 100, t0); over {
				hits++
			}
			i++
		}
		if hits != i {
			b.Errorf("%d hits of %d lookups", hits, i)
		}
	})
}

// TestNearCacheStats: the counters mean what freecache's do for
// envoyproxy/ratelimit's ratelimit.localcache gauges.
func TestNearCacheStats(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c := NewNearCache(1 << 20)
	want := func(step string, w NearCacheStats) {
		t.Helper()
		if got := c.Stats(); got != w {
			t.Fatalf("%s: Stats() = %+v, want %+v", step, got, w)
		}
	}
	want("new", NearCacheStats{})

	c.Over("a", 10, t0) // no entry
	want("miss", NearCacheStats{Misses: 1})

	c.Remember("a", 10, t0, t0.Add(time.Minute))
	c.Remember("b", 10, t0.Add(2*time.Second), t0.Add(time.Second)) // until passed at once
	want("two entries", NearCacheStats{Misses: 1, Entries: 2, AverageAccessTime: t0.Unix() + 1})

	c.Over("a", 10, t0.Add(4*time.Second))  // hit: a accessed at t0+4
	c.Over("a", 10, t0.Add(4*time.Second))  // hit
	c.Over("a", 99, t0.Add(4*time.Second))  // another limit: miss
	c.Over("b", 10, t0.Add(10*time.Second)) // expired: miss, counted once
	c.Over("b", 10, t0.Add(11*time.Second))
	want("lookups", NearCacheStats{Hits: 2, Misses: 4, Entries: 2, Expired: 1, AverageAccessTime: t0.Unix() + 3})
	if got := c.Stats().Lookups(); got != 6 {
		t.Errorf("Lookups() = %d, want 6", got)
	}

	c.Remember("a", 20, t0.Add(6*time.Second), t0.Add(time.Minute))
	want("overwrite", NearCacheStats{Hits: 2, Misses: 4, Entries: 2, Expired: 1, Overwrites: 1, AverageAccessTime: t0.Unix() + 4})

	var nilCache *NearCache
	if st := nilCache.Stats(); st != (NearCacheStats{}) {
		t.Errorf("nil cache: Stats() = %+v, want zero", st)
	}
}

// TestNearCacheStatsEvictions: an entry dropped for room is evacuated while
// in force, expired once past its time (and never counted twice).
func TestNearCacheStatsEvictions(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	const key = "key_0123456789"
	size := len(key) + nearCacheEntryOverhead
	c := NewNearCache(2 * size) // one shard, two entries
	c.Remember("key_0000000000", 1, t0, t0.Add(time.Second))
	c.Remember("key_0000000001", 1, t0, t0.Add(time.Hour))
	c.Over("key_0000000000", 1, t0.Add(time.Minute))                        // seen expired
	c.Remember("key_0000000002", 1, t0.Add(time.Minute), t0.Add(time.Hour)) // drops 0: expired already counted
	c.Remember("key_0000000003", 1, t0.Add(time.Minute), t0.Add(time.Hour)) // drops 1: in force
	st := c.Stats()
	if st.Expired != 1 || st.Evacuated != 1 || st.Entries != 2 {
		t.Errorf("Stats() = %+v, want Expired 1, Evacuated 1, Entries 2", st)
	}
	c.Remember("key_0000000004", 1, t0.Add(2*time.Hour), t0.Add(3*time.Hour)) // drops 2: expired, unseen
	if st := c.Stats(); st.Expired != 2 || st.Evacuated != 1 {
		t.Errorf("Stats() = %+v, want Expired 2, Evacuated 1", st)
	}
}

// TestNearCacheForget: a refund's Forget drops the key, and a Remember by
// a request that looked the key up before it (whose store answer may
// predate the refund) is dropped too; one that looked it up after is kept.
func TestNearCacheForget(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	key := "rl_api_user_alice_1700000000"
	c := NewNearCache(1 << 20)
	c.Remember(key, 10, t0, t0.Add(time.Minute))
	c.Forget(key)
	if _, over := c.Over(key, 10, t0); over {
		t.Fatal("Over after Forget = true, want the key forgotten")
	}
	st := c.Stats()
	if st.Expired != 0 || st.Evacuated != 0 {
		t.Errorf("after Forget: %+v, want a forgotten entry counted neither expired nor evacuated", st)
	}

	// A check looked the key up, then a refund landed and forgot it, then
	// the check's answer (over, from before the refund) arrives.
	_, _, before := c.lookup(key, 10, t0)
	c.Forget(key)
	c.rememberSince(before, key, 10, t0, t0.Add(time.Minute))
	if _, over := c.Over(key, 10, t0); over {
		t.Error("a Remember from before a Forget was kept: the refund's room stays hidden until the entry ends")
	}
	// A check that looked it up after the refund is remembered.
	_, _, after := c.lookup(key, 10, t0)
	c.rememberSince(after, key, 10, t0, t0.Add(time.Minute))
	if _, over := c.Over(key, 10, t0); !over {
		t.Error("a Remember from after the Forget was dropped")
	}
	var nilCache *NearCache
	nilCache.Forget(key) // a nil cache remembers nothing, and forgets as well
}
