package harness

import (
	"sync"
	"sync/atomic"
)

// HealthTold records what a store's health was each time the store called
// its Answered hook: a test gives Answered as the hook, Watch the store's
// Healthy once the store is made, and reads what was told since a Mark.
// It is safe for concurrent use.
type HealthTold struct {
	healthy atomic.Pointer[func() bool]
	mu      sync.Mutex
	told    []bool
}

// Watch sets the health read at each call of Answered; calls before it
// record nothing.
func (h *HealthTold) Watch(healthy func() bool) { h.healthy.Store(&healthy) }

// Answered is the store's hook.
func (h *HealthTold) Answered() {
	f := h.healthy.Load()
	if f == nil {
		return
	}
	ok := (*f)()
	h.mu.Lock()
	h.told = append(h.told, ok)
	h.mu.Unlock()
}

// Mark returns a mark for Since: the calls so far.
func (h *HealthTold) Mark() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.told)
}

// Since returns the health told at each call since mark.
func (h *HealthTold) Since(mark int) []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bool(nil), h.told[mark:]...)
}
