package rlqs

// SetStateHook runs f between the chunks of State's walk of the pools.
func (q *Service) SetStateHook(f func()) { q.stateHook = f }

// StateChunk is how many pools State reads per hold of the lock.
const StateChunk = stateChunk
