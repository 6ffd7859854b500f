package memcached

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// countBatch reports whether b, of units us (see units), is a batch
// that doCounts applies: more than one op, not AllOrNothing, every op a
// fixed-window hit (no refund) on a key of its own (the descriptors of one request, in
// the usual case), none in a list's item (a list of one limit included).
func countBatch(b *limiter.Batch, us []unit, apart bool) bool {
	if b.AllOrNothing || !apart || len(b.Ops) < 2 || len(us) != len(b.Ops) {
		return false
	}
	for i := range b.Ops {
		if us[i].list || continuous(b.Ops[i].Algorithm) || b.Ops[i].Hits == 0 || b.Ops[i].Refund {
			return false
		}
	}
	return true
}

// counting is an op of doCounts under way.
type counting struct {
	key       string
	incrFirst bool
	call      mcclient.Call
	span      trace.Span
	err       error
}

// doCounts applies a countBatch: the first command of every op (incr, or
// add for a key this instance has not written in the window; see
// applyCount) is queued in one of the client's batches, so that the batch
// goes out in one write per connection and comes back in about one round
// trip, without a goroutine per op. An op whose first command missed (incr
// of a key gone, add of a key another instance created) goes on alone as
// applyCount would. It returns the error of the lowest op that failed.
func (s *Store) doCounts(ctx context.Context, b *limiter.Batch) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	var buf [8]counting
	ops := buf[:0]
	if len(b.Ops) > len(buf) {
		ops = make([]counting, 0, len(b.Ops))
	}
	sec := b.Now.Unix()
	var batch mcclient.Batch
	for i := range b.Ops {
		op := &b.Ops[i]
		c := counting{key: itemKey(op.Key)}
		c.incrFirst = s.written.has(c.key, sec)
		if c.incrFirst {
			c.span = s.startSpan(ctx, cmdIncr)
			c.call, c.err = s.client.QueueIncr(ctx, &batch, c.key, op.Hits)
		} else {
			c.span = s.startSpan(ctx, cmdAdd)
			exp := s.expiration(max(int64(op.Window/time.Second), 1))
			c.call, c.err = s.client.QueueAddNum(ctx, &batch, c.key, op.Hits, exp)
		}
		ops = append(ops, c)
	}
	batch.Send()
	var first error
	for i := range ops {
		if err := s.finishCount(ctx, &ops[i], &b.Ops[i], b.Now, &b.Results[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// finishCount waits for the first command of an op of doCounts and
// completes the op.
func (s *Store) finishCount(ctx context.Context, c *counting, op *limiter.Op, now time.Time, res *limiter.Result) error {
	err := c.err
	var n uint64
	if err == nil {
		n, err = s.client.Wait(ctx, c.call)
	}
	endSpan(c.span, err)
	if c.incrFirst {
		s.countIncr(err)
	} else {
		s.countAdd(err)
		n = op.Hits
	}
	switch {
	case err == nil:
		s.gotAnswer(c.key)
		s.written.add(c.key, limiter.FixedWindowEnd(now, op.Window).Unix(), now.Unix())
		s.counted(ctx, c.key, op, now, n, res)
		return nil
	case c.incrFirst && errors.Is(err, mcclient.ErrCacheMiss), !c.incrFirst && errors.Is(err, mcclient.ErrNotStored):
		s.gotAnswer(c.key)
		_, err = s.countFrom(ctx, c.key, op, now, res, !c.incrFirst)
		return err
	default:
		return s.fail(c.key, err)
	}
}
