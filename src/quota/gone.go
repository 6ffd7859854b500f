package quota

import (
	"slices"
	"time"
)

// LeaveIf records, as Leave does, that every live subscriber for which
// gone is true has gone (a replica sharing the pool saw its stream's
// replica die), and returns the grants that change. Their Envoys open
// streams to another replica at their next report, as subscribers whose
// first report covers time (a reconnect): each such reconnect, before or
// after this call, ends one of these leases early (see shorten). One that
// reports again on its own stream was not gone (its replica stalled), and
// Report counts it again.
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
		if s := p.subs[id]; s != nil {
			s.pending = true
		}
	}
	for _, k := range p.order() {
		if s := p.subs[k]; !s.gone && !s.abandoned && s.pending && p.shorten(now) {
			s.pending = false
		}
	}
	return changes
}

// shorten ends, Settle from now, the lease of the subscriber LeaveIf took
// as gone with the smallest share in force that no reconnect has ended
// yet, for a reconnect whose first grant is sent now: it reports whether
// there was one. Which Envoy reconnected is not known (Envoy sends no
// identity), and need not be: the old grants that may be in force are
// those of the Envoys that have not reconnected (or did less than Settle
// ago), any set of which adds up to at most as much as the same number of
// the largest leases, which are the ones still counted. A subscriber that
// claims a reconnect without being one (a client that reports a new
// bucket with time_elapsed > 0, or an Envoy whose own stream broke then)
// ends one lease whose grant may be in force: docs/RLQS.md's bound names
// that term.
func (p *Pool) shorten(now time.Time) bool {
	var pick *sub
	var least float64
	for _, k := range p.order() {
		s := p.subs[k]
		if !s.gone || !s.pending || !now.Before(s.leaseUntil) {
			continue
		}
		if r, _ := s.committed(now); pick == nil || r < least {
			pick, least = s, r
		}
	}
	if pick == nil {
		return false
	}
	pick.pending = false
	if end := now.Add(p.cfg.Settle); end.Before(pick.leaseUntil) {
		pick.leaseUntil, p.wake = end, end
	}
	return true
}
