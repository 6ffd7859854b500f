package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// ErrUnavailable is wrapped by every store error that means the backend could
// not be reached or did not answer in time. The service maps it to the gRPC
// code Unavailable; Envoy's failure_mode_deny then decides what traffic sees.
var ErrUnavailable = errors.New("store unavailable")

// ErrOverloaded is wrapped by a store error that means the store shed the op
// at once because its own bound was reached (a full request queue, every
// connection slot taken until the request's deadline). It is not an outage:
// the store stays healthy. The service maps it to the gRPC code
// ResourceExhausted and counts it as load shed.
var ErrOverloaded = errors.New("store overloaded")

// ErrData is wrapped by a store error that the backend raised because of
// the data of the op or of its key (a key of another type, a value that is
// not a counter), not because it cannot serve. It is never an outage: the
// store stays healthy, the error never wraps ErrUnavailable, and the
// service answers codes.Internal for that request only.
var ErrData = errors.New("store refused the data")

// Reason is why a store failed, in words a caller may be told: it names no
// server, address, port or key (those are for the logs). A store wraps one
// in an error whose kind (ErrUnavailable, ErrOverloaded, ErrData) alone
// says too little for a caller to act on; the service sends a caller the
// kind and the reason, and logs the whole error.
type Reason string

func (r Reason) Error() string { return string(r) }

// The reasons the stores give.
const (
	// ReasonBreakerOpen: the server's circuit breaker is open, so the
	// request was refused without trying it (ErrUnavailable).
	ReasonBreakerOpen Reason = "circuit breaker open"
	// ReasonOutOfMemory: the store refused a write for lack of memory
	// (ErrOverloaded).
	ReasonOutOfMemory Reason = "out of memory"
)

// MaxHits is the largest Op.Hits the service sends: 2^32-1, the largest
// hits_addend a request may carry. Every store counts exactly up to its own
// range and saturates beyond it, so no sum of ops can wrap or reset a
// count, even if this bound is raised one day.
const MaxHits = 1<<32 - 1

// Op is one descriptor's hit on one key of a store.
type Op struct {
	// Key is the full cache key (see CacheKey). For fixed windows it ends
	// with the window start in Unix seconds, exactly as envoyproxy/ratelimit
	// builds it; for the other algorithms it names the algorithm and window.
	Key       string
	Algorithm rules.Algorithm
	// Limit is the number of hits admitted per Window (the refill per Window
	// for a token bucket). 0 refuses every hit.
	Limit uint64
	// Burst is the token bucket capacity; 0 means Limit. The other
	// algorithms ignore it.
	Burst uint64
	// Window is the length of the window (Unit × UnitMultiplier), a whole
	// number of seconds.
	Window time.Duration
	// Hits is the number of units this op consumes; 0 only reads the state.
	// It is at most MaxHits.
	Hits uint64
	// Refund makes the op give Hits back instead of consuming them
	// (is_negative_hits): each algorithm's pure function says how (see
	// Refunds in algorithm.go). A refund never creates a key that does
	// not exist, is never refused, and its Result is a read of the state
	// after it. The limiter never puts a refund in an AllOrNothing batch
	// (it sends a request's refunds in a batch of their own first), and
	// a store may rely on it.
	Refund bool
	// PerSecond is true for rules whose unit is second (REDIS_PERSECOND routing).
	PerSecond bool
	// Group is not 0 for the ops of one descriptor with several limits
	// (rules.Limit.Limits): they are next to each other in the batch,
	// share a Group, and a store that can applies them as one atomic step,
	// so that concurrent requests meet the limits in one order (Memcached
	// keeps them in one item, named after SplitListKey). Each op is still
	// decided and recorded by its own algorithm, unless the batch is
	// AllOrNothing. Where a store cannot (a Redis proxy, ops split between
	// the main and the per-second Redis) it applies them one by one, each
	// atomically, as ops of different descriptors.
	Group uint32
	// Shadow marks the op of a shadow limit (rules.Limit.Shadow): it is
	// decided and recorded as if it were alone in a batch of its own. Its
	// refusal makes no other op refused, and no other op's refusal takes
	// it back; in an AllOrNothing batch it is recorded only when it is
	// itself allowed (Results as for a refused AllOrNothing batch of that
	// one op otherwise). It is still part of its group's atomic step. The
	// limiter never gives a shadow op the key of another op of the batch
	// that is not a shadow op (their algorithms or windows differ), and a
	// store may rely on it.
	Shadow bool
	// Rule names the rule whose limit the op applies: its statistics key
	// (rules.Limit.FullKey), which the limits of one rate_limits list
	// share, or the domain for a limit the descriptor carries itself. The
	// memory store keeps the keys over their limit that it can no longer
	// hold one by one in a filter per rule, so that a flood of one rule's
	// keys costs the other rules nothing (see memory.Store); the other
	// stores ignore it.
	Rule string
}

// Capacity is the most units the op's key can hold at once, the threshold
// above which Result.After means "over the limit": Burst (or Limit when
// Burst is 0) for a token bucket, Limit otherwise. It is 0 when Limit is 0,
// whatever Burst says.
func (op Op) Capacity() uint64 {
	if op.Algorithm.HasBurst() && op.Burst > 0 && op.Limit > 0 {
		return op.Burst
	}
	return op.Limit
}

// Result is what a store reports for one Op. Every store fills it with the
// values of the algorithm's pure function (FixedWindow, SlidingWindow,
// SlidingLog, TokenBucket), so stores agree to the unit.
type Result struct {
	// Before and After are the units in use before and after the op, in the
	// algorithm's own measure (the window count for fixed windows, the
	// weighted estimate for sliding windows, the number of logged hits for a
	// sliding log, capacity minus whole tokens for a token bucket). For an op
	// that was refused and therefore not recorded, After is Before + Hits:
	// what it would have been. After > op.Capacity() exactly when the op
	// is over its limit. The limiter derives near/over-limit statistics
	// from them. For a refund both are the units in use after it.
	Before, After uint64
	// Allowed reports whether the hits fit within the limit. For a fixed
	// window it is After <= Limit: the hits are recorded either way. A
	// refund is always allowed.
	Allowed bool
	// Remaining is how many more units would be admitted now, after the op.
	Remaining uint64
	// ResetAfter is the algorithm's reset time (see the table in algorithm.go).
	ResetAfter time.Duration
}

// Batch is all the ops of one request. Stores fill Results[i] for Ops[i].
type Batch struct {
	// Now is the time of the request. Stores that keep time themselves
	// (Redis for every algorithm but fixed_window) may ignore it; the memory
	// store honours it, so tests inject time.
	Now time.Time
	Ops []Op
	// Results has len(Ops) when the limiter calls Do; a store given a
	// shorter slice grows it.
	Results []Result
	// AllOrNothing asks that no op is recorded when any op of the batch would
	// exceed its limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), fixed
	// windows included, and that the check and the recording are one atomic
	// step across all the batch's keys. The ops are evaluated in order, an
	// op seeing the earlier ops of the batch on the same key. When an op is
	// refused nothing is recorded, and Results keep Allowed, Before and
	// After of that evaluation (so After is Before + Hits for every op, and
	// the second of two ops on a key with room for one is refused), while
	// Remaining and ResetAfter are those of the unchanged state (a read
	// with Hits 0).
	AllOrNothing bool
}

// SizeResults makes b.Results exactly len(b.Ops) long, reusing its array
// when it is large enough, and returns that length. Stores call it first in
// Do.
func (b *Batch) SizeResults() int {
	n := len(b.Ops)
	if cap(b.Results) < n {
		b.Results = make([]Result, n)
	}
	b.Results = b.Results[:n]
	return n
}

// Store keeps the state of every key and applies ops to it.
//
// Do applies every op of the batch and fills its Results. Each op is applied
// atomically: concurrent batches that touch the same key never lose or
// double-count a hit, and no op is split into a read and a later write.
// Stores are safe for concurrent use. Do checks ctx before it starts and
// returns an error wrapping ErrUnavailable when the backend cannot be
// reached or cannot answer within ctx's deadline, ErrOverloaded when the
// store shed the batch at its own bound, and ErrData when the backend
// refused an op for its data; then no result is meaningful, and ops before
// the failing one may have been recorded unless the batch is AllOrNothing,
// except that with ErrData, in a batch that is not AllOrNothing, the Redis
// and Memcached stores fill the Result of every op they applied and leave
// the others' as they were (so that one key's data fails no other key).
// Counts saturate: a count that would pass the store's range stays at its
// largest value (over any limit) instead of wrapping or failing.
//
// Do must not keep b, its slices or its strings' backing memory after it
// returns: the limiter reuses the batch for the next request.
type Store interface {
	Do(ctx context.Context, b *Batch) error
}
