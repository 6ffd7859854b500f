package quota

import (
	"slices"
	"time"
)

// LeaveIf records, as Leave does, that every live subscriber for which
// gone is true has gone (a replica sharing the pool saw its stream's
// replica die), and returns the grants that change.
func (p *Pool) LeaveIf(now time.Time, gone func(id uint64) bool) []Change {
	var ids []uint64
	for id, s := range p.subs {
		if !s.gone && !s.abandoned && gone(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	var changes []Change
	for _, id := range ids {
		changes = append(changes, p.Leave(now, id)...)
	}
	return changes
}
