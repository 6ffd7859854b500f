package memcached

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"
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

// increment is the client's Increment, counted.
func (s *Store) increment(ctx context.Context, key string, delta uint64) (uint64, error) {
	span := s.startSpan(ctx, cmdIncr)
	v, err := s.client.Increment(key, delta)
	endSpan(span, err)
	switch {
	case err == nil:
		s.opCounts.incrOK.Add(1)
	case errors.Is(err, memcache.ErrCacheMiss):
		s.opCounts.incrMiss.Add(1)
	default:
		s.opCounts.incrErr.Add(1)
	}
	return v, err
}

// add is the client's Add, counted.
func (s *Store) add(ctx context.Context, item *memcache.Item) error {
	span := s.startSpan(ctx, cmdAdd)
	err := s.client.Add(item)
	endSpan(span, err)
	switch {
	case err == nil:
		s.opCounts.addOK.Add(1)
	case errors.Is(err, memcache.ErrNotStored):
		s.opCounts.addNotStored.Add(1)
	default:
		s.opCounts.addErr.Add(1)
	}
	return err
}

// get is the client's Get, counted as a multi-get of one key: a miss is
// a successful read that found nothing.
func (s *Store) get(ctx context.Context, key string) (*memcache.Item, error) {
	span := s.startSpan(ctx, cmdGets)
	it, err := s.client.Get(key)
	endSpan(span, err)
	s.opCounts.keys.Add(1)
	switch {
	case err == nil:
		s.opCounts.getOK.Add(1)
		s.opCounts.found.Add(1)
	case errors.Is(err, memcache.ErrCacheMiss):
		s.opCounts.getOK.Add(1)
	default:
		s.opCounts.getErr.Add(1)
	}
	return it, err
}

// compareAndSwap is the client's CompareAndSwap (not counted: the anchor
// sends no cas).
func (s *Store) compareAndSwap(ctx context.Context, item *memcache.Item) error {
	span := s.startSpan(ctx, cmdCAS)
	err := s.client.CompareAndSwap(item)
	endSpan(span, err)
	return err
}

// decrement is the client's Decrement (not counted: the anchor sends no
// decr).
func (s *Store) decrement(ctx context.Context, key string, delta uint64) error {
	span := s.startSpan(ctx, cmdDecr)
	_, err := s.client.Decrement(key, delta)
	endSpan(span, err)
	return err
}
