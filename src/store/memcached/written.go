package memcached

import (
	"hash/maphash"
	"sync"
)

// written remembers the fixed-window keys this instance has counted in, and
// until when their window lasts, so that a hit on a key this instance has
// not written in the current window goes to add first, and one on a key it
// has goes to incr first. Either guess costs one round trip when right and
// two when wrong (the other command follows), and both orders count
// exactly, so a forgotten or stale entry costs only a round trip. Without
// it the first hit of every window is incr (a miss) then add: with short
// windows and many keys, most hits.
//
// It is bounded: a shard that fills drops its expired entries, and all of
// them if none has expired.
type written struct {
	seed   maphash.Seed
	shards [writtenShards]writtenShard
}

const (
	writtenShards   = 64
	writtenPerShard = 1024 // 64 Ki entries in all, about 3 MiB at most
)

type writtenShard struct {
	mu sync.Mutex
	// until maps a key's hash to the Unix second its window ends.
	until map[uint64]int64
}

func newWritten() *written {
	w := &written{seed: maphash.MakeSeed()}
	for i := range w.shards {
		w.shards[i].until = make(map[uint64]int64)
	}
	return w
}

func (w *written) shard(key string) (*writtenShard, uint64) {
	h := maphash.String(w.seed, key)
	return &w.shards[h%writtenShards], h
}

// has reports whether key was written in a window that has not ended at
// now (Unix seconds).
func (w *written) has(key string, now int64) bool {
	sh, h := w.shard(key)
	sh.mu.Lock()
	end, ok := sh.until[h]
	sh.mu.Unlock()
	return ok && now < end
}

// add records that key was written in a window ending at end.
func (w *written) add(key string, end, now int64) {
	sh, h := w.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.until[h]; !ok && len(sh.until) >= writtenPerShard {
		for k, e := range sh.until {
			if e <= now {
				delete(sh.until, k)
			}
		}
		if len(sh.until) >= writtenPerShard {
			clear(sh.until)
		}
	}
	sh.until[h] = end
}
