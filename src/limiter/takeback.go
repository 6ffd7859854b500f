package limiter

import "time"

// Taking back the hits of a refused batch.
//
// An AllOrNothing batch (Batch.AllOrNothing) records nothing when one of
// its ops is refused. A store that can lock every key of the batch (the
// memory store; one Redis script over all the keys) decides all the ops
// first and restores the states it changed: nothing else ran in between.
// A store that cannot (Redis Cluster with keys in several hash slots, a
// sharding proxy, the per-second Redis, Memcached) records the ops it can
// and, once it learns that another op was refused, takes the recorded ones
// back. Other requests may have used the same keys meanwhile, so taking
// back is not restoring a saved state; it follows these rules, one
// TakeBack function per algorithm below, which every store mirrors:
//
//   - Only the op's own hits leave, never those of another request, and
//     nothing is taken back below zero: a take-back may leave a key fuller
//     than before the op (a client is then refused for about a round
//     trip longer), never emptier, so nothing is ever over-admitted.
//   - With no other op on the key since the op, the state is the one the op
//     started from, or one the algorithm cannot tell from it (a sliding
//     window moved on to the op's window, expired log entries dropped).
//   - fixed_window: the count goes down by the op's hits.
//   - sliding_window: the hits went into the window that starts at the
//     op's Start; they leave Curr while that window is current, Prev
//     once the next one is, and nothing once both have passed.
//   - sliding_log: up to the op's hits entries logged at the op's time
//     leave, newest first; the log is sorted, so they are one run.
//   - token_bucket: a TAT still at the op's result goes back to the TAT
//     before the op (exact); one moved by later ops goes back by the op's
//     hits × T only.
//
// The stores record, per op, what the take-back needs: the Redis scripts
// reply it (the undo values of decideLua, used by undoLua), the Memcached
// store keeps it per op; the memory store restores its saved states under
// its locks, which is what these functions give when no op came between.

// TakeBack takes hits back from a fixed window's count.
func (s FixedWindowState) TakeBack(hits uint64) FixedWindowState {
	s.Count -= min(s.Count, hits)
	return s
}

// TakeBack takes back hits that an op recorded in the window starting at
// start (the op's SlidingWindowState.Start after it).
func (s SlidingWindowState) TakeBack(start int64, window time.Duration, hits uint64) SlidingWindowState {
	switch s.Start {
	case start:
		s.Curr -= min(s.Curr, hits)
	case satAddInt(start, windowMicros(window)):
		s.Prev -= min(s.Prev, hits)
	}
	return s
}

// TakeBack removes up to hits entries logged at t (Unix µs, the time the
// op logged its hits at: its newest entry right after the op), newest
// first, leaving the entries logged later, and returns how many it
// removed. It updates the log in place, as SlidingLog does.
func (s *SlidingLogState) TakeBack(t int64, hits uint64) int {
	hi := s.n // entries [lo, hi) are the run logged at t
	for hi > 0 && s.at(hi-1) > t {
		hi--
	}
	lo := hi
	for lo > 0 && uint64(hi-lo) < hits && s.at(lo-1) == t {
		lo--
	}
	removed := hi - lo
	if removed == 0 {
		return 0
	}
	// Move the later entries down over the run.
	for i := hi; i < s.n; i++ {
		s.ring[s.index(i-removed)] = s.at(i)
	}
	s.n -= removed
	return removed
}

// index is the ring index of the i-th logged time, oldest first.
func (s *SlidingLogState) index(i int) int {
	i += s.head
	if i >= len(s.ring) {
		i -= len(s.ring)
	}
	return i
}

// TakeBack takes back an op that moved the bucket's TAT from before to
// after: exactly when the TAT is still after, else by the op's hits × T.
func (s TokenBucketState) TakeBack(before, after int64, op Op) TokenBucketState {
	if s.TAT == after {
		s.TAT = before
		return s
	}
	if op.Limit == 0 {
		return s
	}
	T := ceilDiv(uint64(windowMicros(op.Window)), op.Limit)
	// A TAT is a time after 1970: taking back never passes 0.
	s.TAT -= int64(min(satMul(op.Hits, T), uint64(max(s.TAT, 0))))
	return s
}
