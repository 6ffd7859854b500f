package main

import (
	"fmt"
	"maps"
	"slices"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimit/src/rlqs"
)

// envoy mimics the rate_limit_quota filter of one Envoy 1.40 process and
// its one stream to the service, as docs/RLQS.md describes it (read in
// Envoy's source and checked against the binary):
//
//   - a bucket is created by its first request, which no_assignment_behavior
//     decides (here ALLOW_ALL, Envoy's default), and reported at once with
//     time_elapsed 0; until its first assignment arrives the same applies;
//   - the stream opens with the first bucket, and from then every bucket is
//     reported every interval, time_elapsed whole seconds rounded down;
//   - a token bucket refills continuously at tokens_per_fill per whole
//     second of fill_interval, starts full, and when it replaces a token
//     bucket starts with the fraction of max_tokens the old one had; it is
//     kept when max_tokens, tokens_per_fill and the nanoseconds of
//     fill_interval are unchanged;
//   - an assignment expires TTL (whole seconds) after it arrived, back to
//     no_assignment_behavior (counted as a fallback: never expected);
//   - an abandon drops the bucket; the next request creates it again;
//   - when its stream ends, Envoy keeps its assignments and opens a new
//     stream at its next report.
type envoy struct {
	id int
	// spent is the time spent in the service's calls (Report, Take) on
	// behalf of this Envoy.
	spent    time.Duration
	interval time.Duration
	// q is the replica its stream goes to, rep its number; the fleet
	// moves it to another when that one dies.
	q       *rlqs.Service
	rep     int
	sess    *rlqs.Session
	buckets map[string]*bucket
	// nextTick is the next report, zero until the first bucket.
	nextTick time.Time
	// inbox holds the service's responses until they arrive.
	inbox []delivery
	// discrete reads token buckets as the proto's text does:
	// tokens_per_fill once every fill_interval, up to max_tokens, not
	// continuously as Envoy 1.40 does.
	discrete bool
}

type delivery struct {
	at   time.Time
	resp *rlqsv3.RateLimitQuotaResponse
}

// bucket is one bucket of one Envoy.
type bucket struct {
	tenant string
	id     *rlqsv3.BucketId
	// assignment in force, nil for none (no_assignment_behavior).
	action  *rlqsv3.RateLimitQuotaResponse_BucketAction
	expires time.Time
	// tokens of the token bucket in force; rate and max are what Envoy
	// read from its assignment. With discrete, fill tokens are added at
	// nextFill and every interval after.
	tokens, rate, max float64
	fill              float64
	interval          time.Duration
	nextFill          time.Time
	// assigned: an assignment arrived since the bucket was created.
	assigned bool

	allowed, denied uint64
	lastReport      time.Time
	// counts of the current step, read by the fleet.
	stepAllowed, stepJoin, stepFallback int
}

func newEnvoy(id int, interval time.Duration, q *rlqs.Service) *envoy {
	return &envoy{id: id, interval: interval, q: q, buckets: map[string]*bucket{}}
}

// request is one request of tenant at now; it reports whether Envoy
// admitted it.
func (e *envoy) request(now time.Time, tenant string) bool {
	b := e.buckets[tenant]
	if b == nil {
		b = &bucket{tenant: tenant, id: &rlqsv3.BucketId{Bucket: map[string]string{"name": "api", "tenant": tenant}}, lastReport: now}
		e.buckets[tenant] = b
		b.allowed++
		b.stepAllowed++
		b.stepJoin++
		if e.nextTick.IsZero() {
			e.nextTick = now.Add(e.interval)
		}
		e.send(now, []*bucket{b}, true)
		return true
	}
	if b.action != nil && !now.Before(b.expires) {
		b.action = nil
	}
	if b.action == nil {
		b.allowed++
		b.stepAllowed++
		if b.assigned {
			b.stepFallback++
		} else {
			b.stepJoin++
		}
		return true
	}
	s := b.action.GetQuotaAssignmentAction().GetRateLimitStrategy()
	switch {
	case isBlanket(s, typev3.RateLimitStrategy_ALLOW_ALL):
	case isBlanket(s, typev3.RateLimitStrategy_DENY_ALL):
		b.denied++
		return false
	case b.tokens >= 1:
		b.tokens--
	default:
		b.denied++
		return false
	}
	b.allowed++
	b.stepAllowed++
	return true
}

func isBlanket(s *typev3.RateLimitStrategy, r typev3.RateLimitStrategy_BlanketRule) bool {
	b, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok && b.BlanketRule == r
}

// advance refills token buckets over dt, delivers the responses due and
// sends the reports due at now.
func (e *envoy) advance(now time.Time, dt time.Duration) {
	if e.sess != nil {
		select {
		case <-e.sess.Done():
			// The replica ended the stream (it cannot reach Redis):
			// Envoy opens another at its next report.
			e.sess = nil
		default:
		}
	}
	for _, b := range e.buckets {
		switch {
		case b.action == nil || b.max == 0:
		case e.discrete:
			for ; !now.Before(b.nextFill); b.nextFill = b.nextFill.Add(b.interval) {
				b.tokens = min(b.max, b.tokens+b.fill)
			}
		default:
			b.tokens = min(b.max, b.tokens+b.rate*dt.Seconds())
		}
	}
	kept := e.inbox[:0]
	for _, d := range e.inbox {
		if d.at.After(now) {
			kept = append(kept, d)
			continue
		}
		e.apply(now, d.resp)
	}
	e.inbox = kept
	if !e.nextTick.IsZero() && !now.Before(e.nextTick) {
		e.nextTick = e.nextTick.Add(e.interval)
		keys := slices.Sorted(maps.Keys(e.buckets))
		bs := make([]*bucket, 0, len(keys))
		for _, k := range keys {
			bs = append(bs, e.buckets[k])
		}
		if len(bs) > 0 {
			e.send(now, bs, false)
		}
	}
}

// send reports buckets; initial is the report of a bucket just created.
func (e *envoy) send(now time.Time, bs []*bucket, initial bool) {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "web"}
	for _, b := range bs {
		elapsed := int64(0)
		if !initial {
			elapsed = int64(now.Sub(b.lastReport) / time.Second)
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           b.id,
			TimeElapsed:        &durationpb.Duration{Seconds: elapsed},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	if e.sess == nil {
		s, err := e.q.Open()
		if err != nil {
			// Reports of a tick with no stream are dropped, as Envoy does.
			return
		}
		e.sess = s
	}
	began := time.Now()
	err := e.sess.Report(m)
	e.count(time.Since(began))
	if err != nil {
		panic(fmt.Sprintf("envoy %d: report refused: %v", e.id, err))
	}
}

// collect takes what the service has for this Envoy, to arrive after
// delay.
func (e *envoy) collect(now time.Time, delay time.Duration) {
	if e.sess == nil {
		return
	}
	began := time.Now()
	r := e.sess.Take()
	e.count(time.Since(began))
	if r != nil {
		// A stream delivers in order: never before the one taken before.
		at := now.Add(delay)
		if len(e.inbox) > 0 && e.inbox[len(e.inbox)-1].at.After(at) {
			at = e.inbox[len(e.inbox)-1].at
		}
		e.inbox = append(e.inbox, delivery{at: at, resp: r})
	}
}

// count adds a call to the service that took d.
func (e *envoy) count(d time.Duration) {
	e.spent += d
}

// lose drops the stream without a word, as when its replica is killed:
// the next report opens a new one, to q.
func (e *envoy) lose(q *rlqs.Service, rep int) {
	e.sess, e.q, e.rep = nil, q, rep
}

// reconnect ends the stream; the next report opens a new one.
func (e *envoy) reconnect() {
	if e.sess != nil {
		e.sess.Close()
		e.sess = nil
	}
	e.inbox = nil
}

// apply is Envoy taking a response.
func (e *envoy) apply(now time.Time, r *rlqsv3.RateLimitQuotaResponse) {
	for _, a := range r.GetBucketAction() {
		b := e.buckets[a.GetBucketId().GetBucket()["tenant"]]
		if b == nil {
			continue // not a bucket it has: Envoy logs and ignores it
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, b.tenant)
			continue
		}
		ttl := time.Duration(a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds()) * time.Second
		b.expires, b.assigned = now.Add(ttl), true
		tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
		old := b.action.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
		switch {
		case tb == nil:
			b.tokens, b.rate, b.max = 0, 0, 0
		case old != nil && old.GetMaxTokens() == tb.GetMaxTokens() &&
			old.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
			old.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos():
			// Envoy keeps the token bucket in force, its rate
			// included; only the TTL starts again.
			continue
		case old != nil:
			b.tokens = float64(tb.GetMaxTokens()) * b.tokens / b.max
			b.rate, b.max = tokenRate(tb), float64(tb.GetMaxTokens())
		default:
			b.tokens, b.rate, b.max = float64(tb.GetMaxTokens()), tokenRate(tb), float64(tb.GetMaxTokens())
		}
		if tb != nil {
			b.fill, b.interval = float64(tb.GetTokensPerFill().GetValue()), tb.GetFillInterval().AsDuration()
			b.nextFill = now.Add(b.interval)
		}
		b.action = a
	}
}

// tokenRate is the rate Envoy reads: tokens_per_fill per whole second of
// fill_interval.
func tokenRate(tb *typev3.TokenBucket) float64 {
	secs := tb.GetFillInterval().GetSeconds()
	if secs == 0 {
		panic("fill_interval under a second: Envoy would divide by zero")
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
}
