// Package writebehind counts fixed windows in this instance and writes the
// counts behind to a shared store: a Store decides every op from a local
// store (the memory store) and, every interval, sends each key's hits since
// the last flush to the shared store (Redis, Memcached) in one batch, then
// folds the fleet's total that the shared store answers back into the local
// count. A fleet's store then does one op per key per instance per interval
// instead of one per decision, and each instance admits at most what it can
// admit in one interval before it sees the others' hits (docs/STORES.md).
// It knows the limiter's contract and nothing of a particular store.
package writebehind

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// Supports reports whether write-behind counting can hold its bound on an
// algorithm's rules (fixed windows only); Unsupported says why it cannot,
// for the rules' load error. The service and ratelimit-check refuse the
// others with both.
func Supports(a rules.Algorithm) bool { return a == rules.FixedWindow }

const Unsupported = "write-behind counting (WRITE_BEHIND_INTERVAL) bounds its over-admission on fixed_window only"

// DefaultMaxKeys is Config.MaxKeys when 0: the keys of windows under way it
// tracks, about 200 bytes each.
const DefaultMaxKeys = 100_000

// chunk is the most keys one batch to the shared store carries.
const chunk = 512

// maxPending bounds a key's unflushed hits either way, so that no sum of
// hits can wrap it and a flush's op carries at most limiter.MaxHits (a
// count past it is over any limit: the fleet's count saturates there).
const maxPending = limiter.MaxHits

// Config tunes a Store.
type Config struct {
	// Interval is the time between two flushes; 0 starts no flusher (the
	// owner calls Flush).
	Interval time.Duration
	// MaxKeys is the most keys (windows under way) the Store tracks;
	// default DefaultMaxKeys. A batch with a key beyond it is decided by
	// the shared store, as without write-behind.
	MaxKeys int
	// Timeout bounds each batch of a flush; default 1 s.
	Timeout time.Duration
	// Flushed, if set, is told of each batch sent to the shared store:
	// its keys, and how long the store took to answer it.
	Flushed func(keys int, took time.Duration)
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Store decides from local and writes behind to shared. It is safe for
// concurrent use; a flush never holds a lock over I/O, so decisions never
// wait for the shared store.
type Store struct {
	shared, local limiter.Store
	cfg           Config
	// entries maps each key tracked to its *entry: written once per key
	// and window, read by every decision, without a lock (sync.Map).
	entries sync.Map
	keys    atomic.Int64

	batches, localOnly, dropped atomic.Uint64
	// down says that the shared store was unreachable at the last flush.
	down atomic.Bool
	// lastFlush is when the last flush the store answered (or that had
	// nothing to send) began, in Unix nanoseconds.
	lastFlush atomic.Int64

	// flushing serialises Flush.
	flushing  sync.Mutex
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// entry is one key of a window under way.
type entry struct {
	op  limiter.Op // the key's op, Hits 0
	end int64      // when its window ends, Unix seconds
	// pending is the hits recorded locally since the last flush (refunds
	// negative).
	pending atomic.Int64
	// base is the fleet's count at the last flush, which the local count
	// includes; only Flush reads and writes it.
	base uint64
}

// New returns a Store deciding from local and writing to shared, and
// starts its flusher when cfg.Interval is set.
func New(shared, local limiter.Store, cfg Config) *Store {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{shared: shared, local: local, cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	s.lastFlush.Store(cfg.Now().UnixNano())
	if cfg.Interval <= 0 {
		close(s.done)
		return s
	}
	go s.run()
	return s
}

func (s *Store) run() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Flush(context.Background())
		}
	}
}

// Close stops the flusher and flushes what is pending.
// It does not close the stores.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		s.Flush(context.Background())
	})
}

// Do decides the batch from the local store and records its fixed-window
// hits for the next flush. A batch the local store cannot decide alone (an
// algorithm other than fixed_window, or a new key with MaxKeys keys
// tracked) is decided by the shared store, as without write-behind; when
// the shared store is unreachable it is decided locally, and the hits of
// keys it cannot track, or of other algorithms, are dropped (counted in
// Stats.Dropped).
func (s *Store) Do(ctx context.Context, b *limiter.Batch) error {
	if b.Now.IsZero() {
		b.Now = s.cfg.Now()
	}
	if !s.tracks(b) {
		err := s.shared.Do(ctx, b)
		if !errors.Is(err, limiter.ErrUnavailable) {
			return err
		}
		s.down.Store(true)
	}
	if err := s.local.Do(ctx, b); err != nil {
		return err
	}
	if s.down.Load() {
		s.localOnly.Add(1)
	}
	// What the local store recorded: every fixed-window hit, but in an
	// AllOrNothing batch an op only if no op was refused (a shadow op: if
	// it was not itself refused), as limiter.Batch says.
	refused := false
	for i := range b.Ops {
		refused = refused || b.AllOrNothing && !b.Ops[i].Shadow && !b.Results[i].Allowed
	}
	for i := range b.Ops {
		op := &b.Ops[i]
		if op.Hits == 0 || b.AllOrNothing && (op.Shadow && !b.Results[i].Allowed || !op.Shadow && refused) {
			continue
		}
		if op.Algorithm != rules.FixedWindow {
			// Decided here only while the shared store is unreachable.
			s.dropped.Add(op.Hits)
			continue
		}
		d := int64(op.Hits)
		if op.Refund {
			d = -d
		}
		s.add(op, b.Now, d)
	}
	return nil
}

// tracks reports whether the local store decides b: every op a fixed
// window, and, with MaxKeys keys tracked, every key tracked already.
func (s *Store) tracks(b *limiter.Batch) bool {
	full := s.keys.Load() >= int64(s.cfg.MaxKeys)
	for i := range b.Ops {
		op := &b.Ops[i]
		if op.Algorithm != rules.FixedWindow {
			return false
		}
		if full && op.Hits > 0 {
			if _, ok := s.entries.Load(op.Key); !ok {
				return false
			}
		}
	}
	return true
}

// add records d hits of op (d < 0 for a refund) for the next flush.
func (s *Store) add(op *limiter.Op, now time.Time, d int64) {
	v, ok := s.entries.Load(op.Key)
	if !ok {
		if s.keys.Add(1) > int64(s.cfg.MaxKeys) {
			s.keys.Add(-1)
			s.dropped.Add(uint64(max(d, -d)))
			return
		}
		e := &entry{op: *op, end: limiter.FixedWindowEnd(now, op.Window).Unix()}
		// The limiter reuses the key's memory after Do.
		e.op.Key = strings.Clone(op.Key)
		e.op.Hits, e.op.Refund, e.op.Shadow, e.op.Group = 0, false, false, 0
		if v, ok = s.entries.LoadOrStore(e.op.Key, e); ok {
			s.keys.Add(-1) // another request made it first
		}
	}
	v.(*entry).addPending(d)
}

// addPending adds d to e's pending hits, held within ±maxPending: an add
// is at most MaxHits, so a sum clamped back at once can never wrap.
func (e *entry) addPending(d int64) {
	if v := e.pending.Add(d); v > maxPending || v < -maxPending {
		e.pending.CompareAndSwap(v, min(max(v, -maxPending), maxPending))
	}
}

// Flush sends every key's pending hits to the shared store, in batches of
// at most 512 keys, each within Config.Timeout, and folds the fleet's
// counts it answers into the local store. Keys whose window has ended are forgotten, their pending hits
// with them: no decision reads them any more. When the shared store is
// unreachable the hits stay pending, for the next flush; the hits of a key
// whose data the shared store refuses (an error wrapping limiter.ErrData)
// are dropped, and the other keys' are flushed.
func (s *Store) Flush(ctx context.Context) {
	s.flushing.Lock()
	defer s.flushing.Unlock()
	start := s.cfg.Now()
	var es []*entry
	var ds []int64
	for k, v := range s.entries.Range {
		e := v.(*entry)
		if start.Unix() >= e.end {
			s.entries.Delete(k)
			s.keys.Add(-1)
		} else if d := e.pending.Swap(0); d != 0 {
			es, ds = append(es, e), append(ds, d)
		}
	}
	down := false
	for len(es) > 0 {
		n := min(len(es), chunk)
		bctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		down = s.send(bctx, start, es[:n], ds[:n], true) || down
		cancel()
		es, ds = es[n:], ds[n:]
	}
	s.down.Store(down)
	if !down {
		s.lastFlush.Store(start.UnixNano())
	}
}

// maxCount bounds the fleet's count as a fold reads it from the store.
const maxCount = 1 << 62

// unanswered marks a Result the shared store did not fill.
const unanswered = -1

// send sends the pending hits ds of es in one batch and folds the answers.
// An op the store did not answer goes back to pending when the store is
// unreachable; for another error, when retry is set, it is sent again
// alone (so that one key's data cannot stop the others'), else dropped.
// It reports whether the store was unreachable.
func (s *Store) send(ctx context.Context, now time.Time, es []*entry, ds []int64, retry bool) (down bool) {
	b := &limiter.Batch{Now: now, Ops: make([]limiter.Op, len(es)), Results: make([]limiter.Result, len(es))}
	for i, e := range es {
		b.Ops[i] = e.op
		b.Ops[i].Hits, b.Ops[i].Refund = uint64(max(ds[i], -ds[i])), ds[i] < 0
		b.Results[i].ResetAfter = unanswered
	}
	took := time.Now()
	err := s.shared.Do(ctx, b)
	if s.cfg.Flushed != nil {
		s.cfg.Flushed(len(es), time.Since(took))
	}
	s.batches.Add(1)
	down = errors.Is(err, limiter.ErrUnavailable) || errors.Is(err, limiter.ErrOverloaded) || ctx.Err() != nil
	for i, e := range es {
		switch {
		case err == nil || b.Results[i].ResetAfter != unanswered:
			s.fold(ctx, now, e, ds[i], b.Results[i].After)
		case down:
			e.addPending(ds[i])
		case retry:
			down = s.send(ctx, now, es[i:i+1], ds[i:i+1], false) || down
		default:
			s.dropped.Add(uint64(max(ds[i], -ds[i])))
		}
	}
	return down
}

// fold brings the fleet's count total of e's key, which includes the d
// hits just flushed, into the local count: the hits the other instances
// flushed since the last fold are added to it (taken from it when they
// refunded more), and a local count found below total (its key evicted
// locally, a refund that found less to take) is raised to total.
func (s *Store) fold(ctx context.Context, now time.Time, e *entry, d int64, total uint64) {
	// The store's reply, held where the sums below cannot wrap.
	total = min(total, maxCount)
	others := int64(total) - int64(e.base) - d
	e.base = total
	op := e.op
	op.Hits, op.Refund = uint64(min(max(others, -others), limiter.MaxHits)), others < 0
	b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}}
	if s.local.Do(ctx, b) != nil || op.Refund || b.Results[0].After >= total {
		return
	}
	b.Ops[0].Hits = min(total-b.Results[0].After, limiter.MaxHits)
	_ = s.local.Do(ctx, b)
}

// Stats are what a Store counted since New.
type Stats struct {
	// Batches is the batches sent to the shared store.
	Batches uint64
	// LocalOnly is the batches decided while the shared store was
	// unreachable (at the last flush, or for a batch it had to decide).
	LocalOnly uint64
	// Dropped is the hits that will never reach the shared store: those
	// of new keys with MaxKeys tracked while the shared store was
	// unreachable, and those of keys whose data it refused.
	Dropped uint64
	// Keys is the keys tracked now.
	Keys int64
	// Lag is how old the fleet's counts in the local view may be: the
	// time since the last flush the shared store answered (or that had
	// nothing to send) began.
	Lag time.Duration
}

// Stats returns what s counted since New.
func (s *Store) Stats() Stats {
	return Stats{
		Batches:   s.batches.Load(),
		LocalOnly: s.localOnly.Load(),
		Dropped:   s.dropped.Load(),
		Keys:      s.keys.Load(),
		Lag:       s.cfg.Now().Sub(time.Unix(0, s.lastFlush.Load())),
	}
}
