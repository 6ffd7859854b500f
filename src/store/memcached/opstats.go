package memcached

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// OpStats counts the store's memcached commands by outcome, as the
// anchor's memcache statistics do (ratelimit.memcache.increment and add
// with a "code" tag, multiget, keys_requested, keys_found). The anchor
// reads a request's keys with one multi-get; this store reads a key with
// get when it needs its state, so each get counts as a multi-get of one
// key.
type OpStats struct {
	IncrementSuccess, IncrementMiss, IncrementError uint64
	AddSuccess, AddNotStored, AddError              uint64
	MultiGetSuccess, MultiGetError                  uint64
	KeysRequested, KeysFound                        uint64
}

// opCounts is what the commands count into.
type opCounts struct {
	incrOK, incrMiss, incrErr   atomic.Uint64
	addOK, addNotStored, addErr atomic.Uint64
	getOK, getErr               atomic.Uint64
	keys, found                 atomic.Uint64
}

// OpStats returns the commands counted so far.
func (s *Store) OpStats() OpStats {
	c := &s.opCounts
	return OpStats{
		IncrementSuccess: c.incrOK.Load(), IncrementMiss: c.incrMiss.Load(), IncrementError: c.incrErr.Load(),
		AddSuccess: c.addOK.Load(), AddNotStored: c.addNotStored.Load(), AddError: c.addErr.Load(),
		MultiGetSuccess: c.getOK.Load(), MultiGetError: c.getErr.Load(),
		KeysRequested: c.keys.Load(), KeysFound: c.found.Load(),
	}
}

// The wrappers below are every round trip a Do takes: each is counted,
// and traced as a child of the request's span in ctx (see startSpan).

// cacheItem is an item as the store reads and writes it: memcached's key,
// value, expiration (seconds, or a Unix time beyond 30 days) and, once
// read with gets, its cas unique.
type cacheItem struct {
	Key        string
	Value      []byte
	Expiration int32
	CasID      uint64
}

// increment is the client's incr, counted.
func (s *Store) increment(ctx context.Context, key string, delta uint64) (uint64, error) {
	span := s.startSpan(ctx, cmdIncr)
	v, err := s.client.Incr(ctx, key, delta)
	endSpan(span, err)
	s.countIncr(err)
	return v, err
}

// countIncr counts an incr by its outcome.
func (s *Store) countIncr(err error) {
	switch {
	case err == nil:
		s.opCounts.incrOK.Add(1)
	case errors.Is(err, mcclient.ErrCacheMiss):
		s.opCounts.incrMiss.Add(1)
	default:
		s.opCounts.incrErr.Add(1)
	}
}

// add is the client's add, counted.
func (s *Store) add(ctx context.Context, item *cacheItem) error {
	span := s.startSpan(ctx, cmdAdd)
	err := s.client.Add(ctx, item.Key, item.Value, item.Expiration)
	endSpan(span, err)
	s.countAdd(err)
	return err
}

// countAdd counts an add by its outcome.
func (s *Store) countAdd(err error) {
	switch {
	case err == nil:
		s.opCounts.addOK.Add(1)
	case errors.Is(err, mcclient.ErrNotStored):
		s.opCounts.addNotStored.Add(1)
	default:
		s.opCounts.addErr.Add(1)
	}
}

// get is the client's gets, counted as a multi-get of one key: a miss is
// a successful read that found nothing.
func (s *Store) get(ctx context.Context, key string) (*cacheItem, error) {
	span := s.startSpan(ctx, cmdGets)
	var it *cacheItem
	value, casID, err := s.client.Gets(ctx, key)
	if err == nil {
		it = &cacheItem{Key: key, Value: value, CasID: casID}
	}
	endSpan(span, err)
	s.opCounts.keys.Add(1)
	switch {
	case err == nil:
		s.opCounts.getOK.Add(1)
		s.opCounts.found.Add(1)
	case errors.Is(err, mcclient.ErrCacheMiss):
		s.opCounts.getOK.Add(1)
	default:
		s.opCounts.getErr.Add(1)
	}
	return it, err
}

// compareAndSwap is the client's cas (not counted: the anchor sends no
// cas).
func (s *Store) compareAndSwap(ctx context.Context, item *cacheItem) error {
	span := s.startSpan(ctx, cmdCAS)
	err := s.client.CAS(ctx, item.Key, item.Value, item.Expiration, item.CasID)
	endSpan(span, err)
	return err
}

// decrement is the client's decr, which stops at 0, and returns the count
// after it (not counted: the anchor's statistics have no decr).
func (s *Store) decrement(ctx context.Context, key string, delta uint64) (uint64, error) {
	span := s.startSpan(ctx, cmdDecr)
	n, err := s.client.Decr(ctx, key, delta)
	endSpan(span, err)
	return n, err
}
