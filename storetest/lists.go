package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// parseList returns the first limit of descriptor "user" of a domain
// whose rate_limits are items (YAML list lines).
func parseList(t *testing.T, domain, items string) *rules.Limit {
	t.Helper()
	yaml := "domain: " + domain + "\ndescriptors:\n  - key: user\n    rate_limits:\n" + items
	cfg, err := rules.Parse([]rules.File{{Name: "list.yaml", Data: []byte(yaml)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.Match(domain, []rules.Entry{{Key: "user", Value: "x"}}).Limit
	if l == nil || !l.InList() {
		t.Fatalf("no list in %s", yaml)
	}
	return l
}

// testLists runs descriptors with several limits (rules.Limit.Limits)
// through a limiter on the store: burst plus sustained across second
// boundaries, in both modes; mixed algorithms; and exact admission under
// concurrency.
func testLists(t *testing.T, newStore func(t *testing.T) limiter.Store, opts *Options) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("burst_and_sustained/stop_increment=%t", stop), func(t *testing.T) {
			t.Parallel()
			testBurstAndSustained(t, newStore(t), stop)
		})
	}
	if opts.clock(rules.TokenBucket) == BatchClock && opts.clock(rules.SlidingWindow) == BatchClock &&
		supports(opts, rules.TokenBucket) && supports(opts, rules.SlidingWindow) {
		t.Run("mixed_algorithms", func(t *testing.T) {
			t.Parallel()
			testMixedList(t, newStore(t))
		})
	}
	second := rules.FixedWindow
	if supports(opts, rules.TokenBucket) {
		second = rules.TokenBucket
	}
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact_under_concurrency/stop_increment=%t", stop), func(t *testing.T) {
			t.Parallel()
			testListConcurrency(t, newStore(t), second, stop, opts.GroupsOneByOne)
		})
	}
}

func supports(opts *Options, a rules.Algorithm) bool {
	for _, b := range opts.algorithms() {
		if a == b {
			return true
		}
	}
	return false
}

// testBurstAndSustained: 2 a second and 5 a minute on one key. The third
// hit in a second is refused by the first limit, the sixth in a minute by
// the second, across second boundaries. Fixed windows only, so that every
// store runs on the batch's time.
func testBurstAndSustained(t *testing.T, store limiter.Store, stop bool) {
	domain := fmt.Sprintf("storetest%016x", rand.Uint64())
	lim := parseList(t, domain, `      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, name: sustained}
`)
	l := limiter.New(store, limiter.Config{StopIncrementWhenOverLimit: stop})
	start := base.Add(10 * time.Second)
	type hit struct {
		at      time.Duration
		code    limiter.Code
		decider string
	}
	const ms = time.Millisecond
	hits := []hit{
		{0, limiter.OK, "second"},
		{100 * ms, limiter.OK, "second"},
		{200 * ms, limiter.OverLimit, "second"}, // the third in a second
		{1000 * ms, limiter.OK, "sustained"},    // 1 left in both: the later reset
		{2000 * ms, limiter.OK, "sustained"},
		{3000 * ms, limiter.OverLimit, "sustained"}, // the sixth in the minute
		{3100 * ms, limiter.OverLimit, "sustained"},
		{50 * time.Second, limiter.OK, "second"}, // a new minute
	}
	if stop {
		// The refused third hit is recorded nowhere: the sixth
		// recorded hit is the one at +3.1 s.
		hits[3].decider = "second" // 1 left a second, 2 a minute
		hits[5] = hit{3000 * ms, limiter.OK, "sustained"}
	}
	entries := []rules.Entry{{Key: "user", Value: "x"}}
	for i, h := range hits {
		if h.at == 50*time.Second {
			// What each limit holds in the first minute, read before the
			// clock leaves it (a store may drop a key once its window
			// is over): every hit, or with stop_increment only the five
			// admitted.
			each := make([]limiter.Status, 2)
			ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Each: each}}
			if err := l.Check(t.Context(), domain, start.Add(3200*ms), ds, make([]limiter.Status, 1)); err != nil {
				t.Fatal(err)
			}
			if each[1].Remaining != 0 {
				t.Errorf("minute limit at +3.2 s: %+v, want spent", each[1])
			}
			if stop && each[0].Remaining != 1 {
				t.Errorf("second limit at +3.2 s with stop_increment: %+v, want 1 left (the refused hit at +3.1 s not recorded)", each[0])
			}
		}
		each := make([]limiter.Status, 2)
		out := make([]limiter.Status, 1)
		ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1, Each: each}}
		if err := l.Check(t.Context(), domain, start.Add(h.at), ds, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Code != h.code || out[0].Limit == nil || out[0].Limit.StatLevel != h.decider {
			t.Errorf("hit %d at +%v: %+v; want %v decided by %q (limits: %+v)", i+1, h.at, out[0], h.code, h.decider, each)
		}
	}
}

// testMixedList: a token bucket for bursts and a sliding window for the
// sustained rate on one descriptor.
func testMixedList(t *testing.T, store limiter.Store) {
	domain := fmt.Sprintf("storetest%016x", rand.Uint64())
	lim := parseList(t, domain, `      - {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
      - {unit: minute, requests_per_unit: 6, algorithm: sliding_window}
`)
	l := limiter.New(store, limiter.Config{})
	entries := []rules.Entry{{Key: "user", Value: "x"}}
	check := func(at time.Duration) limiter.Status {
		t.Helper()
		out := make([]limiter.Status, 1)
		if err := l.Check(t.Context(), domain, base.Add(at), []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for i := range 3 {
		if st := check(0); st.Code != limiter.OK {
			t.Fatalf("burst hit %d: %+v, want OK", i+1, st)
		}
	}
	if st := check(0); st.Code != limiter.OverLimit || st.Limit != lim.Limits[0] {
		t.Errorf("4th hit at once: %+v, want refused by the token bucket", st)
	}
	// The sliding window admitted and counted that 4th hit: two more fit.
	for i := range 2 {
		if st := check(time.Duration(i+1) * time.Second); st.Code != limiter.OK {
			t.Fatalf("hit at +%ds: %+v, want OK", i+1, st)
		}
	}
	if st := check(3 * time.Second); st.Code != limiter.OverLimit || st.Limit != lim.Limits[1] {
		t.Errorf("7th hit in the minute: %+v, want refused by the sliding window", st)
	}
}

// testListConcurrency: 32 goroutines send single-hit requests for one
// descriptor with two limits, a day long so that nothing refills: a
// fixed window of 60 and a stricter second limit of 40 (a token bucket
// where the store runs one). Where a group is one atomic step, exactly 40
// are admitted, and the stricter limit holds exactly 40; where it is not,
// never more. The fixed window counts every hit (none lost), or with
// stop_increment only the admitted ones.
func testListConcurrency(t *testing.T, store limiter.Store, second rules.Algorithm, stop, oneByOne bool) {
	const goroutines, requests = 32, 100
	domain := fmt.Sprintf("storetest%016x", rand.Uint64())
	lim := parseList(t, domain, fmt.Sprintf(`      - {unit: day, requests_per_unit: 60}
      - {unit: week, requests_per_unit: 40, algorithm: %s}
`, second))
	l := limiter.New(store, limiter.Config{StopIncrementWhenOverLimit: stop})
	entries := []rules.Entry{{Key: "user", Value: "hot"}}
	now := base.Add(10 * time.Second)
	var admitted atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			out := make([]limiter.Status, 1)
			ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1}}
			for range requests {
				if err := l.Check(context.Background(), domain, now, ds, out); err != nil {
					failed.Store(err)
					return
				}
				if out[0].Code == limiter.OK {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("Check: %v", err)
	}
	got := admitted.Load()
	switch {
	case got > 40:
		t.Errorf("admitted %d of %d requests, more than the stricter limit's 40", got, goroutines*requests)
	case !oneByOne && got != 40:
		t.Errorf("admitted %d of %d requests, want exactly 40", got, goroutines*requests)
	}
	each := make([]limiter.Status, 2)
	ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Each: each}}
	if err := l.Check(t.Context(), domain, now, ds, make([]limiter.Status, 1)); err != nil {
		t.Fatal(err)
	}
	wantFixed := uint64(goroutines * requests)
	if stop {
		wantFixed = uint64(got)
	}
	if used := 60 - uint64(each[0].Remaining); !stop && each[0].Remaining != 0 || stop && used != wantFixed {
		t.Errorf("the fixed window has %d left after %d admitted, want it to hold %d hits", each[0].Remaining, got, wantFixed)
	}
	if used := 40 - uint64(each[1].Remaining); (!oneByOne || stop) && used != uint64(got) {
		t.Errorf("the stricter limit used %d after %d admitted, want %d", used, got, got)
	}
}

// testShadowLists: limits of a list in shadow mode (rules.Limit.Shadow)
// beside an enforced one. A shadow limit counts every hit as it would
// alone and reports what it would refuse, and never changes what the
// enforced limit decides or records: in one batch, across a request of
// two descriptors that AllOrNothing refuses, and under concurrency.
func testShadowLists(t *testing.T, newStore func(t *testing.T) limiter.Store, opts *Options) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("counts/stop_increment=%t", stop), func(t *testing.T) {
			t.Parallel()
			testShadowCounts(t, newStore(t), stop)
		})
	}
	alg := rules.FixedWindow
	if supports(opts, rules.TokenBucket) {
		alg = rules.TokenBucket
	}
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact_under_concurrency/stop_increment=%t", stop), func(t *testing.T) {
			t.Parallel()
			testShadowConcurrency(t, newStore(t), alg, stop, opts.GroupsOneByOne)
		})
	}
}

// shadowDomain parses a domain whose descriptor "user" has rate_limits
// items, whose descriptor "block" refuses every hit, and whose "free"
// admits 1000 a day, and returns the limit of each of them by key.
func shadowDomain(t *testing.T, items string) (domain string, limits map[string]*rules.Limit) {
	t.Helper()
	domain = fmt.Sprintf("storetest%016x", rand.Uint64())
	yaml := "domain: " + domain + "\ndescriptors:\n  - key: user\n    rate_limits:\n" + items +
		"  - key: block\n    rate_limit: {unit: day, requests_per_unit: 0}\n" +
		"  - key: free\n    rate_limit: {unit: day, requests_per_unit: 1000}\n"
	cfg, err := rules.Parse([]rules.File{{Name: "shadow.yaml", Data: []byte(yaml)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	limits = map[string]*rules.Limit{}
	for _, key := range []string{"user", "block", "free"} {
		if limits[key] = cfg.Match(domain, []rules.Entry{{Key: key, Value: "x"}}).Limit; limits[key] == nil {
			t.Fatalf("%s matches nothing in %s", key, yaml)
		}
	}
	return domain, limits
}

// testShadowCounts: an enforced 3 a minute (A) beside a looser shadow
// limit of the same window, 10 a minute (B, its twin: a key of its own),
// and a stricter one, 2 a day (C), all fixed windows so that every store
// runs them on the batch's time.
func testShadowCounts(t *testing.T, store limiter.Store, stop bool) {
	domain, limits := shadowDomain(t, `      - {unit: minute, requests_per_unit: 3}
      - {unit: minute, requests_per_unit: 10, shadow_mode: true}
      - {unit: day, requests_per_unit: 2, shadow_mode: true, name: strict}
`)
	f := &shadowFixture{t: t, domain: domain, limits: limits, lim: limits["user"],
		l: limiter.New(store, limiter.Config{StopIncrementWhenOverLimit: stop}), now: base.Add(10 * time.Second)}
	f.fiveHits(stop)
	f.besideRefused(stop)
	f.besideAdmitted(stop)
}

// shadowFixture checks testShadowCounts's limits: A (enforced, 3 a
// minute), B (shadow, 10 a minute) and C (shadow, 2 a day) on "user", and
// "block" and "free" beside them.
type shadowFixture struct {
	t      *testing.T
	domain string
	limits map[string]*rules.Limit
	lim    *rules.Limit
	l      *limiter.Limiter
	now    time.Time
}

// held is what a limit holds: OK with Remaining while within it,
// OverLimit past it (a read of a count at its limit is OK with 0 left).
type held struct {
	code      limiter.Code
	remaining uint32
}

// check sends hits for user, with a descriptor of key other beside it
// when other is not empty; it returns the user's status and each limit's.
func (f *shadowFixture) check(user string, hits uint64, other string) (limiter.Status, []limiter.Status) {
	f.t.Helper()
	each := make([]limiter.Status, 3)
	ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: user}}, Limit: f.lim, Hits: hits, Each: each}}
	if other != "" {
		o := []rules.Entry{{Key: other, Value: user}}
		ds = append(ds, limiter.Descriptor{Entries: o, Limit: f.limits[other], Hits: hits})
	}
	out := make([]limiter.Status, len(ds))
	if err := f.l.Check(f.t.Context(), f.domain, f.now, ds, out); err != nil {
		f.t.Fatal(err)
	}
	return out[0], each
}

// read says what each limit holds for user.
func (f *shadowFixture) read(user string) [3]held {
	f.t.Helper()
	_, each := f.check(user, 0, "")
	var h [3]held
	for k := range each {
		h[k] = held{each[k].Code, each[k].Remaining}
	}
	return h
}

// fiveHits: five hits at once, one descriptor. The descriptor's decisions
// are A's alone; C would refuse from the third hit.
func (f *shadowFixture) fiveHits(stop bool) {
	t := f.t
	for i := range 5 {
		st, each := f.check("x", 1, "")
		wantCode := limiter.OK
		if i >= 3 {
			wantCode = limiter.OverLimit
		}
		if st.Code != wantCode || st.Limit != f.lim.Limits[0] {
			t.Errorf("hit %d: %+v, want %v decided by the enforced limit", i+1, st, wantCode)
		}
		if each[1].Code != limiter.OK || each[1].Counts.ShadowOverLimit != 0 {
			t.Errorf("hit %d: shadow limit B %+v, want OK", i+1, each[1])
		}
		wouldRefuse := i >= 2
		if (each[2].Code == limiter.OverLimit) != wouldRefuse || (each[2].Counts.ShadowOverLimit == 1) != wouldRefuse ||
			each[2].Counts.OverLimit != 0 || each[2].Counts.TotalHits != 1 {
			t.Errorf("hit %d: shadow limit C %+v, want would refuse %t, counted in ShadowOverLimit only", i+1, each[2], wouldRefuse)
		}
	}
	// A holds every hit, or with stop_increment the 3 it admitted, not
	// the 2 C would have let it record; B all 5, whatever A refused; C
	// every hit, or with stop_increment only the 2 it admitted itself.
	want := [3]held{{limiter.OverLimit, 0}, {limiter.OK, 5}, {limiter.OverLimit, 0}}
	if stop {
		want = [3]held{{limiter.OK, 0}, {limiter.OK, 5}, {limiter.OK, 0}}
	}
	if got := f.read("x"); got != want {
		t.Errorf("after 5 hits the limits hold %+v, want %+v", got, want)
	}
}

// besideRefused: three requests that a second descriptor, always over its
// limit, makes over the limit: with stop_increment A records none of
// them, while B and C record what they admit themselves.
func (f *shadowFixture) besideRefused(stop bool) {
	for range 3 {
		f.check("y", 1, "block")
	}
	want := [3]held{{limiter.OK, 0}, {limiter.OK, 7}, {limiter.OverLimit, 0}}
	if stop {
		want = [3]held{{limiter.OK, 3}, {limiter.OK, 7}, {limiter.OK, 0}}
	}
	if got := f.read("y"); got != want {
		f.t.Errorf("after 3 requests refused by another descriptor the limits hold %+v, want %+v", got, want)
	}
}

// besideAdmitted: three requests beside a second descriptor within its
// limit: C would refuse the third, which A and the other descriptor admit
// and record all the same.
func (f *shadowFixture) besideAdmitted(stop bool) {
	for i := range 3 {
		if st, _ := f.check("z", 1, "free"); st.Code != limiter.OK {
			f.t.Errorf("request %d beside a descriptor within its limit: %+v, want OK", i+1, st)
		}
	}
	want := [3]held{{limiter.OK, 0}, {limiter.OK, 7}, {limiter.OverLimit, 0}}
	if stop {
		want = [3]held{{limiter.OK, 0}, {limiter.OK, 7}, {limiter.OK, 0}}
	}
	if got := f.read("z"); got != want {
		f.t.Errorf("after 3 requests a shadow limit would refuse once, the limits hold %+v, want %+v", got, want)
	}
}

// testShadowConcurrency: 32 goroutines, single-hit requests, day and week
// windows: an enforced limit of 40 a day (a token bucket where the store
// runs one) beside a stricter shadow limit of 10 of the same algorithm
// and window (its twin) and a looser one of 60 a week, a fixed window. Adding them admits exactly what the
// enforced limit alone would (never more where groups are applied one by
// one); each shadow limit would admit exactly its own limit, and would
// refuse the rest.
func testShadowConcurrency(t *testing.T, store limiter.Store, alg rules.Algorithm, stop, oneByOne bool) {
	const goroutines, requests = 32, 100
	domain, limits := shadowDomain(t, fmt.Sprintf(`      - {unit: day, requests_per_unit: 40, algorithm: %[1]s}
      - {unit: day, requests_per_unit: 10, algorithm: %[1]s, shadow_mode: true}
      - {unit: week, requests_per_unit: 60, shadow_mode: true, name: loose}
`, alg))
	lim := limits["user"]
	l := limiter.New(store, limiter.Config{StopIncrementWhenOverLimit: stop})
	entries := []rules.Entry{{Key: "user", Value: "hot"}}
	now := base.Add(10 * time.Second)
	var admitted, strictRefused, looseRefused atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			out := make([]limiter.Status, 1)
			each := make([]limiter.Status, 3)
			ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: 1, Each: each}}
			for range requests {
				if err := l.Check(context.Background(), domain, now, ds, out); err != nil {
					failed.Store(err)
					return
				}
				if out[0].Code == limiter.OK {
					admitted.Add(1)
				}
				strictRefused.Add(int64(each[1].Counts.ShadowOverLimit))
				looseRefused.Add(int64(each[2].Counts.ShadowOverLimit))
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("Check: %v", err)
	}
	const total = goroutines * requests
	switch got := admitted.Load(); {
	case got > 40:
		t.Errorf("admitted %d of %d requests, more than the enforced limit's 40", got, total)
	case !oneByOne && got != 40:
		t.Errorf("admitted %d of %d requests, want exactly the enforced limit's 40", got, total)
	}
	if got := strictRefused.Load(); got != total-10 {
		t.Errorf("the shadow limit of 10 would have refused %d of %d requests, want %d", got, total, total-10)
	}
	if got := looseRefused.Load(); got != total-60 {
		t.Errorf("the shadow limit of 60 would have refused %d of %d requests, want %d", got, total, total-60)
	}
}
