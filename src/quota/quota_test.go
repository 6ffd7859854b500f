package quota

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestWaterfill(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	tests := []struct {
		name     string
		capacity float64
		demands  []float64
		want     []float64
	}{
		{"one_unbounded", 10, []float64{inf}, []float64{10}},
		{"equal_split", 9, []float64{inf, inf, inf}, []float64{3, 3, 3}},
		{"small_demand_met_rest_split", 20, []float64{30, 5}, []float64{15, 5}},
		{"max_min", 12, []float64{1, 10, 10, 2}, []float64{1, 4.5, 4.5, 2}},
		{"spare_in_proportion", 10, []float64{1, 3}, []float64{2.5, 7.5}},
		{"spare_equal_when_idle", 10, []float64{0, 0}, []float64{5, 5}},
		{"unknown_takes_fair_level", 10, []float64{2, inf}, []float64{2, 8}},
		{"no_capacity", 0, []float64{1, 2}, []float64{0, 0}},
		{"none", 10, nil, []float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Waterfill(tt.capacity, tt.demands)
			if !slices.EqualFunc(got, tt.want, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }) {
				t.Errorf("Waterfill(%v, %v) = %v, want %v", tt.capacity, tt.demands, got, tt.want)
			}
		})
	}
}

// harness drives one pool with a fake clock and keeps the last grant
// each subscriber was sent.
type harness struct {
	t      *testing.T
	p      *Pool
	now    time.Time
	grants map[uint64]Grant
	// limit, when set, is the rate check holds the pool to instead of
	// its limit's (an older, larger limit still settling).
	limit float64
}

var epoch = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)

// newHarness starts a pool after its learning period, unless learning.
func newHarness(t *testing.T, l Limit, learning bool) *harness {
	cfg := Config{Start: epoch.Add(-time.Hour)}
	if learning {
		cfg.Start = epoch
	}
	return &harness{t: t, p: NewPool(l, cfg), now: epoch, grants: map[uint64]Grant{}}
}

func (h *harness) record(cs []Change) []Change {
	h.t.Helper()
	for _, c := range cs {
		h.grants[c.Sub] = c.Grant
		// What Envoy can take: a token bucket of at least one token,
		// filled over whole seconds, at least one.
		if g := c.Grant; !g.Deny() && !g.Abandon && (g.MaxTokens == 0 || g.FillInterval < time.Second) {
			h.t.Fatalf("at %v grant %+v to %d: a token bucket Envoy cannot use", h.now.Sub(epoch), g, c.Sub)
		}
	}
	h.check()
	return cs
}

// check asserts the invariant: the shares in force add up to at most the
// limit.
func (h *harness) check() {
	h.t.Helper()
	limit := h.p.limit.Rate
	if h.limit > 0 {
		limit = h.limit
	}
	if r, _ := h.p.Committed(h.now); r > limit+1e-9 {
		h.t.Fatalf("at %v committed rate %v > limit %v", h.now.Sub(epoch), r, limit)
	}
}

func (h *harness) report(id uint64, allowed, denied uint64, elapsed time.Duration) []Change {
	return h.record(h.p.Report(h.now, id, Usage{Allowed: allowed, Denied: denied, Elapsed: elapsed}))
}

// join reports a new bucket of one request for each subscriber.
func (h *harness) join(ids ...uint64) {
	for _, id := range ids {
		h.report(id, 1, 0, 0)
	}
}

func (h *harness) tick() []Change { return h.record(h.p.Tick(h.now)) }

func (h *harness) advance(d time.Duration) { h.now = h.now.Add(d) }

// steady makes every subscriber report demand (requests per second) over
// periods of 5 s, ticking every second, for n periods.
func (h *harness) steady(n int, demand map[uint64]float64) {
	for range n {
		for range 5 {
			h.advance(time.Second)
			h.tick()
		}
		for _, id := range sortedKeys(demand) {
			d := demand[id] * 5
			got := h.grants[id].Rate() * 5
			h.report(id, uint64(min(d, got)), uint64(max(0, d-got)), 5*time.Second)
		}
	}
}

func sortedKeys[V any](m map[uint64]V) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func near(got, want, tolerance float64) bool { return math.Abs(got-want) <= tolerance }

func TestJoinGetsAShareAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 10}, false)
	cs := h.report(1, 1, 0, 0)
	if len(cs) != 1 || cs[0].Sub != 1 {
		t.Fatalf("Report of a new bucket = %v, want a grant for it", cs)
	}
	// Alone, with its demand unknown: all but the reserve, and the whole burst.
	if g := h.grants[1]; g.Rate() != 19 || g.MaxTokens != 10 {
		t.Errorf("first grant = %+v (rate %v), want 19/s and 10 tokens", g, g.Rate())
	}
	// A second one takes the reserve at once, before the first is decreased.
	h.advance(100 * time.Millisecond)
	h.report(2, 1, 0, 0)
	if g := h.grants[2]; g.Rate() != 1 {
		t.Errorf("second joiner's first grant = %v/s, want the reserve, 1/s", g.Rate())
	}
	if g := h.grants[1]; g.Rate() != 9.5 || g.MaxTokens != 5 {
		t.Errorf("first subscriber after the join = %v/s, %d tokens; want decreased to 9.5/s and 5", g.Rate(), g.MaxTokens)
	}
	// Once the decrease settled, the joiner gets its fair share: of
	// 19.8/s, now that no one joins (all but a fifth of the reserve is
	// lent).
	h.advance(time.Second)
	h.tick()
	if g := h.grants[2]; !near(g.Rate(), 9.9, 0.1) || g.MaxTokens != 5 {
		t.Errorf("joiner after the decrease settled = %v/s, %d tokens; want 9.9/s and 5", g.Rate(), g.MaxTokens)
	}
}

func TestMaxMinFairSplit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 20}, false)
	h.join(1, 2)
	h.steady(4, map[uint64]float64{1: 40, 2: 5})
	// 19.8/s to share (a fifth of the 5 % reserve kept): the small
	// demand is met with 5 % of headroom, the large one gets the rest.
	if r1, r2 := h.grants[1].Rate(), h.grants[2].Rate(); !near(r1, 14.55, 0.3) || !near(r2, 5.25, 0.1) {
		t.Errorf("shares = %v, %v; want about 14.55 and 5.25", r1, r2)
	}
	// Demand shifts: the other way round.
	h.steady(6, map[uint64]float64{1: 3, 2: 40})
	if r1, r2 := h.grants[1].Rate(), h.grants[2].Rate(); !near(r1, 3.15, 0.1) || !near(r2, 16.65, 0.3) {
		t.Errorf("shares after the shift = %v, %v; want about 3.15 and 16.65", r1, r2)
	}
}

func TestSpareInProportionToDemand(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 40, Burst: 40}, false)
	h.join(1, 2)
	h.steady(8, map[uint64]float64{1: 3, 2: 9})
	// 39.6/s for a demand of 12: everyone gets about 39.6/12 times its demand.
	if r1, r2 := h.grants[1].Rate(), h.grants[2].Rate(); !near(r1, 9.9, 0.4) || !near(r2, 29.7, 0.6) {
		t.Errorf("shares = %v, %v; want about 9.9 and 29.7", r1, r2)
	}
}

// TestRiseGrantedAtTheNextReport: a subscriber under its fair share whose
// demand grows gets the increase at its next report (once the decrease
// it causes has settled), and one whose demand falls gives it up there.
func TestRiseGrantedAtTheNextReport(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 20}, false)
	h.join(1, 2)
	h.steady(4, map[uint64]float64{1: 40, 2: 5})
	h.steady(1, map[uint64]float64{1: 40, 2: 8})
	h.advance(1100 * time.Millisecond)
	h.tick()
	if r := h.grants[2].Rate(); r < 8 {
		t.Errorf("after a rise from 5 to 8/s and one report: %v/s, want at least 8", r)
	}
	h.steady(1, map[uint64]float64{1: 40, 2: 3})
	h.advance(1100 * time.Millisecond)
	h.tick()
	if r1, r2 := h.grants[1].Rate(), h.grants[2].Rate(); r2 > 3.2 || r1 < 16.3 {
		t.Errorf("after a fall from 8 to 3/s and one report: %v and %v/s, want about 16.6 and 3.15", r1, r2)
	}
}

func TestStaticSplitsEqually(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 30, Burst: 30, Equal: true}, false)
	for id := uint64(1); id <= 3; id++ {
		h.report(id, 1, 0, 0)
	}
	h.steady(3, map[uint64]float64{1: 100, 2: 1, 3: 0})
	for id := uint64(1); id <= 3; id++ {
		if g := h.grants[id]; !near(g.Rate(), 9.9, 0.1) || g.MaxTokens != 10 {
			t.Errorf("static share of %d = %v/s, %d tokens; want 9.9/s and 10", id, g.Rate(), g.MaxTokens)
		}
	}
}

func TestDecreasesBeforeIncreases(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 20}, false)
	h.join(1, 2)
	h.steady(4, map[uint64]float64{1: 40, 2: 2})
	before := h.grants[2].Rate()
	// 2's demand jumps: its report decreases 1 at once, but 2 gets the
	// freed share only once the decrease has had Settle to arrive.
	h.advance(5 * time.Second)
	cs := h.report(2, uint64(before*5), 200, 5*time.Second)
	var dec, inc bool
	for _, c := range cs {
		dec = dec || c.Sub == 1 && c.Grant.Rate() < 14
		inc = inc || c.Sub == 2 && c.Grant.Rate() > before+1
	}
	if !dec || inc {
		t.Fatalf("report of a demand jump: %+v; want 1 decreased and 2 not yet increased", cs)
	}
	h.advance(500 * time.Millisecond)
	h.tick()
	if h.grants[2].Rate() > before+1 {
		t.Errorf("2 increased before the decrease settled: %v", h.grants[2].Rate())
	}
	h.advance(600 * time.Millisecond)
	h.tick()
	if r := h.grants[2].Rate(); r < 8 {
		t.Errorf("2 after the decrease settled = %v/s, want its share increased", r)
	}
}

func TestGoneShareCountsUntilItsLeaseEnds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 20}, false)
	h.join(1, 2)
	h.steady(3, map[uint64]float64{1: 40, 2: 40})
	r2 := h.grants[2].Rate()
	h.record(h.p.Leave(h.now, 2))
	// 2's Envoy keeps its grant until its TTL: 1 may not take it before.
	for range 14 {
		h.advance(time.Second)
		h.tick()
		h.report(1, 50, 150, time.Second)
		if r := h.grants[1].Rate(); r+r2 > 20 {
			t.Fatalf("%v after 2 left: 1 has %v/s while 2's %v/s may be in force", h.now.Sub(epoch), r, r2)
		}
	}
	h.advance(3 * time.Second)
	h.tick()
	h.report(1, 50, 150, time.Second)
	if r := h.grants[1].Rate(); r < 18 {
		t.Errorf("1 after 2's lease ended = %v/s, want the whole 19/s", r)
	}
	if h.p.Len() != 1 {
		t.Errorf("Len() = %d after the lease ended, want 1", h.p.Len())
	}
}

// TestReconnectDemandOverTheReportPeriod: a reconnect's first report
// says time_elapsed in whole seconds rounded down, 4 for Envoy's 5 s
// period as often as 5 (4.99 s). Its demand is read over the report
// interval: read over 4.5 s, docs/RLQS.md's kill test's 6/s Envoy is
// 6.7/s, above its fair share, and the others get an equal split (6.6/s)
// instead of what they had until that Envoy's next report is measured
// and its decrease has settled, 13 s after the death.
func TestReconnectDemandOverTheReportPeriod(t *testing.T) {
	t.Parallel()
	for _, elapsed := range []time.Duration{4 * time.Second, 5 * time.Second} {
		h := newHarness(t, Limit{Rate: 20, Burst: 10}, false)
		h.p = NewPool(h.p.limit, Config{Start: epoch.Add(-time.Hour), Settle: 2500 * time.Millisecond})
		h.join(1, 2, 3)
		h.steady(4, map[uint64]float64{1: 40, 2: 6, 3: 40})
		before := h.grants[1].Rate()
		// 2's replica dies; its Envoy reconnects, as 4.
		h.record(h.p.LeaveIf(h.now, func(id uint64) bool { return id == 2 }))
		h.advance(time.Second)
		h.report(4, 30, 0, elapsed)
		for range 4 {
			h.advance(time.Second)
			h.tick()
		}
		for _, s := range h.p.Subscribers(h.now) {
			if s.ID == 4 && !near(s.Demand, 6, 0.1) {
				t.Errorf("time_elapsed %v: the reconnect's demand = %.2f/s, want 6", elapsed, s.Demand)
			}
		}
		for _, id := range []uint64{1, 3} {
			if r := h.grants[id].Rate(); r < before {
				t.Errorf("time_elapsed %v: %d has %.2f/s once the reconnect's old lease ended, want %.2f as before", elapsed, id, r, before)
			}
		}
	}
}

// TestColdStartSplitsTheWholeLimit: buckets Envoys create after a start
// held nothing, so a pool that has seen only those splits its whole
// limit at once, not the reserve.
func TestColdStartSplitsTheWholeLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 20}, true)
	h.join(1, 2, 3, 4)
	h.advance(time.Second)
	h.tick()
	for id := uint64(1); id <= 4; id++ {
		if g := h.grants[id]; !near(g.Rate(), 4.95, 0.1) || g.MaxTokens != 5 {
			t.Errorf("%d a second after a cold start = %v/s, %d tokens; want 4.95/s and 5", id, g.Rate(), g.MaxTokens)
		}
	}
	// Then adapted from their reports.
	h.steady(2, map[uint64]float64{1: 2, 2: 4, 3: 8, 4: 16})
	h.advance(time.Second)
	h.tick()
	for id, want := range map[uint64]float64{1: 2.1, 2: 4.2, 3: 6.75, 4: 6.75} {
		if r := h.grants[id].Rate(); !near(r, want, 0.3) {
			t.Errorf("%d after its reports = %v/s, want about %v", id, r, want)
		}
	}
}

// TestRestartNeverGrantsMoreThanSeen: once an Envoy reports a bucket it
// held before the start, grants of the earlier server may be in force:
// until the learning period ends, no Envoy is granted more than it was
// seen admitting then, and buckets created meanwhile share the reserve;
// and what it was seen admitting is not lowered by later reports (no
// ratchet).
func TestRestartNeverGrantsMoreThanSeen(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 100, Burst: 100}, true)
	// An Envoy that reconnects after the restart: 20 admitted over
	// "4 s" (4 to 5 s): at least 4/s of a grant the old server gave.
	h.report(1, 20, 80, 4*time.Second)
	if g := h.grants[1]; g.Rate() > 4 || g.Rate() < 3.9 || g.MaxTokens != 100 {
		t.Errorf("first grant while learning = %v/s, %d tokens; want 4/s at most and the whole burst", g.Rate(), g.MaxTokens)
	}
	// A bucket created meanwhile held nothing: it gets at most the
	// reserve (5 of 100/s), shared with other new ones.
	h.report(2, 1, 0, 0)
	if g := h.grants[2]; g.Rate() != 5 {
		t.Errorf("new bucket while learning = %v/s; want the reserve, 5/s", g.Rate())
	}
	h.report(3, 1, 0, 0)
	if r2, r3 := h.grants[2].Rate(), h.grants[3].Rate(); r2+r3 > 5 {
		t.Errorf("two new buckets while learning = %v + %v/s, want the reserve shared", r2, r3)
	}
	learning := Config{Start: epoch}.Learning()
	if got, want := learning.Sub(epoch), 7*time.Second; got != want {
		t.Errorf("learning period = %v, want %v (a report interval, a second, Settle)", got, want)
	}
	for {
		h.advance(time.Second)
		if !h.now.Before(learning) {
			break
		}
		h.tick()
		if r := h.grants[1].Rate(); r > 4 || r < 3.9 {
			t.Fatalf("%v: grant %v/s while learning, want the 4/s seen", h.now.Sub(epoch), r)
		}
		if r := h.grants[2].Rate() + h.grants[3].Rate(); r > 5 {
			t.Fatalf("%v: new buckets have %v/s while learning, above the reserve", h.now.Sub(epoch), r)
		}
		if h.now.Sub(epoch)%(5*time.Second) == 0 {
			// It admitted less of its grant: no ratchet down.
			h.report(1, 15, 400, 5*time.Second)
			h.report(2, 0, 400, 5*time.Second)
			h.report(3, 0, 400, 5*time.Second)
		}
	}
	h.tick()
	h.advance(2 * time.Second)
	h.tick()
	if r1, r2 := h.grants[1].Rate(), h.grants[2].Rate(); !near(r1, 33, 1) || !near(r2, 33, 1) {
		t.Errorf("after learning: %v and %v/s, want both about a third of 99", r1, r2)
	}
}

func TestIdleIsAbandoned(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 20, Burst: 20}, false)
	h.join(1, 2)
	h.steady(2, map[uint64]float64{1: 40, 2: 40})
	var abandoned bool
	for range 15 {
		h.steady(1, map[uint64]float64{1: 40, 2: 0})
		abandoned = abandoned || h.grants[2].Abandon
	}
	if !abandoned {
		t.Fatal("a subscriber idle for 75 s was not abandoned")
	}
	if r := h.grants[1].Rate(); r < 18 {
		t.Errorf("the other after the abandon = %v/s, want the whole 19/s", r)
	}
	// It subscribes again with its next request.
	h.report(2, 1, 0, 0)
	if g := h.grants[2]; g.Abandon || g.Rate() == 0 {
		t.Errorf("after subscribing again: %+v, want a share", g)
	}
}

func TestSetLimitDecreasesAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 100, Burst: 100}, false)
	h.join(1, 2)
	h.steady(3, map[uint64]float64{1: 80, 2: 80})
	// The old grants may be in force until the decreases arrive: the
	// invariant holds for the old limit, then for the new one.
	h.limit = 100
	h.record(h.p.SetLimit(h.now, Limit{Rate: 10, Burst: 10}))
	if r := h.grants[1].Rate() + h.grants[2].Rate(); r > 10 {
		t.Errorf("grants after the limit dropped add up to %v/s, want at most 10", r)
	}
	h.advance(time.Second)
	h.limit = 0
	h.tick()
}

// TestInvariantRandom drives a pool with random joins, reports, leaves,
// reconnects and ticks, and checks after each step that the shares that
// may be in force never add up to more than the limit, and that no grant
// is ever more than a subscriber may use.
func TestInvariantRandom(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 28))
		learning := seed%2 == 0
		h := newHarness(t, Limit{Rate: 1 + rng.Float64()*200, Burst: 1 + rng.Float64()*100, Equal: seed%5 == 0}, learning)
		live := map[uint64]bool{}
		next := uint64(1)
		for range 3000 {
			h.advance(time.Duration(rng.IntN(700)) * time.Millisecond)
			switch op := rng.IntN(10); {
			case op == 0 || len(live) == 0:
				h.report(next, 1, 0, 0)
				live[next] = true
				next++
			case op == 1:
				id := sortedKeys(live)[rng.IntN(len(live))]
				h.record(h.p.Leave(h.now, id))
				delete(live, id)
			case op == 2:
				// An Envoy that reconnected: a new stream, a report covering seconds.
				h.report(next, uint64(rng.IntN(1000)), uint64(rng.IntN(1000)), time.Duration(1+rng.IntN(6))*time.Second)
				live[next] = true
				next++
			case op == 3 && rng.IntN(4) == 0:
				// A replica dies: its subscribers go, and reconnects
				// (op 2) end their leases early. Or it was taken for
				// dead while it lived (a stall): its streams go on
				// reporting.
				r := uint64(rng.IntN(3))
				h.record(h.p.LeaveIf(h.now, func(id uint64) bool { return id%3 == r }))
				for id := range live {
					if id%3 == r && rng.IntN(2) == 0 {
						delete(live, id)
					}
				}
			case op < 6:
				h.tick()
			default:
				id := sortedKeys(live)[rng.IntN(len(live))]
				h.report(id, uint64(rng.IntN(500)), uint64(rng.IntN(500)), 5*time.Second)
			}
			// Each subscriber holds at least MinTokens, which may
			// not fit: the burst is B plus MinTokens each.
			if _, b := h.p.Committed(h.now); float64(b) > h.p.limit.Burst+float64(MinTokens*h.p.Len()) {
				t.Fatalf("seed %d: committed burst %d > %v + %d·%d", seed, b, h.p.limit.Burst, MinTokens, h.p.Len())
			}
		}
	}
}

func TestBeyondShares(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Limit{Rate: 10, Burst: 5}, false)
	// A new bucket's requests were admitted before any assignment.
	h.report(1, 3, 0, 0)
	if got := h.p.Beyond(); got != 3 {
		t.Errorf("Beyond() after a new bucket's report of 3 = %d, want 3", got)
	}
	// Within its grant (9.5/s, 5 tokens) over 5 s: nothing beyond.
	h.advance(5 * time.Second)
	h.report(1, 50, 10, 5*time.Second)
	if got := h.p.Beyond(); got != 3 {
		t.Errorf("Beyond() after a report within the share = %d, want still 3", got)
	}
	// 100 admitted in 5 s on a share of r/s: r×6 + 5 + 1 of them are
	// accounted for.
	r := h.grants[1].Rate()
	h.advance(5 * time.Second)
	h.report(1, 100, 0, 5*time.Second)
	if got, want := h.p.Beyond(), 3+uint64(100-(r*6+5+1)); got != want {
		t.Errorf("Beyond() after 100 admitted on %v/s = %d, want %d", r, got, want)
	}
	subs := h.p.Subscribers(h.now)
	if len(subs) != 1 || subs[0].ID != 1 || subs[0].Rate != h.grants[1].Rate() || subs[0].Burst != 5 || !subs[0].DemandKnown || subs[0].Committed != subs[0].Rate {
		t.Errorf("Subscribers() = %+v", subs)
	}
}

// TestDemandBetweenReceipts: a report handed over late (by a replica to
// the pool's owner) is measured from when it was received, not from when
// the pool got it.
func TestDemandBetweenReceipts(t *testing.T) {
	t.Parallel()
	p := NewPool(Limit{Rate: 100, Burst: 10}, Config{Start: epoch.Add(-time.Hour)})
	p.Report(epoch.Add(900*time.Millisecond), 1, Usage{Allowed: 1, At: epoch})
	p.Report(epoch.Add(5900*time.Millisecond), 1, Usage{Allowed: 50, Elapsed: 5 * time.Second, At: epoch.Add(5 * time.Second)})
	subs := p.Subscribers(epoch.Add(6 * time.Second))
	if len(subs) != 1 || !near(subs[0].Demand, 51.0/5, 1e-9) {
		t.Errorf("Subscribers() = %+v, want a demand of 51 requests over the 5 s between receipts", subs)
	}
	// A time after the call's is the call's.
	p.Report(epoch.Add(7*time.Second), 1, Usage{Allowed: 0, Elapsed: time.Second, At: epoch.Add(time.Hour)})
	if p.subs[1].reported != epoch.Add(7*time.Second) {
		t.Errorf("a report received in the future was recorded at %v", p.subs[1].reported)
	}
}
