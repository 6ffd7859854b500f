// Package memory is the embedded store: every key's state in this process,
// in sharded maps, with idle keys reclaimed by a sweeper. It is the default
// backend (one instance, nothing to install) and runs every algorithm by
// calling the limiter's pure functions under a shard lock. It knows nothing
// of rules files, gRPC or the other stores.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// ErrFull is wrapped by the error Do returns when an op needs a new key and
// the store already holds Config.MaxKeys keys. That error wraps
// limiter.ErrUnavailable too: the request is answered as when Redis is down,
// and Envoy's failure_mode_deny decides. Evicting live keys instead would
// let a flood of new keys reset the counts of the others: over-admission
// by design.
var ErrFull = errors.New("memory: store full")

// Config tunes a Store. The zero value is usable: unbounded, the system
// clock, a sweep every 10 seconds, 256 shards.
type Config struct {
	// MaxKeys is the most keys the store holds; 0 means no limit. A new key
	// beyond it is refused with ErrFull after the store has reclaimed the
	// idle keys of the new key's shard (at most once a second per shard);
	// the sweeper reclaims the rest. Keys still counting are never evicted.
	MaxKeys int
	// Now is the clock of the sweeper; default time.Now. Ops use Batch.Now.
	Now func() time.Time
	// SweepInterval is how often the sweeper removes idle keys; default
	// 10 s. A negative value starts no sweeper: call Sweep yourself.
	SweepInterval time.Duration
	// Shards is the number of independently locked maps, rounded up to a
	// power of two; default 256.
	Shards int
}

// Store keeps every key's state in memory. It is safe for concurrent use:
// ops on keys of different shards never wait for each other, and each op
// (or, for an AllOrNothing batch, the whole batch) holds its shards' locks
// while it reads and writes. Make one with New and stop its sweeper with
// Close.
type Store struct {
	shards []shard
	mask   uint64
	seed   maphash.Seed
	max    int64
	now    func() time.Time
	// keys counts the keys of all shards, for MaxKeys and Len.
	keys atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// shard is one lock and the keys it guards; padded so that neighbouring
// shards' locks do not share a cache line.
type shard struct {
	// mu guards m, peak and lastReclaim.
	mu sync.Mutex
	m  map[string]*entry
	// peak is the largest len(m) since the map was last rebuilt: Go maps
	// never give back the memory of deleted keys, so the sweeper rebuilds a
	// map that has shrunk to a quarter of it.
	peak int
	// lastReclaim is when (Unix µs) a full store last scanned this shard
	// for idle keys.
	lastReclaim int64
	_           [64]byte
}

// entry is one key's state. Which fields are used depends on the algorithm:
// fixed_window n1 = count; sliding_window t = start, n1 = prev, n2 = curr;
// token_bucket t = TAT; sliding_log log.
type entry struct {
	// idle is when (Unix µs) the state becomes that of a new key, so the
	// key can go (see the IdleAt methods of the limiter's states).
	idle   int64
	t      int64
	n1, n2 uint64
	log    *limiter.SlidingLogState
}

// New returns a Store and starts its sweeper (unless cfg.SweepInterval is
// negative).
func New(cfg Config) *Store {
	n := 256
	if cfg.Shards > 0 {
		n = 1
		for n < cfg.Shards {
			n <<= 1
		}
	}
	s := &Store{
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		seed:   maphash.MakeSeed(),
		max:    int64(cfg.MaxKeys),
		now:    cfg.Now,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
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
	for k, e := range sh.m {
		if e.idle <= now {
			delete(sh.m, k)
			n++
		}
	}
	s.keys.Add(-int64(n))
	if sh.peak >= 64 && len(sh.m) <= sh.peak/4 {
		m := make(map[string]*entry, len(sh.m))
		for k, e := range sh.m {
			m[k] = e
		}
		sh.m, sh.peak = m, len(m)
	}
	return n
}

// Len returns the number of keys held, idle ones not yet swept included.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Do applies the batch's ops at b.Now (or Config.Now when b.Now is zero)
// with the limiter's pure functions. Without AllOrNothing each op locks its
// own shard; with it, the shards of all the batch's keys are locked in
// index order, the ops applied, and all undone if any op was refused.
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
		return s.doAll(now, b)
	}
	for i := range b.Ops {
		op := &b.Ops[i]
		sh := s.shard(op.Key)
		sh.mu.Lock()
		e, _, err := s.lookup(sh, op.Key, now, op.Hits > 0)
		if err == nil {
			if e == nil { // a read of a missing key: the zero state, not stored
				var zero entry
				e = &zero
			}
			b.Results[i], _ = apply(e, now, op)
		}
		sh.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// undo is what it takes to take back one op of an AllOrNothing batch.
type undo struct {
	sh      *shard
	key     string
	e       *entry
	old     entry // the state before the op (for a sliding log: its idle time)
	created bool
	pushed  int // hits the op logged, for a sliding log
}

// doAll applies an AllOrNothing batch under the locks of all its shards.
func (s *Store) doAll(now time.Time, b *limiter.Batch) error {
	var idxBuf [8]uint64
	locked := idxBuf[:0]
	for i := range b.Ops {
		locked = append(locked, s.shardIndex(b.Ops[i].Key))
	}
	// Lock in one global order (shard index) so that batches sharing
	// shards cannot deadlock.
	slices.Sort(locked)
	locked = slices.Compact(locked)
	for _, i := range locked {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range locked {
			s.shards[i].mu.Unlock()
		}
	}()

	var undoBuf [8]undo
	undos := undoBuf[:0]
	refused := false
	for i := range b.Ops {
		op := &b.Ops[i]
		sh := s.shard(op.Key)
		e, created, err := s.lookup(sh, op.Key, now, op.Hits > 0)
		if err != nil {
			s.rollback(undos)
			return err
		}
		if e == nil { // a read of a missing key: nothing to store or undo
			var zero entry
			b.Results[i], _ = apply(&zero, now, op)
			continue
		}
		u := undo{sh: sh, key: op.Key, e: e, old: *e, created: created}
		b.Results[i], u.pushed = apply(e, now, op)
		undos = append(undos, u)
	}
	for i := range b.Results[:len(b.Ops)] {
		refused = refused || !b.Results[i].Allowed
	}
	if !refused {
		return nil
	}
	s.rollback(undos)
	// Allowed, Before and After stay those of the evaluation in order;
	// Remaining and ResetAfter become those of the unchanged state.
	for i := range b.Ops {
		op := b.Ops[i]
		op.Hits = 0
		e := s.shard(op.Key).m[op.Key]
		if e == nil {
			e = &entry{}
		}
		read, _ := apply(e, now, &op)
		b.Results[i].Remaining, b.Results[i].ResetAfter = read.Remaining, read.ResetAfter
	}
	return nil
}

// rollback undoes the ops in reverse order. The caller holds the locks.
func (s *Store) rollback(undos []undo) {
	for i := len(undos) - 1; i >= 0; i-- {
		u := &undos[i]
		switch {
		case u.created:
			delete(u.sh.m, u.key)
			s.keys.Add(-1)
		case u.e.log != nil:
			u.e.log.Forget(u.pushed)
			u.e.idle = u.old.idle
		default:
			*u.e = u.old
		}
	}
}

// lookup returns key's entry in sh, creating it when create is set; else a
// missing key gives nil. An entry idle at now is reset: its key may not have
// been swept yet. The caller holds sh.mu.
func (s *Store) lookup(sh *shard, key string, now time.Time, create bool) (e *entry, created bool, err error) {
	if e = sh.m[key]; e != nil {
		if e.idle <= now.UnixMicro() {
			// Reset what the pure functions would not: a fixed-window
			// count whose window is over. A sliding log drops its old
			// hits itself and keeps its ring.
			*e = entry{log: e.log}
		}
		return e, false, nil
	}
	if !create {
		return nil, false, nil
	}
	if s.max > 0 {
		if s.keys.Load() >= s.max {
			if t := now.UnixMicro(); t-sh.lastReclaim >= int64(time.Second/time.Microsecond) || t < sh.lastReclaim {
				sh.lastReclaim = t
				s.reclaim(sh, t)
			}
		}
		if s.keys.Add(1) > s.max {
			s.keys.Add(-1)
			return nil, false, fmt.Errorf("%w (MaxKeys %d): %w", ErrFull, s.max, limiter.ErrUnavailable)
		}
	} else {
		s.keys.Add(1)
	}
	e = &entry{}
	sh.m[key] = e
	sh.peak = max(sh.peak, len(sh.m))
	return e, true, nil
}

// apply runs op's pure function on e and returns its result and, for a
// sliding log, how many hits it logged.
func apply(e *entry, now time.Time, op *limiter.Op) (limiter.Result, int) {
	var r limiter.Result
	pushed := 0
	switch op.Algorithm {
	case rules.SlidingWindow:
		var st limiter.SlidingWindowState
		st, r = limiter.SlidingWindow(limiter.SlidingWindowState{Start: e.t, Prev: e.n1, Curr: e.n2}, now, *op)
		e.t, e.n1, e.n2 = st.Start, st.Prev, st.Curr
		e.idle = st.IdleAt(op.Window)
	case rules.SlidingLog:
		if e.log == nil {
			e.log = new(limiter.SlidingLogState)
		}
		*e.log, r = limiter.SlidingLog(*e.log, now, *op)
		if r.Allowed {
			pushed = int(op.Hits)
		}
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
	return r, pushed
}

func (s *Store) shard(key string) *shard {
	return &s.shards[s.shardIndex(key)]
}

func (s *Store) shardIndex(key string) uint64 {
	return maphash.String(s.seed, key) & s.mask
}
