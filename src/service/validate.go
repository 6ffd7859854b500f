package service

import (
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// Request bounds. Envoy sends a handful of descriptors of a few entries;
// these bounds stop absurd or hostile requests before they cost memory or
// reach a store. A request past one is refused with InvalidArgument and the
// reason (docs/SECURITY.md, "Limits and hostile input", lists them).
const (
	// The lengths of the domain, keys and values are wire.MaxDomainLen,
	// wire.MaxKeyLen and wire.MaxValueLen, shared with the quota service.
	MaxDescriptors        = 256
	MaxEntriesPerDescribe = rules.MaxDepth // deeper rules are refused: no request could reach them
	// MaxHitsAddend is the largest hits_addend of a descriptor (the
	// request's own is a uint32 in the proto): every store counts that
	// exactly, and a larger value could wrap a store's counter.
	MaxHitsAddend = limiter.MaxHits
	// MaxOverrideWindow is the longest window a per-request limit
	// override may ask for: one YEAR (365 days), the longest unit. Longer
	// windows (YEAR × 4294967295 is centuries) would make state that never
	// expires.
	MaxOverrideWindow = 365 * 24 * time.Hour
)

// requestError is a bad request; it maps to codes.InvalidArgument.
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

func validate(req *rlsv3.RateLimitRequest) error {
	if msg, bad := wire.Malformed(req); bad {
		return badRequest("invalid RateLimitRequest: %s", msg)
	}
	domain := req.GetDomain()
	if domain == "" {
		return badRequest("rate limit domain must not be empty")
	}
	if len(domain) > wire.MaxDomainLen {
		return badRequest("rate limit domain is %d bytes long, the limit is %d", len(domain), wire.MaxDomainLen)
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return badRequest("rate limit descriptor list must not be empty")
	}
	if len(descs) > MaxDescriptors {
		return badRequest("request has %d descriptors, the limit is %d", len(descs), MaxDescriptors)
	}
	for i, d := range descs {
		// A descriptor without entries is answered OK without a limit, as
		// envoyproxy/ratelimit does: clients other than Envoy send them.
		entries := d.GetEntries()
		if len(entries) > MaxEntriesPerDescribe {
			return badRequest("descriptor %d has %d entries, the limit is %d", i, len(entries), MaxEntriesPerDescribe)
		}
		for j, e := range entries {
			if e.GetKey() == "" {
				return badRequest("descriptor %d entry %d has an empty key", i, j)
			}
			if len(e.GetKey()) > wire.MaxKeyLen {
				return badRequest("descriptor %d entry %d: key is %d bytes long, the limit is %d", i, j, len(e.GetKey()), wire.MaxKeyLen)
			}
			if len(e.GetValue()) > wire.MaxValueLen {
				return badRequest("descriptor %d entry %d: value is %d bytes long, the limit is %d", i, j, len(e.GetValue()), wire.MaxValueLen)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > MaxHitsAddend {
			return badRequest("descriptor %d: hits_addend %d is over the limit of %d", i, h.GetValue(), uint64(MaxHitsAddend))
		}
		if o := d.GetLimit(); o != nil {
			unit := rules.Unit(o.GetUnit())
			if unit.Seconds() == 0 { // UNKNOWN or out of range
				return badRequest("descriptor %d: limit override has unit %s", i, o.GetUnit())
			}
			mult := uint64(1)
			if m := o.GetUnitMultiplier(); m != nil {
				if mult = uint64(m.GetValue()); mult == 0 {
					return badRequest("descriptor %d: limit override has unit_multiplier 0", i)
				}
			}
			// At most 3.2e7 s × 4.3e9: no overflow in seconds.
			if secs := unit.Seconds() * int64(mult); secs > int64(MaxOverrideWindow/time.Second) {
				return badRequest("descriptor %d: limit override window %s × %d is longer than the limit of one YEAR", i, o.GetUnit(), mult)
			}
		}
	}
	return nil
}

// MaxSlidingLogHits bounds the hits a request may add to sliding_log rules,
// all its descriptors together: each such hit is one timestamp a store
// writes (on Redis, inside one script that holds the server). A key holds at
// most its limit (rules.MaxSlidingLog, 10,000), but a request of 256
// descriptors on 256 keys could otherwise write 2.5 million at once. A
// refund (is_negative_hits) writes none: it only drops timestamps, and
// costs a store what a hit on the key costs, so it is not counted.
const MaxSlidingLogHits = rules.MaxSlidingLog

// slidingLogBudget refuses a request whose matched sliding_log rules would
// take more than MaxSlidingLogHits hits in all.
func slidingLogBudget(ds []limiter.Descriptor) error {
	var sum uint64
	for i := range ds {
		l := ds[i].Limit
		switch {
		case l == nil, ds[i].Refund:
		case l.InList():
			for _, m := range l.Limits {
				if m.Algorithm.PerHit() && !m.Unlimited {
					// At most 2^32-1 each, MaxLimits a descriptor: no
					// overflow over 256 descriptors.
					sum += ds[i].Hits
				}
			}
		case l.Algorithm.PerHit():
			sum += ds[i].Hits // each at most 2^32-1: no overflow over 256 descriptors
		}
	}
	if sum > MaxSlidingLogHits {
		return badRequest("request adds %d hits to sliding_log rules, the limit is %d in all", sum, MaxSlidingLogHits)
	}
	return nil
}
