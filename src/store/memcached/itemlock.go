package memcached

import (
	"context"
	"hash/maphash"
)

// itemLockStripes is the number of locks the updates of one Store share,
// by their key's hash. More stripes than Config.MaxConns (the most Do calls
// under way) would rarely make unrelated keys wait for each other.
const itemLockStripes = 256

// itemLocks serialises this instance's updates (gets, then cas) of one
// item: without them, the instance's own requests on a hot key conflict
// with each other, and under 32-way concurrency on one key most of their
// round trips are wasted cas conflicts, until some run out of attempts
// (see maxAttempts). With them, the cycles of one instance follow each
// other, each succeeding unless another instance changed the item, and a
// request waits for its turn, at most until its deadline. Keys that share
// a stripe wait for each other too: a cycle is two round trips.
type itemLocks struct {
	seed  maphash.Seed
	locks [itemLockStripes]chan struct{}
}

func newItemLocks() *itemLocks {
	l := &itemLocks{seed: maphash.MakeSeed()}
	for i := range l.locks {
		l.locks[i] = make(chan struct{}, 1)
	}
	return l
}

// lock takes key's lock, waiting at most until ctx or done ends, and
// returns it, for unlock; or ctx's error (errClosed when done ended first).
func (l *itemLocks) lock(ctx context.Context, done <-chan struct{}, key string) (chan struct{}, error) {
	c := l.locks[maphash.String(l.seed, key)%itemLockStripes]
	select {
	case c <- struct{}{}:
		return c, nil
	default:
	}
	select {
	case c <- struct{}{}:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-done:
		return nil, errClosed
	}
}

// unlock releases a lock that lock returned.
func unlock(c chan struct{}) { <-c }
