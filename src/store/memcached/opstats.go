package memcached

import (
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

// increment is the client's Increment, counted.
func (s *Store) increment(key string, delta uint64) (uint64, error) {
	v, err := s.client.Increment(key, delta)
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
func (s *Store) add(item *memcache.Item) error {
	err := s.client.Add(item)
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
func (s *Store) get(key string) (*memcache.Item, error) {
	it, err := s.client.Get(key)
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
