package live

import (
	"cmp"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// Requests that matched nothing are answered OK and counted nowhere in
// the rules' series: a misspelt domain, or a descriptor whose keys no rule
// has, would not show. Two small tables show them: the unknown domains,
// and the key chains of the descriptors of known domains that no rule
// matched, each with the last such descriptor as an example. Each is a
// Space-Saving summary like the top keys' (see sketch), of a fixed number
// of slots allocated at start, with the same decay.
//
// A deployment may send many descriptors that no rule matches on purpose
// (Envoy sends every action of a route; the rules limit some): each table
// records the first unmatchedExact observations of a second one by one,
// and past them one in unmatchedSample, counted unmatchedSample times, so
// that a flood of them costs an atomic load and a random number each.

// Bounds of the tables.
const (
	// MaxUnknownDomains bounds the unknown domains tracked at once.
	MaxUnknownDomains = 64
	// MaxUnmatchedKeys bounds the key chains tracked at once.
	MaxUnmatchedKeys = 128
	unmatchedExact   = 256
	unmatchedSample  = 16
)

// tally is one table. It is safe for concurrent use.
type tally struct {
	seed maphash.Seed
	// budget is what is left of this second's unmatchedExact.
	budget atomic.Int64
	// now is the time of the last tick (Unix nanoseconds), the time an
	// observation is seen at: reading the clock costs more than the rest
	// of an observation on some machines (a VM's clock without vDSO).
	now atomic.Int64

	// mu guards slots, whose length grows to their capacity, never
	// beyond.
	mu    sync.Mutex
	slots []tallySlot
}

// tallySlot is one tracked domain or key chain.
type tallySlot struct {
	hash       uint64
	count, err uint64 // in 1/countScale, as the sketch's
	seen       int64  // Unix nanoseconds
	// domain is the request's own string: it is not modified and costs
	// no copy.
	domain string
	// keys are the chain's keys (values empty); example is the last
	// descriptor, values included. Both empty in the domains' table.
	keys, example keyBytes
}

func newTally(capacity int, now time.Time) *tally {
	t := &tally{seed: maphash.MakeSeed(), slots: make([]tallySlot, 0, capacity)}
	t.budget.Store(unmatchedExact)
	t.now.Store(now.UnixNano())
	return t
}

// observe records one domain, or, with entries, one descriptor of it, as
// seen at the last tick. It allocates nothing.
func (t *tally) observe(domain string, entries []rules.Entry) {
	weight := uint64(countScale)
	// Once the budget is spent, a load: no write to the shared line.
	if t.budget.Load() <= 0 || t.budget.Add(-1) < 0 {
		if rand.Uint32()%unmatchedSample != 0 {
			return
		}
		weight *= unmatchedSample
	}
	var h maphash.Hash
	h.SetSeed(t.seed)
	_, _ = h.WriteString(domain)
	for i := range entries {
		// 0xff: a byte valid UTF-8 never holds (see sketch.hashKey).
		_ = h.WriteByte(0xff)
		_, _ = h.WriteString(entries[i].Key)
	}
	hash := h.Sum64()
	seen := t.now.Load()

	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.find(hash)
	switch {
	case s != nil:
		s.count += weight
	case len(t.slots) < cap(t.slots):
		t.slots = t.slots[:len(t.slots)+1]
		s = &t.slots[len(t.slots)-1]
		*s = tallySlot{hash: hash, count: weight}
		s.keys.set(entries, false)
	default:
		// Space-Saving: replace the smallest count, and inherit it.
		s = &t.slots[0]
		for i := range t.slots {
			if t.slots[i].count < s.count {
				s = &t.slots[i]
			}
		}
		s.hash, s.err = hash, s.count
		s.count += weight
		s.keys.set(entries, false)
	}
	s.domain, s.seen = domain, seen
	if entries != nil {
		s.example.set(entries, true)
	}
}

// find returns the slot of hash, nil when none holds it. t.mu is held.
func (t *tally) find(hash uint64) *tallySlot {
	for i := range t.slots {
		if t.slots[i].hash == hash {
			return &t.slots[i]
		}
	}
	return nil
}

// tick decays the counts as the sketch's, renews the second's budget and
// sets the time observations are seen at.
func (t *tally) tick(now time.Time) {
	t.now.Store(now.UnixNano())
	t.budget.Store(unmatchedExact)
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.slots {
		s := &t.slots[i]
		s.count -= s.count / sketchDecay
		s.err -= s.err / sketchDecay
	}
}

// Unmatched is one unknown domain, or one key chain of a domain's
// descriptors that no rule matched.
type Unmatched struct {
	Domain string
	// Keys are the chain's keys; nil for an unknown domain.
	Keys []string
	// Example is the last such descriptor, values included (request
	// data: escape it before showing it); nil for an unknown domain.
	Example []rules.Entry
	// Truncated reports that Keys or Example were cut to 256 bytes.
	Truncated bool
	// Count estimates the recent requests (unknown domains) or
	// descriptors (key chains), decayed as the top keys' counts;
	// CountError bounds its overestimate.
	Count, CountError uint64
	// Seen is when it was last seen, to the second (Run's last tick).
	Seen time.Time
}

// top returns the n entries with the largest counts among those seen
// within keyIdle of now.
func (t *tally) top(n int, now time.Time) []Unmatched {
	t.mu.Lock()
	out := make([]Unmatched, 0, min(n, len(t.slots)))
	for i := range t.slots {
		s := &t.slots[i]
		if now.UnixNano()-s.seen > int64(keyIdle) {
			continue
		}
		u := Unmatched{Domain: s.domain, Count: s.count / countScale, CountError: s.err / countScale, Seen: time.Unix(0, s.seen)}
		if s.keys.n > 0 {
			for _, e := range s.keys.entries() {
				u.Keys = append(u.Keys, e.Key)
			}
			u.Example = s.example.entries()
			u.Truncated = s.keys.truncated || s.example.truncated
		}
		out = append(out, u)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Unmatched) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Domain, b.Domain), slices.Compare(a.Keys, b.Keys))
	})
	return out[:min(n, len(out))]
}

// UnknownDomain records a request for a domain that no rule names. It
// allocates nothing; a nil *Recorder records nothing.
func (r *Recorder) UnknownDomain(domain string) {
	if r == nil {
		return
	}
	r.unknownDomains.observe(domain, nil)
}

// NoRule records a descriptor of a known domain that no rule matched.
// It allocates nothing; a nil *Recorder records nothing.
func (r *Recorder) NoRule(domain string, entries []rules.Entry) {
	if r == nil || len(entries) == 0 {
		return
	}
	r.unmatchedKeys.observe(domain, entries)
}

// UnknownDomains returns the n unknown domains with the most requests
// recently (seen within the last minute), the most first.
func (r *Recorder) UnknownDomains(n int) []Unmatched {
	if r == nil {
		return nil
	}
	return r.unknownDomains.top(max(n, 1), r.cfg.Now())
}

// UnmatchedKeys returns the n key chains of unmatched descriptors with
// the most descriptors recently (seen within the last minute), the most
// first.
func (r *Recorder) UnmatchedKeys(n int) []Unmatched {
	if r == nil {
		return nil
	}
	return r.unmatchedKeys.top(max(n, 1), r.cfg.Now())
}
