// Package quota splits a global rate limit into shares for the Envoys that
// enforce it, for Envoy's Rate Limit Quota Service (RLQS): each Envoy
// reports how many requests of a bucket it admitted and denied, and gets a
// token bucket of its own to decide by. A Pool is one global limit and
// the Envoys (subscribers) that report its bucket.
//
// The shares are max-min fair by demand, with a small reserve for Envoys
// that join, and they never add up to more than the limit: an Envoy's old
// share is counted until it has had time to take a decrease, and a share
// the server can no longer take back (an Envoy gone silent) is counted
// until its lease ends, or, when its replica died, until a reconnect has
// had time to replace it. docs/RLQS.md states the bound that follows.
//
// It is pure: it gets the time with every call and returns the grants to
// send; it knows nothing of gRPC, protos, rules or the clock.
package quota

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"
)

// Limit is a global limit: Rate requests per second on average, and at
// most Burst above it at once, all subscribers together.
type Limit struct {
	Rate  float64
	Burst float64
	// Equal gives every subscriber the same share whatever its demand
	// (policy static) instead of max-min fair shares.
	Equal bool
}

// Config tunes a Pool. Zero fields take their defaults.
type Config struct {
	// TTL is how long Envoy keeps a grant without a renewal (the
	// assignment's time to live; whole seconds, as Envoy reads it).
	// Every grant sent is a lease: the pool counts it until TTL plus
	// Settle after it was sent. Default 15 s, three of Envoy's reports.
	TTL time.Duration
	// ReportInterval is how often Envoy reports each bucket (5 s in
	// Envoy 1.40, which ignores the filter's reporting_interval): every
	// Envoy that holds a grant of an earlier server reports it within
	// that time of a start. Default 5 s.
	ReportInterval time.Duration
	// Settle is how long a grant sent takes to be in force at the Envoy
	// at most, on a stream that works. A decrease frees its share for
	// others only after it. Default 1 s.
	Settle time.Duration
	// Reserve is the share of the rate (0..0.5) that increases of
	// existing subscribers leave free while a subscriber joins (has no
	// grant yet), so that it gets a share at once, before others are
	// decreased. Otherwise all but a fifth of it is lent. Default 0.05.
	Reserve float64
	// Idle abandons a subscriber that reported no request for this long:
	// Envoy drops the bucket and subscribes again at its next request.
	// Default 60 s; negative never abandons.
	Idle time.Duration
	// Start is when the server started. Until Learning (the learning
	// period: every Envoy that held a grant of a previous server has
	// reported by then, and been answered) the grants of a previous
	// server may still be in force. A pool that has seen only buckets
	// Envoy created meanwhile (fresh: they held nothing) splits its
	// whole limit at once; once one reports a bucket it held before, a
	// restart, such a subscriber is not granted more than it was seen
	// admitting, and fresh buckets share the reserve.
	Start time.Time
}

// Defaults of Config.
const (
	DefaultTTL            = 15 * time.Second
	DefaultReportInterval = 5 * time.Second
	DefaultSettle         = time.Second
	DefaultReserve        = 0.05
	DefaultIdle           = 60 * time.Second
)

func (c Config) withDefaults() Config {
	c.TTL = cmp.Or(max(c.TTL, 0), DefaultTTL)
	c.TTL = max(c.TTL.Truncate(time.Second), time.Second)
	c.ReportInterval = cmp.Or(max(c.ReportInterval, 0), DefaultReportInterval)
	c.Settle = cmp.Or(max(c.Settle, 0), DefaultSettle)
	c.Reserve = cmp.Or(max(c.Reserve, 0), DefaultReserve)
	c.Reserve = min(c.Reserve, 0.5)
	c.Idle = cmp.Or(c.Idle, DefaultIdle)
	return c
}

// Learning returns the end of the learning period: Start, plus a report
// interval and a second (Envoy's next report after the start; at most
// the TTL, when every earlier grant has expired), plus Settle (its
// answer in force).
func (c Config) Learning() time.Time {
	c = c.withDefaults()
	return c.Start.Add(min(c.TTL, c.ReportInterval+time.Second) + c.Settle)
}

// Lease returns how long the pool counts a grant after sending it: TTL
// plus Settle.
func (c Config) Lease() time.Duration {
	c = c.withDefaults()
	return c.TTL + c.Settle
}

// EventReach is how long after a subscriber joins or ends its effect on
// the burst lasts: the decreases it causes settle (Settle), then the
// increases they free are sent at the next tick (1 s) and arrive (Settle).
func (c Config) EventReach() time.Duration {
	c = c.withDefaults()
	return 2*c.Settle + time.Second
}

// Usage is one report of a subscriber for the pool's bucket.
type Usage struct {
	// Allowed and Denied are the requests the Envoy admitted and denied
	// since its previous report of the bucket.
	Allowed, Denied uint64
	// Elapsed is the time_elapsed Envoy reports: whole seconds, rounded
	// down, since its previous report; 0 in the report of a bucket it
	// just created. The pool measures time itself and uses Elapsed only
	// for the first report of a subscriber it did not know (an Envoy
	// that reconnected).
	Elapsed time.Duration
	// At is when the report was received, if before the call: replicas
	// that share a pool hand reports to its owner a little later, and the
	// demand is measured between the times they were received. Zero, or
	// a time after the call's, means the call's time.
	At time.Time
}

// Change is a grant to send to a subscriber now.
type Change struct {
	Sub   uint64
	Grant Grant
}

// Pool is one global limit shared by its subscribers. It is not safe for
// concurrent use; its zero value is not usable (see NewPool).
type Pool struct {
	limit Limit
	cfg   Config
	// beyond counts the requests reported admitted beyond the shares
	// granted (see Beyond).
	beyond uint64
	// subs holds every subscriber whose share is counted: those
	// reporting, and those gone or abandoned whose last grant may still
	// be in force. keys are its keys in order, nil when they changed.
	subs map[uint64]*sub
	keys []uint64
	// wake is when the last lease a reconnect ended is over (see Wake).
	wake time.Time
}

// sub is one subscriber: an Envoy's stream reporting the pool's bucket.
type sub struct {
	id uint64
	// gone: the stream closed, no grant can reach the Envoy any more;
	// its grant counts until leaseUntil. abandoned: told to drop the
	// bucket; its grant counts until holdUntil.
	gone, abandoned bool

	// demand is the smoothed requests per second (admitted + denied),
	// known after the first measured sample.
	demand float64
	known  bool
	// count and allowed are the requests reported since the current
	// sample began, at since (server time).
	count, allowed uint64
	since          time.Time
	// reported is the last report; active the last with a request in
	// it, or the join.
	reported, active time.Time
	// evidence is the admitted rate its first report said, when that
	// report covered time before the subscription (a bucket Envoy held
	// before this stream, in the learning period; hasEvidence): the
	// share the Envoy held before the server started, at least.
	evidence    float64
	hasEvidence bool
	// fresh: the bucket was new (its first report said so) in the
	// learning period, so it held no grant of a previous server.
	fresh bool

	// grant is the last grant sent; rate and burst its token bucket
	// (0 for deny). hold is a larger grant sent before it, counted until
	// holdUntil, the time it may take the Envoy to apply the decrease.
	grant      Grant
	rate       float64
	burst      uint32
	granted    bool
	holdRate   float64
	holdBurst  uint32
	holdUntil  time.Time
	leaseUntil time.Time
	// pending, on a gone subscriber: its replica died (LeaveIf), and no
	// reconnect has ended its lease early yet (see shorten); on a live
	// one: it joined as a reconnect, when no such lease was there to
	// end, and has not reported again since.
	pending bool
}

// NewPool returns an empty pool for limit l.
func NewPool(l Limit, cfg Config) *Pool {
	return &Pool{limit: l, cfg: cfg.withDefaults(), subs: map[uint64]*sub{}}
}

// Limit returns the pool's limit.
func (p *Pool) Limit() Limit { return p.limit }

// Subscribed reports whether id is a live subscriber of the pool: one
// that joined and was neither abandoned nor taken as gone since.
func (p *Pool) Subscribed(id uint64) bool {
	s := p.subs[id]
	return s != nil && !s.gone && !s.abandoned
}

// Wake returns when the last lease a reconnect ended early is over: its
// share is free then, for a Tick to give rather than wait for the next.
func (p *Pool) Wake() time.Time { return p.wake }

// Len returns the number of subscribers counted: reporting, or gone with
// a grant that may still be in force.
func (p *Pool) Len() int { return len(p.subs) }

// committed is the share s may be using now: the larger of its grant and
// any grant it may not have replaced yet, or nothing once its lease ended.
func (s *sub) committed(now time.Time) (float64, uint32) {
	if !s.granted || !now.Before(s.leaseUntil) {
		return 0, 0
	}
	r, b := s.rate, s.burst
	if now.Before(s.holdUntil) {
		r, b = max(r, s.holdRate), max(b, s.holdBurst)
	}
	if s.abandoned && !now.Before(s.holdUntil) {
		return 0, 0
	}
	return r, b
}

// Committed returns the sum of the shares that may be in force now: rate
// (requests per second) and burst. Outside the transients docs/RLQS.md
// names, the rate is at most the limit's. Like every method, it is not
// for concurrent use (it keeps the keys' order).
func (p *Pool) Committed(now time.Time) (rate float64, burst uint64) {
	// In the order of the keys: the same shares add up to the same sum,
	// in a pool restored from its state too, and give the same grants.
	for _, k := range p.order() {
		r, b := p.subs[k].committed(now)
		rate += r
		burst += uint64(b)
	}
	return rate, burst
}

// order returns the subscribers' keys in order.
func (p *Pool) order() []uint64 {
	if p.keys == nil {
		p.keys = slices.Sorted(maps.Keys(p.subs))
	}
	return p.keys
}

// minSample is the shortest time a demand sample is measured over:
// reports closer together (Envoy reports a new bucket at once, then at
// its next tick) add up into one sample.
const minSample = time.Second

// Report records a subscriber's usage and returns the grants to send now:
// always one for id (which renews its lease), and any other subscriber's
// share that changes. An unknown id joins.
func (p *Pool) Report(now time.Time, id uint64, u Usage) []Change {
	s := p.subs[id]
	if s != nil && s.abandoned && u.Elapsed > 0 {
		// A report Envoy sent before it had the abandon: it has dropped
		// the bucket by now, and reports it anew (Elapsed 0) at its next
		// request.
		return nil
	}
	if s != nil && s.gone && !s.abandoned && u.Elapsed > 0 {
		// The same stream reporting after it was taken as gone: its
		// replica was taken for dead while it lived (stalled past the
		// beats), or its reports were late. No reconnect: it goes on,
		// its lease counted as it was all along.
		s.gone, s.pending = false, false
	}
	if s != nil && (s.gone || s.abandoned) {
		// A report on a stream the pool was told is gone, or after an
		// abandon: a new subscription; the old grant still counts
		// until it ends, under another key.
		p.subs[ghostKey(id, p.subs)] = s
		p.keys = nil
		s = nil
	}
	n := u.Allowed + u.Denied
	at := u.At
	if at.IsZero() || at.After(now) {
		at = now
	}
	p.beyond += p.beyondShare(at, s, u)
	if s == nil {
		s = &sub{id: id, since: at, active: at}
		s.reported = at
		p.subs[id] = s
		p.keys = nil
		if u.Elapsed > 0 {
			// A subscription Envoy had before this stream (the
			// stream or the server restarted): its report covers
			// Elapsed, rounded down, so the rate is between
			// n/(Elapsed+1s) and n/Elapsed; the report interval
			// when it fits (Envoy's timer: 4.99 s reads 4).
			span := u.Elapsed + time.Second/2
			if ri := p.cfg.ReportInterval; ri >= u.Elapsed && ri <= u.Elapsed+time.Second {
				span = ri
			}
			s.demand = float64(n) / span.Seconds()
			s.known = true
			if now.Before(p.cfg.Learning()) {
				s.evidence, s.hasEvidence = float64(u.Allowed)/(u.Elapsed+time.Second).Seconds(), true
			}
			s.pending = !p.shorten(now)
		} else {
			s.count, s.allowed = n, u.Allowed
			s.fresh = now.Before(p.cfg.Learning())
		}
	} else {
		s.pending = false
		s.count += n
		s.allowed += u.Allowed
		if d := at.Sub(s.since); d >= minSample {
			// The last sample, unsmoothed: a fall is released, and a
			// rise granted, at the first report that shows it.
			s.demand, s.known = float64(s.count)/d.Seconds(), true
			s.count, s.allowed, s.since = 0, 0, at
		}
	}
	s.reported = later(s.reported, at)
	if n > 0 {
		s.active = later(s.active, at)
	}
	changes := p.rebalance(now)
	for _, c := range changes {
		if c.Sub == id {
			return changes
		}
	}
	// Unchanged: send it again, to renew the lease.
	p.sent(now, s)
	return append(changes, Change{Sub: id, Grant: s.grant})
}

// beyondShare is how many of a report's admitted requests its
// subscriber's grants cannot account for: all of a new bucket's (admitted
// before any assignment, by Envoy's no_assignment_behavior), and those
// above the largest rate counted for it over the time since its last
// report (with a second of slack for the timing of reports) plus its
// burst and a token. Nothing can be told of the first report of a
// subscriber that was granted nothing here (a reconnect). at is when the
// report was received.
func (p *Pool) beyondShare(at time.Time, s *sub, u Usage) uint64 {
	switch {
	case s == nil && u.Elapsed == 0:
		return u.Allowed
	case s == nil || !s.granted:
		return 0
	}
	r, b := max(s.rate, s.holdRate), max(s.burst, s.holdBurst)
	allowance := r*(at.Sub(s.reported)+time.Second).Seconds() + float64(b) + 1
	if a := float64(u.Allowed); a > allowance {
		return uint64(a - allowance)
	}
	return 0
}

// Beyond returns the requests reported admitted beyond the shares granted
// since the pool was made: what Envoys admitted before their first
// assignment, or after one expired, or against it.
func (p *Pool) Beyond() uint64 { return p.beyond }

// Subscriber is what a pool knows of one subscriber, for observability.
type Subscriber struct {
	ID uint64
	// Demand is the smoothed requests a second reported, admitted and
	// denied; DemandKnown is false until it was measured.
	Demand      float64
	DemandKnown bool
	// Rate and Burst are the last grant sent.
	Rate  float64
	Burst uint32
	// Committed is the rate counted for it now: its grant, or a larger
	// one it may not have replaced yet.
	Committed float64
	// Gone: its stream closed; Abandoned: told to drop the bucket. Its
	// share counts until Lease.
	Gone, Abandoned bool
	Lease           time.Time
}

// Subscribers returns every subscriber counted, by ID.
func (p *Pool) Subscribers(now time.Time) []Subscriber {
	out := make([]Subscriber, 0, len(p.subs))
	for _, s := range p.subs {
		c, _ := s.committed(now)
		out = append(out, Subscriber{
			ID: s.id, Demand: s.demand, DemandKnown: s.known, Rate: s.rate, Burst: s.burst,
			Committed: c, Gone: s.gone, Abandoned: s.abandoned, Lease: s.leaseUntil,
		})
	}
	slices.SortFunc(out, func(a, b Subscriber) int { return cmpUint(a.ID, b.ID) })
	return out
}

// ghostKey finds a key for a subscriber whose id a new subscription
// takes: above every id in use (ids of streams count up from 1).
func ghostKey(id uint64, subs map[uint64]*sub) uint64 {
	k := id | 1<<63
	for subs[k] != nil {
		k++
	}
	return k
}

// Leave records that a subscriber's stream closed: no grant reaches it any
// more, and its share counts until its lease ends.
func (p *Pool) Leave(now time.Time, id uint64) []Change {
	s := p.subs[id]
	if s == nil {
		return nil
	}
	s.gone, s.pending = true, false
	if r, _ := s.committed(now); r == 0 && !s.granted {
		delete(p.subs, id)
		p.keys = nil
	}
	return p.rebalance(now)
}

// Tick ends leases and holds that are over and abandons idle subscribers,
// and returns the grants to send: increases that waited for a decrease to
// settle, and abandons.
func (p *Pool) Tick(now time.Time) []Change {
	p.expire(now)
	var changes []Change
	for _, s := range p.subs {
		if !s.gone && !s.abandoned && p.cfg.Idle > 0 && now.Sub(s.active) >= p.cfg.Idle {
			// Envoy drops the bucket: its share is gone once the
			// abandon is in force.
			cr, cb := s.committed(now)
			s.abandoned = true
			s.holdRate, s.holdBurst, s.holdUntil = cr, cb, now.Add(p.cfg.Settle)
			s.rate, s.burst = 0, 0
			s.grant = Grant{Abandon: true}
			p.sent(now, s)
			changes = append(changes, Change{Sub: s.id, Grant: s.grant})
		}
	}
	slices.SortFunc(changes, func(a, b Change) int { return cmpUint(a.Sub, b.Sub) })
	return append(changes, p.rebalance(now)...)
}

// expire forgets the subscribers whose share has ended, and the shares
// that have: a gone or abandoned subscriber's once its lease or its
// abandon is over; a reporting subscriber's grant once nothing renewed it
// for a whole lease (the Envoy has fallen back to its own default). A
// subscriber silent for TTL is taken as gone: Envoy reports every bucket
// it has every few seconds, so its Envoy dropped the bucket or stopped.
func (p *Pool) expire(now time.Time) {
	for id, s := range p.subs {
		switch {
		case s.gone && !now.Before(s.leaseUntil),
			s.abandoned && !now.Before(s.holdUntil):
			delete(p.subs, id)
			p.keys = nil
		case !s.gone && !s.abandoned && now.Sub(s.reported) >= p.cfg.TTL:
			s.gone, s.pending = true, false
		case s.granted && !now.Before(s.leaseUntil):
			s.granted, s.rate, s.burst = false, 0, 0
		}
	}
}

// Empty reports whether the pool has no subscriber left, reporting or
// counted: it can be dropped.
func (p *Pool) Empty() bool { return len(p.subs) == 0 }

// SetLimit changes the pool's limit (the rules reloaded) and returns the
// grants that change: decreases at once; increases as the decreases
// settle.
func (p *Pool) SetLimit(now time.Time, l Limit) []Change {
	p.limit = l
	return p.rebalance(now)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sent records that s's grant is being sent now: its lease starts again.
func (p *Pool) sent(now time.Time, s *sub) {
	s.granted = true
	s.leaseUntil = now.Add(p.cfg.TTL + p.cfg.Settle)
}

// deadband is the smallest change of a share worth sending: 2 % of it, and
// at least one request a minute. Smaller ones wait; skipping a change is
// always safe, since increases take only capacity that is free.
func deadband(rate float64) float64 { return max(rate*0.02, 1.0/60) }

// headroom is what a subscriber whose demand is met gets above it, as a
// share of its demand: room for the noise of a measured rate and for a
// small rise before its next report shows it.
const headroom = 0.05

// maxRoom is the most headroom all the demands met get together, as a
// share of the rate, when other demands are not met (see targets).
const maxRoom = 0.01

// rebalance computes every reporting subscriber's target share and moves
// the grants towards it: decreases at once, increases only out of
// capacity free now (counting the decreases still settling and the leases
// of the gone), the poorest first. It returns the grants that changed.
func (p *Pool) rebalance(now time.Time) []Change {
	p.expire(now)
	live, counted := p.live(now)
	if len(live) == 0 {
		return nil
	}
	keep := p.keep(live)
	targets, burst := p.targets(now, live, counted, keep)
	changes := p.decrease(now, live, targets, burst, nil)
	return p.increase(now, live, targets, burst, keep, changes)
}

// live returns the subscribers that still report, in id order, and how
// many share the burst: those and the ones whose share still counts.
func (p *Pool) live(now time.Time) (live []*sub, counted int) {
	for _, s := range p.subs {
		if r, b := s.committed(now); r > 0 || b > 0 || (!s.gone && !s.abandoned) {
			counted++
		}
		if !s.gone && !s.abandoned {
			live = append(live, s)
		}
	}
	slices.SortFunc(live, func(a, b *sub) int { return cmpUint(a.id, b.id) })
	return live, counted
}

// keep is the rate that increases of subscribers with a grant leave free:
// the reserve while one joins (has no grant yet), so that it gets a share
// at once; a fifth of it otherwise (the rest is lent), for the next.
func (p *Pool) keep(live []*sub) float64 {
	if slices.ContainsFunc(live, func(s *sub) bool { return !s.granted }) {
		return p.limit.Rate * p.cfg.Reserve
	}
	return p.limit.Rate * p.cfg.Reserve / 5
}

// targets returns each live subscriber's target rate, max-min fair over
// the capacity less what is kept free, and the burst each may hold. In
// a restart's learning period a subscriber is never granted more than it
// was seen admitting, and fresh buckets share the reserve.
func (p *Pool) targets(now time.Time, live []*sub, counted int, keep float64) ([]float64, uint32) {
	capacity := p.limit.Rate - keep
	demands := make([]float64, len(live))
	floor := capacity / float64(10*len(live))
	split := func(room float64) []float64 {
		for i, s := range live {
			demands[i] = math.Inf(1)
			if s.known && !p.limit.Equal {
				// Every subscriber keeps a small share, a tenth of
				// an equal one, so that its first requests after a
				// quiet time are not all denied.
				demands[i] = max(s.demand*(1+room), floor)
			}
		}
		return Waterfill(capacity, demands)
	}
	targets := split(headroom)
	// The headroom of the demands met is unused while they hold, and
	// taken from the others' (a fleet whose demand is all met has the
	// spare on top): all of it is cut to maxRoom of the rate (in one
	// pass: demands met only with less headroom add a little), so that a
	// fleet whose demand exceeds the limit admits nearly all of it
	// however many demands are met.
	var room float64
	for i, s := range live {
		if targets[i] == demands[i] && demands[i] < math.Inf(1) {
			room += demands[i] - max(s.demand, floor)
		}
	}
	if most := maxRoom * p.limit.Rate; room > most {
		targets = split(headroom * most / room)
	}
	burst := uint32(max(MinTokens, math.Floor(p.limit.Burst/float64(counted))))
	if !p.restarting(now) {
		return targets, burst
	}
	// An Envoy that held a grant before the start may still be using
	// it: never more than it was seen admitting. A bucket created
	// meanwhile held nothing: those share the reserve.
	fresh := 0
	for _, s := range live {
		if s.fresh {
			fresh++
		}
	}
	for i, s := range live {
		if s.fresh {
			targets[i] = min(targets[i], p.limit.Rate*p.cfg.Reserve/float64(fresh))
		}
		if s.hasEvidence {
			targets[i] = min(targets[i], s.evidence)
		}
	}
	return targets, burst
}

// restarting reports whether the pool is in its learning period and has
// seen a bucket an Envoy held before it started: grants of an earlier
// server may be in force.
func (p *Pool) restarting(now time.Time) bool {
	if !now.Before(p.cfg.Learning()) {
		return false
	}
	for _, s := range p.subs {
		if s.hasEvidence {
			return true
		}
	}
	return false
}

// decrease lowers, at once, the grants above their target (or above the
// burst): the old share stays counted until Settle has passed. It appends
// the changes to changes.
func (p *Pool) decrease(now time.Time, live []*sub, targets []float64, burst uint32, changes []Change) []Change {
	committed, _ := p.Committed(now)
	over := committed > p.limit.Rate
	for i, s := range live {
		if !s.granted {
			continue
		}
		r, b := s.rate, s.burst
		if burst < s.burst {
			b = burst
		}
		if targets[i] < s.rate {
			if t := represent(targets[i], b); t < s.rate && (over || s.rate-t >= deadband(s.rate) || t == 0) {
				r = t
			}
		}
		if r == s.rate && b == s.burst {
			continue
		}
		cr, cb := s.committed(now)
		s.holdRate, s.holdBurst, s.holdUntil = cr, cb, now.Add(p.cfg.Settle)
		p.set(now, s, r, b)
		changes = append(changes, Change{Sub: s.id, Grant: s.grant})
	}
	return changes
}

// increase raises the grants below their target out of what is free now,
// the subscribers with no grant first, then the poorest; keep is only for
// those with no grant yet. It appends the changes to changes.
func (p *Pool) increase(now time.Time, live []*sub, targets []float64, burst uint32, keep float64, changes []Change) []Change {
	rate, burstSum := p.Committed(now)
	free := p.limit.Rate - rate
	freeBurst := int64(p.limit.Burst) - int64(burstSum)
	order := make([]int, len(live))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ra, rb := live[a].rate, live[b].rate
		switch {
		case !live[a].granted && live[b].granted:
			return -1
		case live[a].granted && !live[b].granted:
			return 1
		case ra < rb:
			return -1
		case ra > rb:
			return 1
		}
		return 0
	})
	for _, i := range order {
		s := live[i]
		avail := free
		if s.granted {
			avail -= keep
		}
		cr, cb := s.committed(now)
		r, b := s.rate, s.burst
		if burst > b {
			b = max(uint32(min(int64(burst), int64(cb)+max(freeBurst, 0))), s.burst)
		}
		if want := targets[i]; want > r {
			// What it may use beyond what is counted for it already.
			if up := represent(min(want, cr+max(avail, 0)), max(b, MinTokens)); up > r && (up-r >= deadband(r) || !s.granted) {
				r = up
			}
		}
		if r > 0 {
			// At least MinTokens, which may not fit: the bound's N.
			b = max(b, MinTokens)
		}
		if s.granted && r == s.rate && b == s.burst {
			continue
		}
		free -= max(0, r-cr)
		freeBurst -= max(0, int64(b)-int64(cb))
		p.set(now, s, r, b)
		changes = append(changes, Change{Sub: s.id, Grant: s.grant})
	}
	return changes
}

// set gives s the share (r, b) and builds its grant; the caller sends it.
func (p *Pool) set(now time.Time, s *sub, r float64, b uint32) {
	if r > 0 && b < MinTokens {
		// A token bucket holds at least MinTokens (Envoy's max_tokens
		// must be positive; see MinTokens): the bound's N.
		b = MinTokens
	}
	s.rate, s.burst = r, b
	s.grant = s.grant.next(r, b)
	if r == 0 {
		// A deny holds no tokens.
		s.burst = 0
	}
	p.sent(now, s)
}

// Waterfill returns max-min fair shares of capacity for demands (+Inf for
// an unknown or unbounded one): no share exceeds its demand, and no share
// can grow without shrinking a smaller one. Capacity left over when every
// demand is met is spread in proportion to demand (equally when every
// demand is zero), so that each has room to grow. Pools aim at it, each
// demand at least a tenth of an equal share.
func Waterfill(capacity float64, demands []float64) []float64 {
	n := len(demands)
	shares := make([]float64, n)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case demands[a] < demands[b]:
			return -1
		case demands[a] > demands[b]:
			return 1
		}
		return 0
	})
	left := max(capacity, 0)
	for k, i := range order {
		fair := left / float64(n-k)
		if demands[i] > fair {
			// Every demand from here on is at least fair: each gets it.
			for _, j := range order[k:] {
				shares[j] = fair
			}
			return shares
		}
		shares[i] = demands[i]
		left -= demands[i]
	}
	var total float64
	for _, d := range demands {
		total += d
	}
	for i, d := range demands {
		if total > 0 {
			shares[i] += left * d / total
		} else {
			shares[i] += left / float64(n)
		}
	}
	return shares
}
