package rlqs

import (
	"cmp"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimit/src/quota"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// State is what the quota service holds now, for the live view's
// /api/v1/quota (docs/LIVE.md describes every field).
type State struct {
	// Enabled is false while the service answers Unimplemented
	// (RLQS_ENABLED empty and no quota_buckets).
	Enabled       bool        `json:"enabled"`
	Streams       int         `json:"streams"`
	Subscriptions int         `json:"subscriptions"`
	Rules         []RuleState `json:"rules"`
}

// RuleState is one quota rule: its limit and what its buckets hold.
type RuleState struct {
	Domain string `json:"domain"`
	// Rule is the rule's name, or quota_buckets[i]; Match its bucket
	// match as /rlconfig writes it.
	Rule   string `json:"rule"`
	Match  string `json:"match"`
	Source string `json:"source"`
	Policy string `json:"policy"`
	// Rate (requests a second) and Burst are each bucket's global limit;
	// 0 for deny_all and allow_all.
	Rate  float64 `json:"rate"`
	Burst uint32  `json:"burst"`
	// Buckets are the bucket ids with a pool, Subscribers the
	// subscriptions counted in them.
	Buckets     int `json:"buckets"`
	Subscribers int `json:"subscribers"`
	// MaxShare is the largest sum of the shares counted in one bucket,
	// over the rate: at most 1 outside the bound's transients.
	MaxShare float64 `json:"max_share"`
	// Allowed and Denied are the requests Envoys reported for the
	// rule's buckets, Beyond those the shares granted cannot account
	// for, since the start.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
	Beyond  uint64 `json:"beyond_share"`
	// Top are the buckets with the most demand, at most MaxStateBuckets.
	Top []BucketState `json:"top"`
}

// BucketState is one bucket id of a rule and its subscribers.
type BucketState struct {
	ID map[string]string `json:"id"`
	// Demand is the sum of its subscribers' demands (requests a second),
	// Share the sum of the shares counted, both over the rate.
	Demand      float64           `json:"demand"`
	Share       float64           `json:"share"`
	Subscribers []SubscriberState `json:"subscribers"`
}

// SubscriberState is one Envoy's stream reporting a bucket.
type SubscriberState struct {
	Stream uint64 `json:"stream"`
	// Peer is the stream's client address; empty once the stream closed.
	Peer string `json:"peer"`
	// Demand is its smoothed requests a second, -1 until measured; Rate
	// and Burst its grant; Counted the rate counted for it now.
	Demand  float64 `json:"demand"`
	Rate    float64 `json:"rate"`
	Burst   uint32  `json:"burst"`
	Counted float64 `json:"counted"`
	// Gone: its stream closed, its share counted until LeaseLeft ends.
	Gone      bool    `json:"gone"`
	LeaseLeft float64 `json:"lease_left_seconds"`
}

// Bounds of a State: the buckets shown per rule and the subscribers
// per bucket (the most demanding), so that the document stays small
// whatever the fleet.
const (
	MaxStateBuckets     = 10
	MaxStateSubscribers = 20
)

// stateChunk is how many pools State reads per hold of the lock: a
// report or a tick waits for that many at most, not for a walk of every
// pool (issue 35: 0.25-0.55 s per call at 99,000 buckets, with every open
// live view polling).
const stateChunk = 256

// State returns what the service holds now. It reads the pools a chunk
// at a time, so what it returns is not one instant's: each pool is read
// whole, and a pool made or dropped during the walk may be missed.
func (q *Service) State() State {
	now := q.cfg.Now()
	cfg := q.rules.Load()
	q.mu.Lock()
	st := State{
		Enabled:       !q.cfg.Auto || cfg.HasQuota(),
		Streams:       len(q.streams),
		Subscriptions: q.subs,
	}
	byRule := map[*rules.QuotaRule]*RuleState{}
	for _, r := range cfg.QuotaRules() {
		rs := &RuleState{
			Domain: r.Domain, Rule: ruleLabel(r), Source: r.Source, Policy: r.Policy.String(),
			Match: r.String(), Rate: r.Rate(),
		}
		if r.Policy.Limited() {
			rs.Burst = r.Capacity()
		}
		if t := q.ruleStats[r.Domain+"\x00"+ruleLabel(r)]; t != nil {
			rs.Allowed, rs.Denied, rs.Beyond = t.allowed.Value(), t.denied.Value(), t.beyond.Value()
		}
		byRule[r] = rs
	}
	q.mu.Unlock()
	tops := map[*rules.QuotaRule][]BucketState{}
	keys := q.poolKeys()
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), stateChunk)]
		keys = keys[len(chunk):]
		q.mu.Lock()
		for _, k := range chunk {
			if qp := q.pools[k]; qp != nil && byRule[qp.rule] != nil {
				b := q.bucketState(now, qp, byRule[qp.rule])
				tops[qp.rule] = topBuckets(append(tops[qp.rule], b))
			}
		}
		q.mu.Unlock()
		if q.stateHook != nil {
			q.stateHook()
		}
	}
	st.Rules = []RuleState{}
	for _, r := range cfg.QuotaRules() {
		rs := byRule[r]
		rs.Top = tops[r]
		if rs.Top == nil {
			rs.Top = []BucketState{}
		}
		st.Rules = append(st.Rules, *rs)
	}
	return st
}

// bucketState reads one pool for State and adds it to its rule's totals.
// q.mu is held.
func (q *Service) bucketState(now time.Time, qp *quotaPool, rs *RuleState) BucketState {
	var subs []quota.Subscriber
	switch {
	case qp.p != nil:
		subs = qp.p.Subscribers(now)
	case qp.sh != nil:
		// Another replica owns it: this one knows its own
		// subscribers' grants only.
		subs = qp.sh.subscribers()
	}
	rs.Buckets++
	rs.Subscribers += len(subs)
	b := BucketState{ID: qp.id}
	var demand, share float64
	for _, s := range subs {
		d := -1.0
		if s.DemandKnown {
			d = s.Demand
			demand += s.Demand
		}
		share += s.Committed
		var peer string
		if st := q.streams[s.ID]; st != nil {
			peer = st.peer
		}
		b.Subscribers = append(b.Subscribers, SubscriberState{
			Stream: s.ID, Peer: peer, Demand: d, Rate: s.Rate, Burst: s.Burst, Counted: s.Committed,
			Gone: s.Gone, LeaseLeft: max(0, s.Lease.Sub(now).Seconds()),
		})
	}
	if rs.Rate > 0 {
		b.Demand, b.Share = demand/rs.Rate, share/rs.Rate
	}
	rs.MaxShare = max(rs.MaxShare, b.Share)
	slices.SortFunc(b.Subscribers, func(x, y SubscriberState) int { return cmp.Compare(y.Demand, x.Demand) })
	b.Subscribers = b.Subscribers[:min(len(b.Subscribers), MaxStateSubscribers)]
	return b
}

// topBuckets keeps the MaxStateBuckets buckets with the most demand.
func topBuckets(bs []BucketState) []BucketState {
	slices.SortStableFunc(bs, func(x, y BucketState) int { return cmp.Compare(y.Demand, x.Demand) })
	return bs[:min(len(bs), MaxStateBuckets)]
}
