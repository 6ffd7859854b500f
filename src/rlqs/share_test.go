package rlqs_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/quota"
	"github.com/ratelimitd/ratelimit/src/rlqs"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/redis"
)

// Replicas of the quota service sharing their pools through a real
// redis-server, on one fake clock, with Envoys mimicked in the test: each
// keeps the assignment it was last sent until its TTL, reports every 5 s
// and, when its replica dies, opens a stream to another at its next
// report. The property checked at every step of 100 ms is the invariant
// behind docs/RLQS.md's bound: the rates of the assignments in force, all
// Envoys on all replicas together, never add up to more than the limit.

const sharedRules = `domain: web
quota_buckets:
  - bucket: {tenant: "*"}
    rate_limit: {unit: second, requests_per_unit: 60, burst: 12}
`

const sharedRate = 60.0

// fleet is n replicas on one Redis.
type fleet struct {
	t     *testing.T
	srv   *harness.RedisServer
	clock atomic.Pointer[time.Time]
	reps  []*replica
	// envoys are the mimicked Envoys, each with one bucket of tenant a.
	envoys []*mimic
	// steps counts the steps, for the replicas' ticks; noPolls: the
	// replicas only tick.
	steps   int
	noPolls bool
}

type replica struct {
	q    *rlqs.Service
	reg  *stats.Registry
	dead bool
	// paused: alive, its streams open, but it neither ticks nor polls
	// (a process starved on a busy machine).
	paused bool
}

// mimic is an Envoy with one bucket.
type mimic struct {
	name   string
	rep    int
	sess   *rlqs.Session
	demand float64
	// tb is the token bucket in force and expires its end; assigned is
	// set once one arrived.
	tb       *typev3.TokenBucket
	expires  time.Time
	assigned bool
	// expired counts the steps it reported with no assignment in force
	// after it had one: a lease not renewed.
	expired int
	// allowed and denied since its last report, in requests.
	allowed, denied float64
	next            time.Time
	reported        bool
}

func newFleet(t *testing.T, n int) *fleet {
	t.Helper()
	return newFleetTimeout(t, n, time.Second)
}

// newFleetTimeout is newFleet with the stores' timeout (REDIS_TIMEOUT).
func newFleetTimeout(t *testing.T, n int, timeout time.Duration) *fleet {
	t.Helper()
	return newFleetShare(t, n, timeout, func(_ int, s *redis.Store) rlqs.Share { return s })
}

// newFleetShare is newFleetTimeout with each replica's store as share
// makes it.
func newFleetShare(t *testing.T, n int, timeout time.Duration, share func(i int, s *redis.Store) rlqs.Share) *fleet {
	t.Helper()
	f := &fleet{t: t, srv: harness.StartRedis(t, harness.RedisOptions{})}
	now := epoch
	f.clock.Store(&now)
	cfg, err := rules.Parse([]rules.File{{Name: "q.yaml", Data: []byte(sharedRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		st, err := redis.New(t.Context(), redis.Config{URL: f.srv.Addr, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		r := &replica{reg: stats.NewRegistry()}
		r.q = rlqs.New(r.reg, rlqs.Config{
			Share:   share(i, st),
			Replica: uint32(i + 1),
			Now:     func() time.Time { return *f.clock.Load() },
		})
		r.q.SetRules(cfg)
		f.reps = append(f.reps, r)
	}
	return f
}

func (f *fleet) now() time.Time { return *f.clock.Load() }

// add starts an Envoy on replica rep with demand (requests a second); its
// first request creates its bucket.
func (f *fleet) add(name string, rep int, demand float64) *mimic {
	e := &mimic{name: name, rep: rep, demand: demand, next: f.now()}
	f.envoys = append(f.envoys, e)
	return e
}

// kill stops a replica at once, as SIGKILL does: its streams are gone
// with it, and it says nothing to the store.
func (f *fleet) kill(i int) {
	f.reps[i].dead = true
	for _, e := range f.envoys {
		if e.rep == i {
			e.sess = nil
		}
	}
}

func (f *fleet) live() []int {
	var out []int
	for i, r := range f.reps {
		if !r.dead {
			out = append(out, i)
		}
	}
	return out
}

const fleetStep = 100 * time.Millisecond

// step advances the clock by fleetStep: Envoys take what they were sent,
// serve their demand, report when due; each replica ticks once a second,
// at its own offset.
func (f *fleet) step() {
	t := f.t
	t.Helper()
	now := f.now().Add(fleetStep)
	f.clock.Store(&now)
	f.steps++
	for i, r := range f.reps {
		switch {
		case r.dead, r.paused:
		case f.steps%10 == (3*i+1)%10:
			r.q.Tick()
		case !f.noPolls:
			r.q.Poll() // every 100 ms, as Run does
		}
	}
	for _, e := range f.envoys {
		f.take(e)
		inForce := e.tb != nil && now.Before(e.expires)
		if e.assigned && !inForce {
			e.expired++
		}
		served := e.demand * fleetStep.Seconds()
		switch {
		case !e.assigned:
			e.allowed += served // no_assignment_behavior: ALLOW_ALL
		case inForce:
			a := min(served, rate(e.tb)*fleetStep.Seconds())
			e.allowed += a
			e.denied += served - a
		default:
			e.denied += served
		}
		if !now.Before(e.next) {
			f.report(e)
		}
	}
}

// report sends e's usage, opening a stream to a live replica if it has
// none (its own, or the next one that lives).
func (f *fleet) report(e *mimic) {
	t := f.t
	t.Helper()
	now := f.now()
	if e.sess == nil {
		live := f.live()
		if f.reps[e.rep].dead {
			e.rep = live[0]
		}
		s, err := f.reps[e.rep].q.Open()
		if err != nil {
			e.next = now.Add(5 * time.Second)
			return
		}
		e.sess = s
	}
	elapsed := int64(0)
	if e.reported {
		elapsed = 5
	}
	err := e.sess.Report(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           bucketID("tenant", "a"),
		TimeElapsed:        &durationpb.Duration{Seconds: elapsed},
		NumRequestsAllowed: uint64(e.allowed),
		NumRequestsDenied:  uint64(e.denied),
	}}})
	if err != nil {
		t.Fatalf("%s: report refused: %v", e.name, err)
	}
	e.allowed, e.denied, e.reported, e.next = 0, 0, true, now.Add(5*time.Second)
}

// take applies what e's stream was sent, as Envoy 1.40 does: a token
// bucket with the same max_tokens, tokens_per_fill and nanoseconds of
// fill_interval is kept, rate included.
func (f *fleet) take(e *mimic) {
	if e.sess == nil {
		return
	}
	select {
	case <-e.sess.Done():
		e.sess = nil
		return
	default:
	}
	r := e.sess.Take()
	for _, a := range r.GetBucketAction() {
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		tb := qa.GetRateLimitStrategy().GetTokenBucket()
		if tb == nil {
			tb = &typev3.TokenBucket{} // a deny: no tokens
		}
		e.assigned = true
		e.expires = f.now().Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
		old := e.tb
		if old != nil && old.GetMaxTokens() == tb.GetMaxTokens() && old.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
			old.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos() {
			continue
		}
		e.tb = tb
	}
}

func rate(tb *typev3.TokenBucket) float64 {
	if tb.GetFillInterval().GetSeconds() == 0 {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// inForce is the sum of the rates in force now.
func (f *fleet) inForce() (sum float64, each []string) {
	now := f.now()
	for _, e := range f.envoys {
		if e.tb != nil && now.Before(e.expires) {
			sum += rate(e.tb)
			each = append(each, fmt.Sprintf("%s@%d: %.2f", e.name, e.rep, rate(e.tb)))
		}
	}
	return sum, each
}

// run steps for d, checking the invariant at each step once from has
// passed.
func (f *fleet) run(d time.Duration, from time.Time) {
	f.t.Helper()
	for range int(d / fleetStep) {
		f.step()
		if f.now().Before(from) {
			continue
		}
		if sum, each := f.inForce(); sum > sharedRate+1e-9 {
			f.t.Fatalf("at %v the rates in force add up to %.2f > %v: %s", f.now().Sub(epoch), sum, sharedRate, strings.Join(each, ", "))
		}
	}
}

func (f *fleet) owner() int {
	for i, r := range f.reps {
		if !r.dead && r.reg.Gauges()["ratelimit.rlqs.shared.owned"] == 1 {
			return i
		}
	}
	return -1
}

// TestSharedQuotaReplicas: three replicas share one limit through Redis;
// Envoys on all three are granted max-min fair shares that never add up
// to more than the limit, through the death of the pool's owner (its
// Envoys open streams to another replica, which takes the pool over from
// the state it wrote) and of another replica.
func TestSharedQuotaReplicas(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3)
	demands := []float64{40, 30, 20, 8, 4, 2}
	for i, d := range demands {
		f.add(fmt.Sprintf("e%d", i), i%3, d)
	}
	// The shared pools learn for TTL + Settle after they start.
	learned := epoch.Add(quota.DefaultTTL + 3*time.Second)
	f.run(40*time.Second, learned)
	check := func(what string) {
		t.Helper()
		// 57/s to share max-min fairly: 2, 4 and 8 are met, 14.33 each
		// for the other three.
		fair := quota.Waterfill(sharedRate*(1-quota.DefaultReserve), demands)
		sum, each := f.inForce()
		t.Logf("%s: %.2f/s in force: %s", what, sum, strings.Join(each, ", "))
		for i, e := range f.envoys {
			if got := rate(e.tb); math.Abs(got-fair[i]) > 0.15*fair[i]+0.5 {
				t.Errorf("%s: %s@%d has %.2f/s, want about %.2f", what, e.name, e.rep, got, fair[i])
			}
		}
	}
	check("three replicas")

	owner := f.owner()
	if owner < 0 {
		t.Fatal("no replica owns the pool")
	}
	t.Logf("killing the owner, replica %d", owner)
	f.kill(owner)
	// Its Envoys report to another replica within 5 s, the pool is taken
	// over within the lease and a tick, and the leases of the dead
	// replica's subscribers end TTL + Settle after their last grant.
	f.run(45*time.Second, learned)
	check("after the owner died")
	var takeovers uint64
	for _, r := range f.reps {
		takeovers += r.reg.Counter("ratelimit.rlqs.shared.takeovers").Value()
	}
	if takeovers != 1 || f.owner() < 0 {
		t.Errorf("takeovers = %d, owner %d: want the pool taken over once", takeovers, f.owner())
	}

	other := f.live()[0]
	if other == f.owner() {
		other = f.live()[1]
	}
	t.Logf("killing replica %d", other)
	f.kill(other)
	f.run(45*time.Second, learned)
	check("one replica left")
	for _, e := range f.envoys {
		if e.expired > 0 {
			t.Errorf("%s: no assignment in force for %v while it reported", e.name, time.Duration(e.expired)*fleetStep)
		}
	}
}

// splitInTwo runs two replicas and Envoys a, on replica 1, and b, on
// replica 0, of 100/s each, which first report aAt and bAt after the
// start, until d after it, and checks that replica owner owns their pool,
// split in two.
func splitInTwo(t *testing.T, aAt, bAt, d time.Duration, owner int) (f *fleet, a, b *mimic, learned time.Time) {
	t.Helper()
	f = newFleet(t, 2)
	b = f.add("b", 0, 100)
	b.next = epoch.Add(bAt)
	a = f.add("a", 1, 100)
	a.next = epoch.Add(aAt)
	learned = epoch.Add(quota.DefaultTTL + 5*time.Second)
	f.run(d, learned)
	if f.owner() != owner || rate(a.tb) < 25 || rate(b.tb) < 25 {
		t.Fatalf("before the kill: owner %d, a %v/s, b %v/s; want replica %d to own a pool split in two", f.owner(), rate(a.tb), rate(b.tb), owner)
	}
	return f, a, b, learned
}

// TestSharedQuotaTakeoverResumes: the replica that takes a pool over
// resumes from the state its dead owner wrote. Here the owner dies just
// before its own Envoy reports to the other replica, which takes the pool
// over with that report in hand while its own Envoy, which holds half of
// the limit, will not report for 4 s: a new owner that did not know that
// grant would give the reconnected Envoy the whole limit beside it.
func TestSharedQuotaTakeoverResumes(t *testing.T) {
	t.Parallel()
	// a's report at 34 s is taken by the owner's tick at 35.1 s.
	f, a, b, learned := splitInTwo(t, 4*time.Second, 500*time.Millisecond, 35200*time.Millisecond, 0)
	f.kill(0)
	killed := f.now()
	for f.owner() != 1 && f.now().Sub(killed) < 10*time.Second {
		f.run(time.Second, learned)
	}
	if f.owner() != 1 {
		t.Fatal("replica 1 did not take the pool over")
	}
	// The dead replica's subscriber is counted from the state, until b's
	// reconnect (its first report says time_elapsed 5 s) ends its lease,
	// Settle after b's first grant: within 10 s of the death, not the 17.5 s
	// after its last grant its lease had.
	deadCounted := func() bool {
		for _, s := range f.reps[1].q.State().Rules[0].Top[0].Subscribers {
			if s.Stream>>32 == 1 && s.Counted > 0 {
				return true
			}
		}
		return false
	}
	if !deadCounted() {
		t.Errorf("the new owner does not count the dead replica's subscriber: %+v", f.reps[1].q.State().Rules[0].Top[0].Subscribers)
	}
	f.run(killed.Add(10*time.Second).Sub(f.now()), learned)
	if deadCounted() || rate(b.tb) < 25 {
		t.Errorf("10 s after the death: b %v/s, the dead replica's subscriber counted %v; want b's old lease ended and its share back",
			rate(b.tb), deadCounted())
	}
	f.run(30*time.Second, learned)
	if ra, rb := rate(a.tb), rate(b.tb); math.Abs(ra-28.5) > 1 || math.Abs(rb-28.5) > 1 {
		t.Errorf("after the takeover: a %v/s, b %v/s; want 28.5 each", ra, rb)
	}
}

// TestSharedQuotaReconnectServedAfterSettle: a dead replica's Envoy that
// reconnects to the pool's owner is granted what is free at once, and its
// share once the old lease its reconnect ends is over, Settle later: at
// the owner's first poll after that, not at its next tick, up to a second
// later.
func TestSharedQuotaReconnectServedAfterSettle(t *testing.T) {
	t.Parallel()
	f, _, b, learned := splitInTwo(t, 0, 2*time.Second, 32*time.Second, 1)
	// b reports next 5 s after the death, once its old subscriber is
	// taken as gone (3 s after its replica's last beat); without the
	// owner's poll at the end of that lease, b waited 0.8 s more here.
	f.kill(0)
	var first time.Time
	for f.now().Before(b.next.Add(rlqs.SharedSettle + 2*time.Second)) {
		f.run(fleetStep, learned)
		switch {
		case first.IsZero() && b.sess != nil && rate(b.tb) < 25:
			first = f.now()
		case !first.IsZero() && rate(b.tb) >= 25:
			if d := f.now().Sub(first); d > rlqs.SharedSettle+2*fleetStep {
				t.Errorf("b's share came %v after its first grant, want within Settle (%v) and a poll", d, rlqs.SharedSettle)
			}
			return
		}
	}
	t.Fatalf("b's share not back %v after its reconnect (first grant at %v)", rlqs.SharedSettle+2*time.Second, first.Sub(epoch))
}

// TestSharedQuotaWithoutSharing: the same Envoys on replicas that do not
// share (each its own pools) are granted the limit each, beyond it in
// all: what TestSharedQuotaReplicas shows sharing prevents.
func TestSharedQuotaWithoutSharing(t *testing.T) {
	t.Parallel()
	cfg, err := rules.Parse([]rules.File{{Name: "q.yaml", Data: []byte(sharedRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for range 2 {
		q := rlqs.New(stats.NewRegistry(), rlqs.Config{Pool: quota.Config{Start: epoch.Add(-time.Hour)}, Now: func() time.Time { return epoch }})
		q.SetRules(cfg)
		s, err := q.Open()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Report(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: bucketID("tenant", "a"), NumRequestsAllowed: 1}}}); err != nil {
			t.Fatal(err)
		}
		sum += rateOf(tokenBucket(s.Take(), "tenant", "a"))
	}
	if sum <= sharedRate {
		t.Fatalf("two unshared replicas granted %v/s together; this test expects them over the limit", sum)
	}
}

// TestSharedQuotaStoreDown: while Redis is unreachable nothing new is
// granted; after shareDownAfter the replica ends its streams and refuses
// new ones with Unavailable, so that Envoys go to a replica that reaches
// Redis; once Redis is back it serves again, from the state it kept.
func TestSharedQuotaStoreDown(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	e := f.add("e", 0, 100)
	f.run(25*time.Second, epoch.Add(time.Hour))
	if e.tb == nil || e.sess == nil {
		t.Fatal("no assignment before the outage")
	}
	before := rate(e.tb)
	if err := f.srv.Stop(); err != nil {
		t.Fatal(err)
	}
	sess := e.sess
	f.run(4*time.Second, epoch.Add(time.Hour))
	select {
	case <-sess.Done():
		if c := status.Code(sess.Err()); c != codes.Unavailable {
			t.Errorf("stream ended with %v, want Unavailable", sess.Err())
		}
	default:
		t.Fatal("the stream is still open 4 s into the outage")
	}
	if _, err := f.reps[0].q.Open(); status.Code(err) != codes.Unavailable {
		t.Errorf("Open during the outage = %v, want Unavailable", err)
	}
	if got := rate(e.tb); got != before {
		t.Errorf("assignment changed during the outage: %v, was %v", got, before)
	}
	if n := f.reps[0].reg.Counter("ratelimit.rlqs.shared.errors").Value(); n == 0 {
		t.Error("no error counted during the outage")
	}
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	f.run(12*time.Second, epoch.Add(time.Hour))
	if e.sess == nil || !e.assigned || e.expires.Before(f.now().Add(10*time.Second)) {
		t.Errorf("after the outage: stream %v, assignment until %v; want a stream and a renewed assignment", e.sess != nil, e.expires.Sub(epoch))
	}
}

// TestSharedQuotaLearnsAfterDataLoss: when Redis loses its data (a
// restart without persistence), the Envoys keep the grants they had; the
// pool starts again knowing none of them, so it learns: no Envoy is
// granted more than it was seen admitting until they have all ended.
// Here the Envoy that held little wants much more from the moment of the
// loss; without learning it would be granted most of the limit while the
// other's large grant is still in force.
func TestSharedQuotaLearnsAfterDataLoss(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	big, small := f.add("big", 0, 100), f.add("small", 1, 5)
	f.run(40*time.Second, epoch.Add(time.Hour))
	seen := rate(small.tb)
	if seen > 6 || rate(big.tb) < 45 {
		t.Fatalf("before the loss: big %v/s, small %v/s; want small's demand met and big the rest", rate(big.tb), seen)
	}
	c := redisClient(t, f.srv.Addr)
	if err := c("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	lost := f.now()
	small.demand = 100
	// Until the learning period ends (a report interval and a second,
	// then the replicas' Settle), when every Envoy that held a grant has
	// reported and been answered.
	for f.now().Before(lost.Add(quota.DefaultReportInterval + 3*time.Second)) {
		f.run(fleetStep, epoch.Add(time.Hour))
		if r := rate(small.tb); r > seen+1 {
			t.Fatalf("%v after the loss: small granted %v/s, above the %v/s it held, while big's %v/s may be in force",
				f.now().Sub(lost), r, seen, rate(big.tb))
		}
	}
}

// redisClient returns a function that runs a command on addr.
func redisClient(t *testing.T, addr string) func(args ...any) error {
	c := goredis.NewClient(&goredis.Options{Addr: addr, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	return func(args ...any) error { return c.Do(t.Context(), args...).Err() }
}

// TestSharedQuotaLateGrantKeepsItsLease: a grant a replica sends late (it
// did not tick for seconds) is sent with what is left of its lease as its
// TTL, so that its Envoy does not hold it longer than the owner counts it,
// and it is counted as late.
func TestSharedQuotaLateGrantKeepsItsLease(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	owner, follower := f.reps[0], f.reps[1]
	report := func(s *rlqs.Session) {
		t.Helper()
		if err := s.Report(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: bucketID("tenant", "a"), NumRequestsAllowed: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	advance := func(d time.Duration) {
		now := f.now().Add(d)
		f.clock.Store(&now)
	}
	a, err := owner.q.Open()
	if err != nil {
		t.Fatal(err)
	}
	report(a)
	owner.q.Tick()
	if a.Take() == nil {
		t.Fatal("the owner's own stream got nothing at its tick")
	}
	b, err := follower.q.Open()
	if err != nil {
		t.Fatal(err)
	}
	report(b)
	follower.q.Tick() // hands the report over
	if b.Take() != nil {
		t.Fatal("a report was answered before the pool's owner ran it")
	}
	advance(300 * time.Millisecond)
	owner.q.Tick()
	// The follower stalls, within the owner's lease (3 s).
	advance(2800 * time.Millisecond)
	follower.q.Tick()
	act := action(b.Take(), "tenant", "a")
	// Written 2.8 s ago with a lease of TTL + Settle (15 + 2.5 s), of
	// which the last second is the stream's: 13 whole seconds are left.
	if ttl := act.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); ttl != 13*time.Second {
		t.Errorf("late grant's TTL = %v, want 13s", ttl)
	}
	if n := follower.reg.Counter("ratelimit.rlqs.shared.late_assignments").Value(); n != 1 {
		t.Errorf("late_assignments = %d, want 1", n)
	}
}

// TestSharedQuotaFrozenStoreHandsOver: a replica whose Redis stops
// answering (SIGSTOP: a frozen process, or a blackholed network) ends its
// streams after shareDownAfter of ticks, each of which waits a second for
// the store at most, not the store's own timeout (issue 35: REDIS_TIMEOUT,
// 10 s, passed before the streams ended, and Envoys could reach their
// fallback first). The bound is relative to that timeout, set to 30 s.
func TestSharedQuotaFrozenStoreHandsOver(t *testing.T) {
	t.Parallel()
	const storeTimeout = 30 * time.Second
	f := newFleetTimeout(t, 1, storeTimeout)
	e := f.add("e", 0, 100)
	f.run(25*time.Second, epoch.Add(time.Hour))
	if e.sess == nil {
		t.Fatal("no stream before the outage")
	}
	sess := e.sess
	if err := f.srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.srv.Thaw() })
	start := time.Now()
	for {
		select {
		case <-sess.Done():
			if c := status.Code(sess.Err()); c != codes.Unavailable {
				t.Errorf("stream ended with %v, want Unavailable", sess.Err())
			}
			return
		default:
		}
		if time.Since(start) > storeTimeout/2 {
			t.Fatalf("the stream is still open %v into a frozen store", time.Since(start).Round(time.Second))
		}
		now := f.now().Add(time.Second)
		f.clock.Store(&now)
		f.reps[0].q.Tick()
	}
}

// TestSharedQuotaTickBudget: a tick exchanges the pools with the store a
// chunk at a time, and starts no new chunk past its budget; the next tick
// begins with the pools it did not reach, so that every pool gets its turn
// while the store keeps time for ShouldRateLimit (issue 35: 20,000
// buckets' exchanges in one pipeline took all of Redis's time, and past
// the call's budget made the replica end its streams as if Redis were
// gone).
func TestSharedQuotaTickBudget(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	st, err := redis.New(t.Context(), redis.Config{URL: srv.Addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg, err := rules.Parse([]rules.File{{Name: "q.yaml", Data: []byte(sharedRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	reg := stats.NewRegistry()
	q := rlqs.New(reg, rlqs.Config{Share: st, Replica: 1, Now: func() time.Time { return now }})
	q.SetRules(cfg)
	// One chunk of five pools a tick: no budget beyond the first chunk.
	q.SetShareTick(5, 0)
	s, err := q.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "web"}
	for i := range 12 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("t%02d", i)}},
			NumRequestsAllowed: 1, TimeElapsed: durationpb.New(time.Second)})
	}
	if err := s.Report(m); err != nil {
		t.Fatal(err)
	}
	assigned := map[string]bool{}
	for tick, want := range []int{5, 10, 12} {
		now = now.Add(time.Second)
		q.Tick()
		for _, a := range s.Take().GetBucketAction() {
			if a.GetQuotaAssignmentAction() != nil {
				assigned[a.GetBucketId().GetBucket()["tenant"]] = true
			}
		}
		if len(assigned) != want {
			t.Errorf("after tick %d: %d buckets assigned, want %d", tick+1, len(assigned), want)
		}
	}
	if n := reg.Gauges()["ratelimit.rlqs.shared.owned"]; n != 12 {
		t.Errorf("owned pools = %d, want 12", n)
	}
}

// TestSharedQuotaExchangesWhatChanged: a replica exchanges a pool with
// the store when it has reports to hand over or a note (its owner wrote
// grants for its subscribers; another replica handed over reports to a
// pool it owns), and besides every few seconds, not at every tick (issue
// 35: every pool's exchange at every tick, changed or not, took Redis's
// time from ShouldRateLimit). Grants still flow: the Envoys keep fair
// shares in force throughout.
func TestSharedQuotaExchangesWhatChanged(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	a, b := f.add("a", 0, 100), f.add("b", 1, 100)
	learned := epoch.Add(quota.DefaultTTL + 3*time.Second)
	f.run(25*time.Second, learned)
	count := func() (n uint64) {
		for _, r := range f.reps {
			n += r.reg.Counter("ratelimit.rlqs.shared.exchanges").Value()
		}
		return n
	}
	before := count()
	const window = 30 * time.Second
	f.run(window, learned)
	// Each Envoy reports every 5 s: its replica hands it over, and
	// notes the owner, which reads it; the grant written for the other
	// replica's Envoy is noted to it. Every tick's exchange would be two
	// a second.
	perSecond := float64(count()-before) / window.Seconds()
	t.Logf("%.2f exchanges a second", perSecond)
	if perSecond > 1.2 {
		t.Errorf("%.2f exchanges a second for one pool on two replicas, want at most 1.2 (2 at every tick)", perSecond)
	}
	for _, e := range []*mimic{a, b} {
		if r := rate(e.tb); math.Abs(r-28.5) > 1 || e.expired > 0 {
			t.Errorf("%s: %.2f/s, %v without an assignment; want 28.5 throughout", e.name, r, time.Duration(e.expired)*fleetStep)
		}
	}
	var notes uint64
	for _, r := range f.reps {
		notes += r.reg.Counter("ratelimit.rlqs.shared.notes").Value()
	}
	if notes == 0 {
		t.Error("no note left")
	}
}

// TestSharedQuotaDeadReplicasSubscribersGo: when a replica dies, the
// owner of a pool takes its subscribers as gone once it stops beating
// (their streams died with it), so that it stops renewing their grants
// (issue 38: the owner renewed them for a TTL, and the fleet ran at half
// the limit for 21 s). Their last grants count until their leases end.
func TestSharedQuotaDeadReplicasSubscribersGo(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	envoys := []*mimic{f.add("a", 0, 100), f.add("b", 1, 100)}
	f.run(25*time.Second, epoch.Add(time.Hour))
	owner := f.owner()
	if owner < 0 {
		t.Fatal("no owner")
	}
	other := 1 - owner
	// The other replica's Envoy stays away: its old subscriber alone is
	// watched.
	envoys[other].next = f.now().Add(time.Hour)
	f.kill(other)
	killed := f.now()
	var goneAt time.Time
	for f.now().Before(killed.Add(25 * time.Second)) {
		f.run(fleetStep, epoch.Add(time.Hour))
		for _, s := range f.reps[owner].q.State().Rules[0].Top[0].Subscribers {
			if s.Stream>>32 != uint64(other+1) {
				continue
			}
			if s.Gone && goneAt.IsZero() {
				goneAt = f.now()
			}
			if until := f.now().Add(time.Duration(s.LeaseLeft * float64(time.Second))); until.After(killed.Add(quota.DefaultTTL + rlqs.SharedSettle + time.Second)) {
				t.Fatalf("%v after the kill the dead replica's subscriber is counted until %v after it; want its last lease, %v at most",
					f.now().Sub(killed), until.Sub(killed), quota.DefaultTTL+rlqs.SharedSettle)
			}
		}
	}
	if goneAt.IsZero() || goneAt.Sub(killed) > 5*time.Second {
		t.Errorf("the dead replica's subscriber was taken as gone %v after the kill (zero: never), want within 5 s", goneAt.Sub(killed))
	}
}

// TestSharedQuotaFirstGrantByPolls: a new bucket on a replica that does
// not own its pool gets its first grant within a few polls (100 ms each),
// not a few ticks (issue 38: 0.84-1.84 s with replicas, while Envoy's
// no_assignment_behavior decides its requests).
func TestSharedQuotaFirstGrantByPolls(t *testing.T) {
	t.Parallel()
	for _, polls := range []bool{true, false} {
		f := newFleet(t, 2)
		f.noPolls = !polls
		f.add("a", 0, 10)
		f.run(20*time.Second, epoch.Add(time.Hour))
		owner := f.owner()
		if owner < 0 {
			t.Fatal("no owner")
		}
		joined := f.now()
		e := f.add("b", 1-owner, 10)
		for !e.assigned && f.now().Before(joined.Add(5*time.Second)) {
			f.run(fleetStep, epoch.Add(time.Hour))
		}
		took := f.now().Sub(joined)
		t.Logf("polls %v: the first grant came %v after the first report", polls, took)
		if polls && took > 500*time.Millisecond {
			t.Errorf("with polls the first grant came %v after the first report, want 500ms at most", took)
		}
		if !polls && took <= 500*time.Millisecond {
			t.Errorf("ticks alone gave the first grant within %v: the test shows nothing", took)
		}
	}
}

// TestSharedQuotaNoPollBeforeTheFirstBeat: a replica serves nothing at
// its polls before its first beat is in the store, so that no other
// replica takes a pool it took, or the subscribers it handed over, for a
// dead replica's; its tick beats, then serves.
func TestSharedQuotaNoPollBeforeTheFirstBeat(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 1)
	q, reg := f.reps[0].q, f.reps[0].reg
	s, err := q.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Report(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: bucketID("tenant", "a"), NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	q.Poll()
	if n := reg.Counter("ratelimit.rlqs.shared.exchanges").Value(); n != 0 {
		t.Fatalf("%d exchanges at a poll before the first beat, want none", n)
	}
	q.Tick()
	if n := reg.Counter("ratelimit.rlqs.shared.exchanges").Value(); n == 0 {
		t.Fatal("no exchange at the first tick")
	}
}

// replyLost is a store whose next commit, once armed, is written but its
// reply lost, as when the call's budget runs out on a busy machine after
// Redis ran it.
type replyLost struct {
	rlqs.Share
	armed atomic.Bool
}

func (s *replyLost) CommitQuota(ctx context.Context, reqs []quota.CommitRequest, notes []quota.Note) []error {
	errs := s.Share.CommitQuota(ctx, reqs, notes)
	if s.armed.CompareAndSwap(true, false) {
		for i := range errs {
			errs[i] = context.DeadlineExceeded
		}
	}
	return errs
}

// TestSharedQuotaCommitReplyLost: an owner whose write's reply is lost
// (written, but not known to be) reads the pool again; the grants that
// write held are in Redis and counted by its state, the decrease of its
// own Envoy among them, so it sends them. Without that, its Envoy kept
// the larger grant while the pool, once the decrease settled, gave the
// difference to the other.
func TestSharedQuotaCommitReplyLost(t *testing.T) {
	t.Parallel()
	var lost *replyLost
	f := newFleetShare(t, 2, time.Second, func(i int, s *redis.Store) rlqs.Share {
		if i == 0 {
			lost = &replyLost{Share: s}
			return lost
		}
		return s
	})
	a := f.add("a", 0, 100)
	f.run(3*time.Second, epoch)
	if f.owner() != 0 || rate(a.tb) < 50 {
		t.Fatalf("owner %d, a %v/s: want replica 0 to own the pool, a granted most of it", f.owner(), rate(a.tb))
	}
	f.add("b", 1, 100)
	lost.armed.Store(true) // the write that makes room for b
	for lost.armed.Load() && f.now().Before(epoch.Add(6*time.Second)) {
		f.run(fleetStep, epoch)
	}
	if lost.armed.Load() {
		t.Fatal("no write's reply was lost")
	}
	// The pool counts a's old grant until its decrease has settled.
	f.run(rlqs.SharedSettle, epoch)
	if ra := rate(a.tb); ra > 35 {
		t.Errorf("a holds %v/s Settle after its decrease was written, want about half of %v", ra, sharedRate)
	}
}

// TestSharedQuotaStalledOwner: an owner that stalls for shareAlive (a
// process starved on a busy machine) is taken for dead, its pool taken
// over, while it still says it owns it: two replicas say so until its
// next exchange tells it (the gauges of one failure of
// TestRLQSSharedThroughRedis). It sends nothing meanwhile (a write of
// its would name a lease no longer its own, and be refused), and the
// rates in force stay within the limit throughout.
func TestSharedQuotaStalledOwner(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	a := f.add("a", 0, 100)
	f.run(3*time.Second, epoch)
	if f.owner() != 0 || rate(a.tb) < 50 {
		t.Fatalf("owner %d, a %v/s: want replica 0 to own the pool, a granted most of it", f.owner(), rate(a.tb))
	}
	owned := func() (n int64) {
		for _, r := range f.reps {
			n += r.reg.Gauges()["ratelimit.rlqs.shared.owned"]
		}
		return n
	}
	f.reps[0].paused = true
	b := f.add("b", 1, 100)
	f.run(4*time.Second, epoch)
	if owned() != 2 || f.reps[1].reg.Counter("ratelimit.rlqs.shared.takeovers").Value() != 1 {
		t.Fatalf("%d replicas say they own the pool 4 s into the stall, want both (replica 1 took it over)", owned())
	}
	f.reps[0].paused = false
	for owned() != 1 && f.now().Before(epoch.Add(20*time.Second)) {
		f.run(fleetStep, epoch)
	}
	if owned() != 1 {
		t.Fatal("the stalled replica still says it owns the pool 13 s after it went on")
	}
	// Past the end of the lease a's old grant had when the pool was
	// taken over: a stale write renewing it would be in force then.
	f.run(epoch.Add(30*time.Second).Sub(f.now()), epoch)
	if ra, rb := rate(a.tb), rate(b.tb); ra > 30 || rb > 30 || ra+rb < 55 {
		t.Errorf("after the stall: a %v/s, b %v/s; want about half each", ra, rb)
	}
}

// TestSharedQuotaStalledReplicaKeepsItsEnvoys: a replica taken for dead
// while it lives (stalled 4 s, past the beats' 3 s), the pool's owner or
// not, goes on with the same streams, whose next reports are no
// reconnects: its Envoy keeps its share throughout. Taken for a
// reconnect, it was granted 1 a second for 6.5 s, until the lease its
// reconnect ended freed its share.
func TestSharedQuotaStalledReplicaKeepsItsEnvoys(t *testing.T) {
	t.Parallel()
	for stalled, name := range []string{"the owner", "another replica"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, 2)
			envoys := []*mimic{f.add("a", 0, 100), f.add("b", 1, 100)}
			f.run(25*time.Second, epoch)
			if f.owner() != 0 || rate(envoys[0].tb) < 25 || rate(envoys[1].tb) < 25 {
				t.Fatalf("owner %d, a %v/s, b %v/s: want replica 0 to own the pool, each granted about half", f.owner(), rate(envoys[0].tb), rate(envoys[1].tb))
			}
			f.reps[stalled].paused = true
			f.run(4*time.Second, epoch)
			f.reps[stalled].paused = false
			e, low := envoys[stalled], 0
			for range 200 {
				f.run(fleetStep, epoch)
				if !e.assigned || rate(e.tb) < 20 || !f.now().Before(e.expires) {
					low++
				}
			}
			if low > 0 {
				t.Errorf("%s was granted less than a third of the limit for %v of the 20 s after its replica's stall, want none", e.name, time.Duration(low)*fleetStep)
			}
		})
	}
}
