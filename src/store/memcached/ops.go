package memcached

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// undo is what it takes to take back one op that recorded hits, for an
// AllOrNothing batch that was refused.
type undo struct {
	op  *limiter.Op // nil: the op recorded nothing
	key string      // the item's key (see itemKey)
	// now is the op's time, for the expiration of the state written back.
	now time.Time
	// a and b locate the hits: the window start they went into (sliding
	// window; a fixed window in a list's item, whose b is 1 when the
	// count saturated), the time they were logged at (sliding log), or
	// the TAT before and after them (token bucket).
	a, b int64
	// list, for the ops of a list of limits kept in one item (key), has
	// the undo of each op, in the order of the ops: op nil for one that
	// recorded nothing (see list.go).
	list []undo
}

// apply applies op at now and fills *r with the pure function's result. It
// returns the undo of the op when it recorded hits.
func (s *Store) apply(ctx context.Context, op *limiter.Op, now time.Time, r *limiter.Result) (undo, error) {
	key := itemKey(op.Key)
	if op.Algorithm.Continuous() {
		return s.applyState(ctx, key, op, now, r)
	}
	return s.applyCount(ctx, key, op, now, r)
}

// applyCount applies a fixed-window op: a hit with incr or add (count), a
// refund with decr, a read with get. (A function of its own, so that its
// locals are not on the stack of every op: a goroutine of fanout starts
// with a small stack, and each time it grows it is copied.)
func (s *Store) applyCount(ctx context.Context, key string, op *limiter.Op, now time.Time, r *limiter.Result) (undo, error) {
	switch {
	case op.Refund && op.Hits > 0:
		return undo{}, s.refundCount(ctx, key, op, now, r)
	case op.Hits == 0:
		count, err := s.readCount(ctx, key)
		if err == nil {
			_, *r = limiter.FixedWindow(limiter.FixedWindowState{Count: count}, now, *op)
		}
		return undo{}, err
	}
	return s.count(ctx, &counting{key: key, incr: s.written.has(key, now.Unix())}, op, now, r)
}

// refundCount gives back a fixed window's hits (limiter.Op.Refund) with
// decr, one atomic command that stops at 0, keeps the item's expiration
// and never makes an item: a key never hit has nothing to give back. *r
// is the read of the count decr leaves (saturated at satMark and above, as
// readCount reads it); a saturated count stays far above any limit (2^31
// refunds of the most hits would bring it down to 2^32).
func (s *Store) refundCount(ctx context.Context, key string, op *limiter.Op, now time.Time, r *limiter.Result) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	after, err := s.decrement(ctx, key, op.Hits)
	if err != nil && !errors.Is(err, mcclient.ErrCacheMiss) {
		return s.fail(key, err)
	}
	s.gotAnswer(key)
	if after >= satMark {
		after = math.MaxUint64
	}
	read := *op
	read.Hits = 0 // a refund of nothing: the read of the count, allowed
	_, *r = limiter.FixedWindow(limiter.FixedWindowState{Count: after}, now, read)
	return nil
}

// errMissing is the cause of a fixed-window op whose incr missed the item
// that add found there, at every attempt. It names no key or server: a
// caller is told it (limiter.Reason).
var errMissing error = limiter.Reason("incr missed the item add found, at every attempt")

// The marks of a fixed-window count (see the package doc): a count at or
// above satMark is saturated, and one that passes pinMark is set back to
// satMark.
const (
	satMark = 1 << 63
	pinMark = satMark + 1<<62
)

// counted fills *r for a fixed-window op after which memcached holds the
// count after (incr's answer; op.Hits for add), keeps the count within its
// range, and returns the op's undo.
//
// incr is atomic and answers the count with the op's own hits in it, so
// after < op.Hits means exactly that the count wrapped past 2^64 (a decr
// cannot come in between: a concurrent undo that took the count down
// shows as a smaller after, never below op.Hits). The op is then over any
// limit, and the count is raised back to satMark plus what was added since
// the wrap: one incr of satMark - after, which commutes with every other
// incr and decr and keeps the item's expiration.
//
// A saturated op has no undo: taking its hits back from a count that was
// pinned meanwhile would bring it below satMark.
func (s *Store) counted(ctx context.Context, key string, op *limiter.Op, now time.Time, after uint64, r *limiter.Result) undo {
	switch {
	case after < op.Hits:
		*r = saturated(math.MaxUint64, now, op)
		// Best effort, as pin: the op's answer is right either way; an
		// error that means an outage is recorded by fail.
		if s.checkDeadline(ctx) == nil {
			if _, err := s.increment(ctx, key, satMark-after); err != nil {
				_ = s.fail(key, err)
			} else {
				s.gotAnswer(key)
			}
		}
		return undo{}
	case after >= satMark:
		before := after - op.Hits
		if before >= satMark {
			before = math.MaxUint64
		}
		*r = saturated(before, now, op)
		if after >= pinMark {
			s.pin(ctx, key, op)
		}
		return undo{}
	}
	_, *r = limiter.FixedWindow(limiter.FixedWindowState{Count: after - op.Hits}, now, *op)
	return undo{op: op, key: key, now: now}
}

// saturated is the result of a fixed-window op that took the count to
// saturation from before: After is the largest count, over any limit.
func saturated(before uint64, now time.Time, op *limiter.Op) limiter.Result {
	_, r := limiter.FixedWindow(limiter.FixedWindowState{Count: before}, now, *op)
	r.After, r.Allowed, r.Remaining = math.MaxUint64, false, 0
	return r
}

// pin sets a count that passed pinMark back to satMark: gets, then cas,
// from the start again on a conflict, until the count is below pinMark
// (another op pinned it), ctx ends or maxAttempts cycles conflicted. It
// is best effort: a count left above pinMark is still saturated, and the
// next op past the mark pins it. The
// expiration is set again to a whole window, as add does, so that the key
// lives at least as long as it would have (memcached does not tell an
// item's expiration), and at most one window longer.
func (s *Store) pin(ctx context.Context, key string, op *limiter.Op) {
	for range maxAttempts {
		if s.check(ctx) != nil {
			return
		}
		it, err := s.get(ctx, key)
		if err != nil {
			if errors.Is(err, mcclient.ErrCacheMiss) {
				s.gotAnswer(key)
			} else {
				_ = s.fail(key, err)
			}
			return
		}
		s.gotAnswer(key)
		n, err := parseCount(it.Value)
		if err != nil || n < pinMark {
			return
		}
		if s.check(ctx) != nil {
			return
		}
		it.Value = strconv.AppendUint(it.Value[:0], satMark, 10)
		it.Expiration = s.expiration(max(int64(op.Window/time.Second), 1))
		switch err := s.compareAndSwap(ctx, it); {
		case err == nil:
			s.gotAnswer(key)
			return
		case conflict(err):
			s.gotAnswer(key)
		default:
			_ = s.fail(key, err)
			return
		}
	}
}

// parseCount reads a counter as memcached stores it. decr may leave the
// number padded with spaces (memcached rewrites it in place when it gets
// shorter).
func parseCount(value []byte) (uint64, error) {
	return strconv.ParseUint(string(bytes.TrimRight(value, " ")), 10, 64)
}

// readCount returns a fixed window's count (math.MaxUint64 once saturated);
// a missing key counts 0.
func (s *Store) readCount(ctx context.Context, key string) (uint64, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	it, err := s.get(ctx, key)
	if errors.Is(err, mcclient.ErrCacheMiss) {
		s.gotAnswer(key)
		return 0, nil
	}
	if err != nil {
		return 0, s.fail(key, err)
	}
	s.gotAnswer(key)
	n, err := parseCount(it.Value)
	if err != nil {
		return 0, dataError(key, fmt.Errorf("not a counter: %q", it.Value))
	}
	if n >= satMark {
		return math.MaxUint64, nil
	}
	return n, nil
}

// applyState applies an op of a continuous algorithm: gets, the pure
// function, and when the op records hits, cas (add for a new key), from
// the start again when another op changed the item in between (see
// update).
func (s *Store) applyState(ctx context.Context, key string, op *limiter.Op, now time.Time, r *limiter.Result) (undo, error) {
	var u undo
	wrote, err := s.update(ctx, key, now, forRequest, func(it *cacheItem) ([]byte, int64, error) {
		var data, dst []byte
		if it != nil {
			data = it.Value
			dst = it.Value[:0] // the state is parsed before this is written
		}
		// value is nil when there is nothing to record.
		value, idle, mark, err := step(dst, op, now, data, it != nil, r)
		u = mark
		return value, idle, err
	})
	if err != nil || !wrote {
		return undo{}, err
	}
	u.op, u.key, u.now = op, key, now
	return u, nil
}

// maxAttempts bounds the optimistic cycles (gets, then cas or add) that
// one update makes on one item. This instance's updates of an item take
// turns (see itemLocks), so a cycle conflicts only with other instances'
// updates, and each conflict means that one of those got through; with
// the jittered backoff between cycles (see backoff), the instances of a
// fleet hammering one key get through well within it (TestListContention
// runs two instances of 16 goroutines each on one list: exact). A Do that
// runs out of cycles fails with limiter.ErrOverloaded: memcached
// answered, the key is only busier than optimistic updates can follow, so
// the store stays healthy, and the request's connection slot is freed
// long before its deadline instead of being held by a loop.
const maxAttempts = 32

// Backoff between the cycles of an update: a random time below
// backoffBase << (cycles - 1), at most backoffMax.
const (
	backoffBase = 50 * time.Microsecond
	backoffMax  = 2 * time.Millisecond
)

// purpose says why update runs: for the request, or to take back the hits
// of a refused AllOrNothing batch (which goes on when the request is
// canceled, until its deadline: see undo).
type purpose uint8

const (
	forRequest purpose = iota
	takingBack
)

// errContended is the cause of an update that ran out of cycles; a
// caller is told it (limiter.Reason).
var errContended error = limiter.Reason("item changed by others at every attempt")

// update changes the item of key optimistically: gets, f on the item (nil
// when there is none), then, when f returns a value, cas (add for a new
// item) with an expiration that lasts until idle (Unix µs, see
// secondsUntil from now); from the start again, after a backoff, when
// another op changed, created or removed the item in between, at most
// maxAttempts times. f fills the op's results from the item it is given,
// so those of the last cycle stand; it returns a nil value when there is
// nothing to write, and an error for an item it cannot read (then update
// fails with ErrData). Every round trip is checked first (check; for a
// take-back checkDeadline). wrote reports whether f's value was stored.
//
// The update first waits for its turn among this instance's updates of
// key (see itemLocks), at most until ctx ends (a take-back: until its
// deadline); one that waited until the deadline was shed (ErrOverloaded),
// as a Do that waited for a connection slot.
func (s *Store) update(ctx context.Context, key string, now time.Time, purpose purpose,
	f func(it *cacheItem) (value []byte, idle int64, err error)) (wrote bool, err error) {
	check, lockCtx := s.check, ctx
	if purpose == takingBack {
		check = s.checkDeadline
		// Wait for the lock past a cancellation, until the deadline.
		lockCtx = context.WithoutCancel(ctx)
		if d, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			lockCtx, cancel = context.WithDeadline(lockCtx, d)
			defer cancel()
		}
	}
	c, err := s.locks.lock(lockCtx, s.ctx.Done(), key)
	if errors.Is(err, context.DeadlineExceeded) {
		// As waiting for a connection (acquire): the key is busier
		// than its updates can follow each other.
		s.shed.Add(1)
		return false, fmt.Errorf("memcached: key %q: %w: the updates of the item before it took until the request's deadline",
			key, limiter.ErrOverloaded)
	}
	if err != nil {
		return false, unavailable(err)
	}
	defer unlock(c)
	for attempt := range maxAttempts {
		if attempt > 0 {
			s.backoff(lockCtx, attempt)
		}
		if err := check(ctx); err != nil {
			return false, err
		}
		it, err := s.get(ctx, key)
		if err != nil && !errors.Is(err, mcclient.ErrCacheMiss) {
			return false, s.fail(key, err)
		}
		s.gotAnswer(key)
		found := err == nil
		if !found {
			it = nil
		}
		value, idle, err := f(it)
		if err != nil {
			return false, dataError(key, err)
		}
		if value == nil { // nothing to write
			return false, nil
		}
		if err := check(ctx); err != nil {
			return false, err
		}
		exp := s.expiration(secondsUntil(idle, now))
		if s.beforeWrite != nil {
			s.beforeWrite(key)
		}
		if found {
			it.Value, it.Expiration = value, exp
			err = s.compareAndSwap(ctx, it)
		} else {
			err = s.add(ctx, &cacheItem{Key: key, Value: value, Expiration: exp})
		}
		switch {
		case err == nil:
			s.gotAnswer(key)
			return true, nil
		case conflict(err):
			s.gotAnswer(key)
		default:
			return false, s.fail(key, err)
		}
	}
	s.shed.Add(1)
	return false, fmt.Errorf("memcached: key %q: %w: %w after %d attempts", key, limiter.ErrOverloaded, errContended, maxAttempts)
}

// backoff waits a random time below backoffBase << (attempt-1), at most
// backoffMax, or until ctx ends (the next check then stops the update):
// contenders that conflicted spread out instead of meeting again at once.
func (s *Store) backoff(ctx context.Context, attempt int) {
	d := backoffMax
	if attempt <= 6 {
		d = min(backoffBase<<(attempt-1), backoffMax)
	}
	t := time.NewTimer(rand.N(d) + 1)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-s.ctx.Done():
	}
}

// conflict reports whether a cas or add failed because another op changed,
// created or removed the item since it was read: the op starts again.
func conflict(err error) bool {
	return errors.Is(err, mcclient.ErrExists) || errors.Is(err, mcclient.ErrNotStored) ||
		errors.Is(err, mcclient.ErrCacheMiss)
}

// step runs op's pure function on the state encoded in data (a new key
// when !found), fills *r, and, when the op records hits, returns the new
// state's encoding (appended to dst), when it goes idle (Unix µs) and the
// values its undo needs. value is nil when nothing is to be written: a
// read, or a refused op (the continuous algorithms do not record those).
func step(dst []byte, op *limiter.Op, now time.Time, data []byte, found bool, r *limiter.Result) (value []byte, idle int64, u undo, err error) {
	if op.Refund {
		value, idle, err = refundStep(dst, op, now, data, found, r)
		return value, idle, undo{}, err
	}
	switch op.Algorithm {
	case rules.SlidingWindow:
		var st limiter.SlidingWindowState
		if found {
			if st, err = parseSlidingWindowState(data); err != nil {
				return nil, 0, undo{}, err
			}
		}
		st, *r = limiter.SlidingWindow(st, now, *op)
		if !records(op, r) {
			return nil, 0, undo{}, nil
		}
		return appendSlidingWindowState(dst, st), st.IdleAt(op.Window), undo{a: st.Start}, nil
	case rules.SlidingLog:
		var st limiter.SlidingLogState
		if found {
			if st, err = parseSlidingLogState(data); err != nil {
				return nil, 0, undo{}, err
			}
		}
		st, *r = limiter.SlidingLog(st, now, *op)
		if !records(op, r) {
			return nil, 0, undo{}, nil
		}
		t, _ := st.Newest() // the time SlidingLog logged the hits at
		return appendSlidingLogState(dst, st), st.IdleAt(op.Window), undo{a: t}, nil
	default: // token bucket
		var st limiter.TokenBucketState
		if found {
			if st, err = parseTokenBucketState(data); err != nil {
				return nil, 0, undo{}, err
			}
		}
		before := st.TAT
		st, *r = limiter.TokenBucket(st, now, *op)
		if !records(op, r) {
			return nil, 0, undo{}, nil
		}
		return appendTokenBucketState(dst, st), st.IdleAt(), undo{a: before, b: st.TAT}, nil
	}
}

// refundStep is step for a refund (limiter.Op.Refund): it returns a value
// only when the refund gave hits back, so that a key never hit stays
// absent and one with nothing left to give back is not written. was is
// the state as a read leaves it (a sliding window rolled, a log's old
// hits dropped); a refund only ever takes from it.
func refundStep(dst []byte, op *limiter.Op, now time.Time, data []byte, found bool, r *limiter.Result) (value []byte, idle int64, err error) {
	read := *op
	read.Hits = 0 // still a refund: a read, allowed
	switch op.Algorithm {
	case rules.SlidingWindow:
		var st limiter.SlidingWindowState
		if found {
			if st, err = parseSlidingWindowState(data); err != nil {
				return nil, 0, err
			}
		}
		was, _ := limiter.SlidingWindow(st, now, read)
		if st, *r = limiter.SlidingWindow(st, now, *op); !found || st == was {
			return nil, 0, nil
		}
		return appendSlidingWindowState(dst, st), st.IdleAt(op.Window), nil
	case rules.SlidingLog:
		var st limiter.SlidingLogState
		if found {
			if st, err = parseSlidingLogState(data); err != nil {
				return nil, 0, err
			}
		}
		// A read changes the ring's head and length, never its times.
		was, _ := limiter.SlidingLog(st, now, read)
		if st, *r = limiter.SlidingLog(st, now, *op); !found || st.Len() == was.Len() {
			return nil, 0, nil
		}
		return appendSlidingLogState(dst, st), st.IdleAt(op.Window), nil
	default: // token bucket
		var st limiter.TokenBucketState
		if found {
			if st, err = parseTokenBucketState(data); err != nil {
				return nil, 0, err
			}
		}
		was := st
		if st, *r = limiter.TokenBucket(st, now, *op); !found || st == was {
			return nil, 0, nil
		}
		return appendTokenBucketState(dst, st), st.IdleAt(), nil
	}
}

// records reports whether a continuous algorithm's op changed its state.
func records(op *limiter.Op, r *limiter.Result) bool { return op.Hits > 0 && r.Allowed }

// undo takes back one recorded op with its inverse, which commutes with
// the ops of other requests made since: decr for a fixed window; for the
// others a cas loop that takes the hits out of the state where they still
// are. A key gone meanwhile (expired, evicted) has nothing to take back.
// It goes on when the request is canceled, so that hits of a refused batch
// do not stay recorded, but starts no round trip after ctx's deadline or
// once the store is closed (see checkDeadline): then the hits stay
// counted, which refuses too much, never too little.
func (s *Store) undo(ctx context.Context, u *undo) error {
	switch {
	case u.list != nil:
		return s.undoList(ctx, u)
	case u.op == nil: // recorded nothing
		return nil
	}
	op := u.op
	if !op.Algorithm.Continuous() {
		if err := s.checkDeadline(ctx); err != nil {
			return err
		}
		_, err := s.decrement(ctx, u.key, op.Hits)
		if err == nil || errors.Is(err, mcclient.ErrCacheMiss) {
			s.gotAnswer(u.key)
			return nil
		}
		return s.fail(u.key, err)
	}
	_, err := s.update(ctx, u.key, u.now, takingBack, func(it *cacheItem) ([]byte, int64, error) {
		if it == nil { // expired or evicted: nothing to take back
			return nil, 0, nil
		}
		// value is nil when the hits are no longer in the state.
		return takeBack(it.Value[:0], u, it.Value)
	})
	return err
}

// takeBack removes u's hits from the state encoded in data, by the rules
// of src/limiter/takeback.go (the TakeBack functions of the limiter's
// states), and returns the new encoding (appended to dst) and when it goes
// idle, or a nil value when the hits are no longer in the state.
func takeBack(dst []byte, u *undo, data []byte) (value []byte, idle int64, err error) {
	op := u.op
	switch op.Algorithm {
	case rules.SlidingWindow:
		// u.a is the start of the window the hits went into.
		st, err := parseSlidingWindowState(data)
		if err != nil {
			return nil, 0, err
		}
		back := st.TakeBack(u.a, op.Window, op.Hits)
		if back == st {
			return nil, 0, nil
		}
		return appendSlidingWindowState(dst, back), back.IdleAt(op.Window), nil
	case rules.SlidingLog:
		// u.a is the time the hits were logged at.
		st, err := parseSlidingLogState(data)
		if err != nil {
			return nil, 0, err
		}
		if st.TakeBack(u.a, op.Hits) == 0 {
			return nil, 0, nil
		}
		return appendSlidingLogState(dst, st), st.IdleAt(op.Window), nil
	default: // token bucket: u.a is the TAT before the op, u.b after it
		st, err := parseTokenBucketState(data)
		if err != nil {
			return nil, 0, err
		}
		back := st.TakeBack(u.a, u.b, *op)
		if back == st {
			return nil, 0, nil
		}
		return appendTokenBucketState(dst, back), back.IdleAt(), nil
	}
}

// secondsUntil is the whole seconds, rounded up, from now until idle (Unix
// µs); 0 or less when idle has passed.
func secondsUntil(idle int64, now time.Time) int64 {
	d := idle - now.UnixMicro()
	if idle < 0 && d > 0 { // idle - now overflowed: idle is long past
		return 0
	}
	if d <= 0 {
		return 0
	}
	return (d-1)/1_000_000 + 1
}

// maxRelativeExpiration is the largest expiration memcached reads as
// seconds from now; above it, an expiration is a Unix time.
const maxRelativeExpiration = 30 * 24 * 60 * 60

// expiration is an item's expiration for a state that lasts seconds: at
// least 1, plus one second because memcached's clock ticks in whole seconds
// (an item given n seconds may go up to a second early), plus a random
// jitter in [0, ExpirationJitterMax) as the Redis store's TTLs; beyond 30
// days, the Unix time (on this instance's clock, which is the servers' for
// practical purposes) that many seconds from now.
func (s *Store) expiration(seconds int64) int32 {
	seconds = max(seconds, 1) + 1
	if j := int64(s.cfg.ExpirationJitterMax / time.Second); j > 0 {
		seconds += rand.Int64N(j)
	}
	if seconds <= maxRelativeExpiration {
		return int32(seconds)
	}
	seconds = min(seconds, math.MaxInt32)
	return int32(min(time.Now().Unix()+seconds, math.MaxInt32))
}

// gotAnswer counts a round trip that memcached answered for key and, the
// first time, marks it up; the run of failures of key's server ends; a
// breaker closed since the last answer is told (breakerClosed).
func (s *Store) gotAnswer(key string) {
	s.roundTrips.Add(1)
	s.breakerFor(key).Success()
	if !s.started.Load() {
		s.markUp()
		return
	}
	s.breakerClosed()
}

// breakerClosed calls Config.Answered when a breaker closed since it was
// last called for one: Healthy counts open breakers, and the first answer
// (markUp) may have come while one was open. A request admitted since then
// had its breaker closed; telling the caller before that request's answer
// keeps health in step with what the store serves.
func (s *Store) breakerClosed() {
	if s.breakers.ClosedSince(&s.toldCloses) && s.cfg.Answered != nil && s.started.Load() {
		s.cfg.Answered()
	}
}

// fail classifies an error of the memcached client. Memcached refusing
// the data of an op (see refusedData) is an answer: the error wraps
// limiter.ErrData, and neither health nor the connections are touched, so
// that one poisoned key fails only the requests that use it. Memcached
// refusing to store for lack of memory (see outOfMemory) is an answer
// too, about that write: the error wraps limiter.ErrOverloaded and is
// counted in Shed. A full queue to the server wraps limiter.ErrOverloaded
// and is counted in Shed. A request whose own deadline passed, or whose
// caller canceled it, while it waited (for a dial, or for its answer), and
// Close, wrap limiter.ErrUnavailable and say nothing about memcached:
// under load this process may be what is late. Everything else means
// memcached cannot serve in time: the error wraps limiter.ErrUnavailable,
// Healthy turns false until the next probe succeeds, and it counts as a
// failure of key's server for its circuit breaker, as on Redis: a dial
// that failed (and the requests that fail at once during its back-off),
// other SERVER_ERRORs, no servers. A broken connection (an answer missing
// past Timeout, from the write, a read or write error) has counted its
// requests already (breakConn), those whose callers gave up included.
func (s *Store) fail(key string, err error) error {
	switch {
	case refusedData(err):
		s.gotAnswer(key)
		return dataError(key, err)
	case outOfMemory(err):
		s.gotAnswer(key)
		s.shed.Add(1)
		return fmt.Errorf("memcached: key %q: %w: %w: %w", key, limiter.ErrOverloaded, limiter.ReasonOutOfMemory, err)
	case errors.Is(err, mcclient.ErrQueueFull):
		s.shed.Add(1)
		return fmt.Errorf("memcached: %w: %w", limiter.ErrOverloaded, err)
	case errors.Is(err, mcclient.ErrGaveUp), errors.Is(err, context.Canceled), errors.Is(err, mcclient.ErrClientClosed):
		return unavailable(err)
	case errors.Is(err, mcclient.ErrBroken):
		s.up.Store(false)
		return unavailable(err)
	}
	s.up.Store(false)
	s.breakerFor(key).Failure()
	return unavailable(err)
}

// breakConn is the client's clientConfig.Broken: a connection to addr
// broke because memcached failed, failing requests, each a failure of
// addr for its circuit breaker.
func (s *Store) breakConn(addr string, requests int) {
	s.up.Store(false)
	if b := s.breakers.Server(addr); b != nil {
		for range requests {
			b.Failure()
		}
	}
}

// refusedData reports whether memcached refused an op for its data: a key
// it cannot take (never sent), CLIENT_ERROR (incr or decr on a value that
// is not a 64-bit decimal number: "cannot increment or decrement
// non-numeric value"), or a value too large for an item.
func refusedData(err error) bool {
	var ce *mcclient.ClientError
	var se *mcclient.ServerError
	return errors.Is(err, mcclient.ErrMalformedKey) || errors.As(err, &ce) ||
		errors.As(err, &se) && strings.HasPrefix(se.Msg, "object too large")
}

// outOfMemory reports whether err is memcached refusing to store an item
// for lack of memory ("SERVER_ERROR out of memory storing object": run
// with -M, or nothing it may evict). It is an answer about that write,
// not an outage (issue 24): memcached serves the reads and the writes it
// has room for, so it neither trips a breaker nor marks memcached down;
// the request fails with ResourceExhausted, never OK.
func outOfMemory(err error) bool {
	var se *mcclient.ServerError
	return errors.As(err, &se) && strings.HasPrefix(se.Msg, "out of memory")
}

// dataError wraps an error about the data of key: memcached refused it, or
// its item is not a state this store wrote.
func dataError(key string, err error) error {
	return fmt.Errorf("memcached: key %q: %w: %w", key, limiter.ErrData, err)
}

// Key substitution: memcached refuses keys over 250 bytes or with
// whitespace or control characters. Those keys are stored under a stable
// substitute: the first keyHead bytes with the bad characters turned into
// '_', then "#sha256:" and the hex SHA-256 of the whole key.
const keyHead = 100

// itemKey is the memcached key of a limiter key: key itself when memcached
// takes it, else its substitute.
func itemKey(key string) string {
	if mcclient.LegalKey(key) {
		return key
	}
	return substituteKey(key)
}

func substituteKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	head := key[:min(len(key), keyHead)]
	b := make([]byte, 0, len(head)+len("#sha256:")+2*len(sum))
	for i := 0; i < len(head); i++ {
		c := head[i]
		if c <= ' ' || c == 0x7f {
			c = '_'
		}
		b = append(b, c)
	}
	b = append(b, "#sha256:"...)
	b = hex.AppendEncode(b, sum[:])
	return string(b)
}
