package memcached

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// The walk of a batch (Do): its ops are cut into units, each applied in
// one step. A batch of fixed-window hits on keys of their own goes out in
// one write (doCounts); any other batch applies its units side by side
// (fanout), and an AllOrNothing batch takes back what it recorded when an
// op was refused (doUnits).

// unit is a part of a batch applied in one step: one op, or the ops of a
// list of limits kept in one item (see list.go).
type unit struct {
	from, to int    // the ops b.Ops[from:to]
	key      string // the op's key, or the list's item's (before itemKey)
	list     bool
}

// units appends the units of ops to us, in order: each group of ops
// (limiter.Op.Group) that listKey takes is one, and every other op one.
func units(ops []limiter.Op, us []unit) []unit {
	for i := 0; i < len(ops); {
		if g := ops[i].Group; g != 0 {
			end := i + 1
			for end < len(ops) && ops[end].Group == g {
				end++
			}
			if key, ok := listKey(ops[i:end]); ok {
				us = append(us, unit{from: i, to: end, key: key, list: true})
				i = end
				continue
			}
		}
		us = append(us, unit{from: i, to: i + 1, key: ops[i].Key})
		i++
	}
	return us
}

// distinctKeys reports whether every unit of us has a key of its own:
// units on one key must run in order, so that the later sees the earlier.
func distinctKeys(us []unit) bool {
	if len(us) <= 16 {
		for i := range us {
			for j := range i {
				if us[i].key == us[j].key {
					return false
				}
			}
		}
		return true
	}
	seen := make(map[string]struct{}, len(us))
	for i := range us {
		if _, ok := seen[us[i].key]; ok {
			return false
		}
		seen[us[i].key] = struct{}{}
	}
	return true
}

// countBatch reports whether b, of units us, is a batch that doCounts
// applies: more than one op, not AllOrNothing, every op a fixed-window
// hit (no refund) on a key of its own (the descriptors of one request, in
// the usual case), none in a list's item (a list of one limit included).
func countBatch(b *limiter.Batch, us []unit, apart bool) bool {
	if b.AllOrNothing || !apart || len(b.Ops) < 2 || len(us) != len(b.Ops) {
		return false
	}
	for i := range b.Ops {
		if us[i].list || b.Ops[i].Algorithm.Continuous() || b.Ops[i].Hits == 0 || b.Ops[i].Refund {
			return false
		}
	}
	return true
}

// counting is a fixed-window hit under way (see count).
type counting struct {
	key string // the item's key (see itemKey)
	// incr says the next command is incr, not add.
	incr bool
	// queued says call is queued and sent: count waits for its answer
	// before sending another.
	queued bool
	call   mcclient.Call
	span   trace.Span
	err    error // of queuing call
}

// queue queues c's command for op in batch (sends it at once when batch
// is nil): incr by the op's hits, or add of an item holding them, which
// lasts the window.
func (s *Store) queue(ctx context.Context, batch *mcclient.Batch, c *counting, op *limiter.Op) {
	c.queued = true
	if c.incr {
		c.span = s.startSpan(ctx, cmdIncr)
		c.call, c.err = s.client.QueueIncr(ctx, batch, c.key, op.Hits)
		return
	}
	c.span = s.startSpan(ctx, cmdAdd)
	c.call, c.err = s.client.QueueAddNum(ctx, batch, c.key, op.Hits, s.expiration(max(int64(op.Window/time.Second), 1)))
}

// count applies the fixed-window hit c of op at now and fills *r: incr,
// and on a miss add, and on add's "not stored" (another instance added it
// meanwhile) incr again. The first command is c's: incr for a key this
// instance wrote in the current window (see written), else add, so that
// the first hit of a window takes one round trip too; doCounts may have
// queued it already. Every hit is counted, admitted or not, as the anchor
// does.
//
// Each miss of incr after add's "not stored" means the item went between
// the two (it expired, was evicted or deleted); a memcached that answers
// so at every attempt is faulty or the item cannot stay: after
// maxAttempts adds the op fails with limiter.ErrOverloaded, as an update
// that runs out of cycles, so that no answer can hold the request in a
// loop until its deadline (issue 24: 75,000 round trips in 5.8 s).
//
// ctx is checked before every round trip, here and in every function a Do
// calls, so that none starts after ctx's deadline (see Do).
func (s *Store) count(ctx context.Context, c *counting, op *limiter.Op, now time.Time, r *limiter.Result) (undo, error) {
	for adds := 0; ; c.incr = !c.incr {
		if !c.queued {
			if err := s.check(ctx); err != nil {
				return undo{}, err
			}
			s.queue(ctx, nil, c, op) // sent at once
		}
		c.queued = false
		err := c.err
		var n uint64
		if err == nil {
			n, err = s.client.Wait(ctx, c.call)
		}
		endSpan(c.span, err)
		if c.incr {
			s.countIncr(err)
		} else {
			s.countAdd(err)
			n, adds = op.Hits, adds+1
		}
		switch {
		case err == nil:
			s.gotAnswer(c.key)
			s.written.add(c.key, limiter.FixedWindowEnd(now, op.Window).Unix(), now.Unix())
			return s.counted(ctx, c.key, op, now, n, r), nil
		case c.incr && !errors.Is(err, mcclient.ErrCacheMiss), !c.incr && !errors.Is(err, mcclient.ErrNotStored):
			return undo{}, s.fail(c.key, err)
		}
		s.gotAnswer(c.key)
		if adds == maxAttempts {
			s.shed.Add(1)
			return undo{}, fmt.Errorf("memcached: key %q: %w: %w after %d attempts", c.key, limiter.ErrOverloaded, errMissing, maxAttempts)
		}
	}
}

// doCounts applies a countBatch: the first command of every op (see
// count) is queued in one of the client's batches, so that the batch
// goes out in one write per connection and comes back in about one round
// trip, without a goroutine per op; an op whose first command missed goes
// on alone. It returns the error of the lowest op that failed.
func (s *Store) doCounts(ctx context.Context, b *limiter.Batch) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	var buf [8]counting
	cs := append(buf[:0], make([]counting, len(b.Ops))...) // on the stack up to 8 ops
	var batch mcclient.Batch
	for i := range b.Ops {
		c := &cs[i]
		c.key = itemKey(b.Ops[i].Key)
		c.incr = s.written.has(c.key, b.Now.Unix())
		s.queue(ctx, &batch, c, &b.Ops[i])
	}
	batch.Send()
	var first error
	for i := range cs {
		_, err := s.count(ctx, &cs[i], &b.Ops[i], b.Now, &b.Results[i])
		first = cmp.Or(first, err)
	}
	return first
}

// applyUnit applies the unit u of b in mode: a list's ops in one update of
// its item; one op alone, or for listRead as with Hits 0, setting only
// Remaining and ResetAfter. A shadow op (limiter.Op.Shadow) of an
// AllOrNothing batch is all-or-nothing by itself: taken back at once when
// refused, never with the batch, and not read again.
func (s *Store) applyUnit(ctx context.Context, b *limiter.Batch, u *unit, mode listMode) (undo, error) {
	if u.list {
		return s.applyList(ctx, u.key, b.Ops[u.from:u.to], b.Now, b.Results[u.from:u.to], mode)
	}
	op, res := &b.Ops[u.from], &b.Results[u.from]
	switch {
	case mode == listEach, mode == listAll && !op.Shadow:
		return s.apply(ctx, op, b.Now, res)
	case mode == listRead && op.Shadow:
		return undo{}, nil
	case mode == listAll:
		un, err := s.apply(ctx, op, b.Now, res)
		if err == nil && !res.Allowed {
			err = s.undo(ctx, &un)
		}
		if err != nil || res.Allowed {
			return undo{}, err
		}
	}
	return undo{}, s.read(ctx, op, b.Now, res)
}

// read sets Remaining and ResetAfter of res, op's result, to those of
// op's key as it is: a read with Hits 0. (A function of its own, as
// applyCount, so that its copy of op is on the stack only when it runs.)
func (s *Store) read(ctx context.Context, op *limiter.Op, now time.Time, res *limiter.Result) error {
	read := *op
	read.Hits = 0
	var r limiter.Result
	_, err := s.apply(ctx, &read, now, &r)
	if err == nil {
		res.Remaining, res.ResetAfter = r.Remaining, r.ResetAfter
	}
	return err
}

// doUnits applies the units us of b, each on its own: side by side when
// their keys are apart, else in order (see fanout). An AllOrNothing batch
// records each unit (an op on its own key, or a list's ops on their item,
// all or none of them); then, if any op was refused, the recorded ones
// are taken back (newest first when not apart, so that units on one key
// see each other as in a sequence) and every op's Remaining and
// ResetAfter read from the unchanged state. Its closures, which fanout may
// run on other goroutines, take us to the heap: Do passes a copy, so that
// its stack buffer, all that its other paths need, stays on the stack.
func (s *Store) doUnits(ctx context.Context, b *limiter.Batch, us []unit, apart bool) error {
	if !b.AllOrNothing {
		return s.fanout(len(us), apart, func(k int) error {
			_, err := s.applyUnit(ctx, b, &us[k], listEach)
			return err
		})
	}
	undos := make([]undo, len(us))
	err := s.fanout(len(us), apart, func(k int) (err error) {
		undos[k], err = s.applyUnit(ctx, b, &us[k], listAll)
		return err
	})
	refused := false
	for i := range b.Results {
		refused = refused || !b.Results[i].Allowed && !b.Ops[i].Shadow
	}
	if err == nil && (!refused || len(us) == 1 && us[0].list) {
		// A list alone read its unchanged state itself (runList).
		return nil
	}
	// Nothing may stay recorded: take back what was, as far as memcached
	// and ctx's deadline let us, even when ctx is canceled meanwhile (see
	// undo).
	if err := errors.Join(err, s.rollback(ctx, undos, apart)); err != nil {
		return err
	}
	// Allowed, Before and After stay those of the evaluation; Remaining
	// and ResetAfter become those of the unchanged state.
	return s.fanout(len(us), apart, func(k int) error {
		_, err := s.applyUnit(ctx, b, &us[k], listRead)
		return err
	})
}

// fanout runs f(i) for i in [0, n) and returns the error of the lowest i
// that failed. When apart, each f but the first runs in a goroutine of its
// own if it can take a slot at once, so that the round trips of a batch
// overlap; the rest, and all of them when not apart, run in order in the
// calling goroutine, on the slot of the Do, and stop at the first error,
// as the ops of a Do did when they all ran in order (with memcached down,
// one Timeout per op would add up). fanout returns when every f started
// has: the goroutines are the Do's, and, as they hold slots, there are
// fewer than Config.MaxConns of them in the whole store.
func (s *Store) fanout(n int, apart bool, f func(i int) error) error {
	if n == 1 || !apart {
		for i := range n {
			if err := f(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	var inline [8]int
	here := append(inline[:0], 0)
	for i := 1; i < n; i++ {
		select {
		case s.slots <- struct{}{}:
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer s.release()
				errs[i] = f(i)
			}()
		default:
			here = append(here, i)
		}
	}
	for _, i := range here {
		if errs[i] = f(i); errs[i] != nil {
			break
		}
	}
	wg.Wait()
	return cmp.Or(errs...)
}

// rollback takes back the recorded ops of undos, side by side when apart,
// else newest first, and returns the error of the lowest that failed; it
// goes on after one, so that as much as possible is taken back.
func (s *Store) rollback(ctx context.Context, undos []undo, apart bool) error {
	if apart {
		errs := make([]error, len(undos))
		_ = s.fanout(len(undos), apart, func(i int) error {
			errs[i] = s.undo(ctx, &undos[i])
			return nil // fanout's would stop at the first error
		})
		return cmp.Or(errs...)
	}
	var first error
	for i := len(undos) - 1; i >= 0; i-- {
		first = cmp.Or(s.undo(ctx, &undos[i]), first)
	}
	return first
}
