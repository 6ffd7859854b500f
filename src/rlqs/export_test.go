package rlqs

import "time"

// SetStateHook runs f between the chunks of State's walk of the pools.
func (q *Service) SetStateHook(f func()) { q.stateHook = f }

// StateChunk is how many pools State reads per hold of the lock.
const StateChunk = stateChunk

// OpenFrom starts a session as a client at addr would.
func (q *Service) OpenFrom(addr string) (*Session, error) {
	st, err := q.open(addr)
	if err != nil {
		return nil, err
	}
	return &Session{q: q, st: st}, nil
}

// Hold is how long the session's next report waits for its client's
// report budget.
func (s *Session) Hold() time.Duration { return s.st.hold }

// SetShareTick sets how many pools a tick exchanges with the store per
// round trip, and for how long it starts new ones.
func (q *Service) SetShareTick(chunk int, budget time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.share.chunk, q.share.budget = chunk, budget
}
