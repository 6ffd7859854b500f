// Package limiter decides, for the matched rules of one request, whether
// each descriptor is within its limit. It builds cache keys, holds the pure
// math of every algorithm, and declares the Store it needs; it knows nothing
// of gRPC, protos, YAML or any concrete store.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// Config tunes a Limiter. The zero value is usable: no key prefix, a
// near-limit ratio of 0 (every admitted hit counts as near the limit) and
// increments even when over the limit.
type Config struct {
	// Prefix is prepended to every cache key (CACHE_KEY_PREFIX; default "").
	Prefix string
	// KeyFormat is how cache keys are built (CACHE_KEY_FORMAT; default
	// AnchorKeys, envoyproxy/ratelimit's; EscapedKeys never lets two
	// descriptors share a key).
	KeyFormat KeyFormat
	// NearLimitRatio is the share of the limit above which admitted hits are
	// counted as near_limit (NEAR_LIMIT_RATIO; default 0.8 in settings).
	NearLimitRatio float64
	// StopIncrementWhenOverLimit records no hit of a request when any of its
	// descriptors would go over its limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
	StopIncrementWhenOverLimit bool
	// NearCache, when not nil, remembers keys known to be over their limit
	// and answers them without asking the store (LOCAL_CACHE_SIZE_IN_BYTES).
	NearCache *NearCache
}

// Descriptor is one descriptor of a request after rule matching.
type Descriptor struct {
	// Entries are the key/value pairs the cache key is built from.
	Entries []rules.Entry
	// Limit is the rule to apply; nil means the descriptor is not limited
	// (no rule, unlimited, or replaced) and is answered OK without a store op.
	// When it is one of a list (rules.Limit.InList), every limit of
	// Limit.Limits applies, each to its own key, all in the same batch.
	Limit *rules.Limit
	// Hits is the number of units to consume; 0 checks without counting.
	Hits uint64
	// Refund gives Hits back instead (is_negative_hits): to every limit
	// that applies, each by its algorithm's rule (Op.Refund). A refund is
	// never OverLimit, is never answered from the near cache, and drops
	// its keys from it.
	Refund bool
	// Skip has bit i set for a limit of Limit.Limits that does not apply
	// to this request (replaced by another descriptor's rule). Unlimited
	// limits of a list are skipped anyway. Ignored for a single limit.
	Skip uint32
	// Each, when not nil, receives the status of every limit of
	// Limit.Limits: Each[i] for Limit.Limits[i], with Status.Limit nil for
	// the skipped ones. It must be as long as the list. Ignored for a
	// single limit.
	Each []Status
}

// Code is the decision for one descriptor.
type Code uint8

// The decisions; they map to Envoy's OK and OVER_LIMIT.
const (
	OK Code = iota
	OverLimit
)

// Counts are the statistics one descriptor adds to its rule's counters,
// with the meanings of envoyproxy/ratelimit's per-rule stats.
type Counts struct {
	TotalHits               uint64
	OverLimit               uint64
	NearLimit               uint64
	WithinLimit             uint64
	ShadowMode              uint64
	OverLimitWithLocalCache uint64
	// ShadowOverLimit counts, for a shadow limit (rules.Limit.Shadow),
	// the hits it would have refused; its OverLimit stays 0. Our
	// extension: shadow_over_limit in the statistics.
	ShadowOverLimit uint64
	// TotalNegativeHits counts the hits a refund asked to give back
	// (Descriptor.Refund), whether or not the key held that many; a
	// refund counts in no other field. envoyproxy/ratelimit's
	// total_negative_hits.
	TotalNegativeHits uint64
}

// Status is the decision for one descriptor.
type Status struct {
	// Limit is the limit the status describes: the descriptor's, or for a
	// list the one that decided (see Limiter.Check). Nil when the
	// descriptor was not limited, or limited by shadow limits only.
	Limit *rules.Limit
	// Code is the decision. For a shadow limit's own status (in
	// Descriptor.Each) OverLimit means it would have refused.
	Code Code
	// Remaining is the algorithm's remaining allowance (0 when over limit).
	Remaining uint32
	// ResetAfter is the algorithm's time until reset.
	ResetAfter time.Duration
	Counts     Counts
}

// Limiter decides, for the matched descriptors of one request, whether each
// is within its limit: it builds every key, sends all the ops of the request
// to the Store in one Batch (one round trip), and turns the Results into
// Statuses with envoyproxy/ratelimit's semantics.
//
// A Limiter is safe for concurrent use. Use New to make one; the zero value
// has no store and its Check returns an error.
type Limiter struct {
	store Store
	cfg   Config
	// nearRatio is cfg.NearLimitRatio as envoyproxy/ratelimit holds it
	// (float32), so near-limit thresholds match the anchor's to the unit.
	nearRatio float32
	// pool recycles *request: the batch, its slices and the key buffer.
	pool sync.Pool
}

// request is the reusable scratch space of one Check.
type request struct {
	batch Batch
	idx   []int // idx[j] is the descriptor of batch.Ops[j]
	// lims[j] is the limit of batch.Ops[j]: the descriptor's, or one of
	// its list.
	lims []*rules.Limit
	// key holds the keys of batch.Ops one after the other, ends[j] being
	// where op j's ends: Check makes them one string, so that a request
	// of several descriptors costs one allocation for its keys, not one a
	// descriptor.
	key  []byte
	ends []int
	// epochs[j] is the epoch of op j's key in the near cache when it was
	// looked up (see NearCache.rememberSince); refunds counts the refund
	// ops.
	epochs  []uint64
	refunds int
}

// New returns a Limiter that keeps its counts in store.
func New(store Store, cfg Config) *Limiter {
	l := &Limiter{store: store, cfg: cfg, nearRatio: float32(cfg.NearLimitRatio)}
	l.pool.New = func() any { return new(request) }
	return l
}

// Check decides every descriptor of one request of domain at time now and
// writes the decision for ds[i] to out[i]; out must be at least as long as
// ds. A descriptor with a nil (or unlimited) Limit is OK without touching
// the store. The others become one Batch, applied by the store in one call
// (atomically across the batch when Config.StopIncrementWhenOverLimit is
// set). A store error is returned wrapped, so errors.Is(err,
// ErrUnavailable) still reports an unreachable backend; out is then
// meaningless.
//
// Each Status follows envoyproxy/ratelimit's GetResponseDescriptorStatus:
// over the limit, Code is OverLimit and Remaining 0, and the hits are split
// between OverLimit and NearLimit by the counts before and after; within the
// limit, Code is OK, Remaining is the algorithm's, WithinLimit counts the
// hits and NearLimit the part above floor(limit × NearLimitRatio). A rule in
// shadow mode answers OK where it would answer OverLimit and counts the hits
// over the limit in ShadowMode. For a token bucket the limit of these
// rules is its capacity (Op.Capacity).
//
// A descriptor with a list of limits (rules.Limit.Limits) makes one op per
// limit that applies, all in the batch, grouped (Op.Group). Each limit
// gets its status as above (in Descriptor.Each); the descriptor's is that
// of the limit that decided: the one over its limit (of several, the one
// that resets last, so that the descriptor's reset is when it passes
// again), else the one with the least Remaining (of equals, the one that
// resets last, then the first).
// Its Counts are that limit's, so the descriptor's statistics count each
// hit once.
//
// A shadow limit of a list (rules.Limit.Shadow) is applied as if it were
// the descriptor's only limit (Op.Shadow): its status in Descriptor.Each
// is what it would have answered, OverLimit included, with the hits it
// would refuse counted in ShadowOverLimit instead of OverLimit; it never
// decides the descriptor's status, is never answered from nor put in the
// near cache, and, with StopIncrementWhenOverLimit, records its own hits
// when it admits them whatever the other limits say, and none when it
// would refuse them. A descriptor whose limits are all shadow limits (or
// unlimited) gets Status{}: OK, no Limit.
//
// A refund (Descriptor.Refund) gives its hits back to every limit that
// applies, shadow limits included (Op.Refund), and is OK: Remaining and
// ResetAfter are those of its limit after the refund (of a list, the one
// with the least Remaining), and its Counts hold only TotalNegativeHits.
// It always reaches the store, and then drops its keys from the near
// cache. With StopIncrementWhenOverLimit a request's refunds go to the
// store in a batch of their own, before its other ops: a refund is never
// held back by another descriptor's refusal, and never takes part in one.
func (l *Limiter) Check(ctx context.Context, domain string, now time.Time, ds []Descriptor, out []Status) error {
	if len(out) < len(ds) {
		return fmt.Errorf("limiter: %d statuses for %d descriptors", len(out), len(ds))
	}
	if l.store == nil {
		return errors.New("limiter: no store (use limiter.New)")
	}
	r, _ := l.pool.Get().(*request)
	if r == nil {
		r = new(request)
	}
	b := &r.batch
	b.Now = now
	b.AllOrNothing = l.cfg.StopIncrementWhenOverLimit
	r.key = r.key[:0]
	cachedOver := l.addOps(r, domain, now, ds, out)
	if cachedOver && b.AllOrNothing {
		// The request is over a limit already: record none of its hits,
		// but for shadow limits, which count alone, and refunds.
		for j := range b.Ops {
			if !b.Ops[j].Shadow && !b.Ops[j].Refund {
				b.Ops[j].Hits = 0
			}
		}
	}
	if len(b.Ops) > 0 {
		if err := l.run(ctx, r); err != nil {
			// r is not recycled: a store that gave up on ctx may still
			// hold it.
			return err
		}
		l.statuses(r, now, ds, out, cachedOver)
	}
	clear(b.Ops) // drop the keys
	clear(r.lims)
	b.Ops, b.Results, r.idx, r.lims, r.ends, r.epochs = b.Ops[:0], b.Results[:0], r.idx[:0], r.lims[:0], r.ends[:0], r.epochs[:0]
	r.refunds = 0
	l.pool.Put(r)
	return nil
}

// addOps adds to r's batch the op of each limit of ds, or writes the
// status of those the near cache answers; it reports whether one was
// answered so (over its limit).
func (l *Limiter) addOps(r *request, domain string, now time.Time, ds []Descriptor, out []Status) (cachedOver bool) {
	for i := range ds {
		out[i] = Status{}
		lim := ds[i].Limit
		if lim == nil || lim.Unlimited && !lim.InList() {
			continue
		}
		if !lim.InList() {
			cachedOver = l.addOp(r, domain, now, &ds[i], i, lim, 0, &out[i]) || cachedOver
			continue
		}
		for k, m := range lim.Limits {
			var cached Status
			st := &cached
			if ds[i].Each != nil {
				ds[i].Each[k] = Status{}
				st = &ds[i].Each[k]
			}
			if m.Unlimited || ds[i].Skip&(1<<k) != 0 {
				continue
			}
			if l.addOp(r, domain, now, &ds[i], i, m, uint32(i+1), st) {
				cachedOver = true
				decide(&out[i], st)
			}
		}
	}
	return cachedOver
}

// run gives r's batch its keys and the store.
func (l *Limiter) run(ctx context.Context, r *request) error {
	b := &r.batch
	// One string for every key (see request.key): a store that keeps a
	// key keeps a copy, or the others' few bytes with it.
	keys, start := string(r.key), 0
	for j, end := range r.ends {
		b.Ops[j].Key = keys[start:end]
		start = end
	}
	b.Results = append(b.Results[:0], make([]Result, len(b.Ops))...)
	if b.AllOrNothing && r.refunds > 0 {
		return l.runApart(ctx, b)
	}
	if err := l.store.Do(ctx, b); err != nil {
		return fmt.Errorf("limiter: %w", err)
	}
	return nil
}

// runApart runs an AllOrNothing batch b that holds refunds as two: its
// refunds first, not AllOrNothing (a store never sees a refund in an
// AllOrNothing batch, see Op.Refund), then its other ops. A list's ops
// are all refunds or none, so each group stays whole. It copies the ops;
// such requests (refunds with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, in
// a request that also hits) are rare.
func (l *Limiter) runApart(ctx context.Context, b *Batch) error {
	for _, refunds := range [...]bool{true, false} {
		part := Batch{Now: b.Now, AllOrNothing: !refunds}
		var idx []int
		for j := range b.Ops {
			if b.Ops[j].Refund == refunds {
				part.Ops = append(part.Ops, b.Ops[j])
				idx = append(idx, j)
			}
		}
		if len(part.Ops) == 0 {
			continue
		}
		part.Results = make([]Result, len(part.Ops))
		if err := l.store.Do(ctx, &part); err != nil {
			return fmt.Errorf("limiter: %w", err)
		}
		for k, j := range idx {
			b.Results[j] = part.Results[k]
		}
	}
	return nil
}

// statuses turns the results of r's batch into the descriptors' statuses
// (and their limits' in Each), remembering in the near cache the keys
// over their limit.
func (l *Limiter) statuses(r *request, now time.Time, ds []Descriptor, out []Status, cachedOver bool) {
	b := &r.batch
	for j, i := range r.idx {
		lim, d := r.lims[j], &ds[i]
		var st Status
		if op := &b.Ops[j]; op.Refund {
			st = refundStatus(lim, op, &b.Results[j])
			if l.cfg.NearCache != nil && op.Hits > 0 && cacheable(lim, op) {
				// A refund of 0 hits is a read: it frees nothing.
				l.cfg.NearCache.Forget(op.Key)
			}
		} else {
			st = l.status(lim, op, &b.Results[j])
			if cachedOver && b.AllOrNothing && !lim.Shadow {
				st.Counts.TotalHits = d.Hits
			}
			l.remember(lim, op, &b.Results[j], now, r.epochs[j])
		}
		if !lim.InList() {
			out[i] = st
			continue
		}
		if d.Each != nil {
			d.Each[lim.Index] = st
		}
		if !lim.Shadow {
			decide(&out[i], &st)
		}
	}
}

// addOp adds the op of one limit of descriptor d (the i-th) to r's batch,
// or, when the near cache knows its key is over the limit, writes that
// status to st and reports true. group is the op's Op.Group.
func (l *Limiter) addOp(r *request, domain string, now time.Time, d *Descriptor, i int, lim *rules.Limit, group uint32, st *Status) (cachedOver bool) {
	start := len(r.key)
	if l.cfg.KeyFormat == EscapedKeys {
		r.key = EscapedCacheKey(r.key, l.cfg.Prefix, domain, d.Entries, lim, now)
	} else {
		r.key = CacheKey(r.key, l.cfg.Prefix, domain, d.Entries, lim, now)
	}
	op := Op{
		Algorithm: lim.Algorithm,
		Limit:     uint64(lim.RequestsPerUnit),
		Burst:     uint64(lim.Burst),
		Window:    windowDuration(windowSeconds(lim)),
		Hits:      d.Hits,
		Refund:    d.Refund,
		PerSecond: lim.Unit == rules.Second,
		Group:     group,
		Shadow:    lim.Shadow,
		Rule:      lim.FullKey,
	}
	if op.Rule == "" { // a descriptor's own limit (override)
		op.Rule = domain
	}
	var epoch uint64
	if l.cfg.NearCache != nil && !lim.Shadow && !op.Refund {
		// The key is looked up from the buffer: no string is made
		// for a descriptor answered from the cache.
		until, over, e := l.cfg.NearCache.lookup(unsafeString(r.key[start:]), op.Capacity(), now)
		if over {
			*st = cachedOverLimit(op.Hits, until.Sub(now))
			st.Limit = lim
			r.key = r.key[:start]
			return true
		}
		epoch = e
	}
	if op.Refund {
		r.refunds++
	}
	// op.Key is set by Check, once every key is in r.key.
	r.epochs = append(r.epochs, epoch)
	r.ends = append(r.ends, len(r.key))
	r.batch.Ops = append(r.batch.Ops, op)
	r.idx = append(r.idx, i)
	r.lims = append(r.lims, lim)
	return false
}

// decide makes st, the status of one limit of a descriptor's list, the
// descriptor's status cur when it decides over the limits seen so far:
// over the limit before within it; of two within, the one with the least
// Remaining; of two over, or within with as much Remaining, the one that
// resets last; of equals, the first in the list (see Check).
func decide(cur, st *Status) {
	better := false
	switch {
	case cur.Limit == nil:
		better = true
	case (st.Code == OverLimit) != (cur.Code == OverLimit):
		better = st.Code == OverLimit
	case st.Code != OverLimit && st.Remaining != cur.Remaining:
		better = st.Remaining < cur.Remaining
	case st.ResetAfter != cur.ResetAfter:
		better = st.ResetAfter > cur.ResetAfter
	default:
		better = st.Limit.Index < cur.Limit.Index
	}
	if better {
		*cur = *st
	}
}

// status is envoyproxy/ratelimit's GetResponseDescriptorStatus with its
// checkOverLimitThreshold, checkNearLimitThreshold and
// increaseShadowModeStats, for one op whose store result is res.
func (l *Limiter) status(lim *rules.Limit, op *Op, res *Result) Status {
	hits := op.Hits
	st := Status{Limit: lim, ResetAfter: res.ResetAfter, Counts: Counts{TotalHits: hits}}
	c := &st.Counts
	over := op.Capacity()
	near := uint64(math.Floor(float64(float32(over) * l.nearRatio)))
	before, after := res.Before, res.After
	if !res.Allowed {
		st.Code = OverLimit
		// The hits already over before this op are all over the limit;
		// otherwise only those past the threshold are, and the ones
		// between the near threshold and the limit are near it.
		overHits := hits
		if before < over {
			overHits = sub0(after, over)
			c.NearLimit = sub0(over, max(near, before))
		}
		c.OverLimit = overHits
		switch {
		case lim.Shadow:
			// What it would have refused; the descriptor's code is
			// the other limits' (see Check).
			c.OverLimit, c.ShadowOverLimit = 0, overHits
		case lim.ShadowMode:
			st.Code = OK
			c.ShadowMode = overHits
		}
		return st
	}
	st.Remaining = uint32(min(res.Remaining, math.MaxUint32))
	if after > near {
		if before >= near {
			c.NearLimit = hits
		} else {
			c.NearLimit = after - near
		}
	}
	c.WithinLimit = hits
	return st
}

// refundStatus is the status of a refund op (Descriptor.Refund) whose
// store result is res: OK, whatever the limit says, with the limit's
// Remaining and ResetAfter after it, and only TotalNegativeHits counted.
func refundStatus(lim *rules.Limit, op *Op, res *Result) Status {
	return Status{
		Limit:      lim,
		Remaining:  uint32(min(res.Remaining, math.MaxUint32)),
		ResetAfter: res.ResetAfter,
		Counts:     Counts{TotalNegativeHits: op.Hits},
	}
}

// sub0 is a - b, or 0 when b > a.
func sub0(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// cachedOverLimit is the status of a descriptor answered from the near
// cache: over the limit, all its hits counted as over, as envoyproxy/ratelimit
// counts a local-cache hit.
func cachedOverLimit(hits uint64, resetAfter time.Duration) Status {
	return Status{
		Code:       OverLimit,
		ResetAfter: max(resetAfter, 0),
		Counts:     Counts{TotalHits: hits, OverLimit: hits, OverLimitWithLocalCache: hits},
	}
}

// remember puts a key in the near cache when the store said that not even
// one more hit fits until ResetAfter: then every request for it until that
// time is over the limit whatever the store would say. Shadow-mode rules
// and shadow limits are never cached (they must keep answering OK), nor token buckets, whose
// ResetAfter is the time until the bucket is full rather than until one
// token is back.
//
// epoch is the near cache's epoch of the key when it was looked up,
// before the store was asked: a refund of the key that dropped it from
// the cache since (NearCache.Forget) may have freed room that the store's
// answer predates, and then it is not remembered.
func (l *Limiter) remember(lim *rules.Limit, op *Op, res *Result, now time.Time, epoch uint64) {
	if l.cfg.NearCache == nil || res.Allowed || res.Remaining > 0 || res.ResetAfter <= 0 || !cacheable(lim, op) {
		return
	}
	l.cfg.NearCache.rememberSince(epoch, op.Key, op.Capacity(), now, now.Add(res.ResetAfter))
}

// cacheable reports whether the near cache may hold op's key (see
// remember).
func cacheable(lim *rules.Limit, op *Op) bool {
	return !lim.ShadowMode && !lim.Shadow && op.Algorithm.OverUntilReset()
}

// unsafeString views b as a string without copying, for a lookup that does
// not keep it; b must not change while the string is in use.
func unsafeString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
