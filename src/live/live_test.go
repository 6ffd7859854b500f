package live

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

func parse(t testing.TB, yaml string) *rules.Config {
	t.Helper()
	c, err := rules.Parse([]rules.File{{Name: "t.yaml", Data: []byte(yaml)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const testRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5}
`

func okStatus(remaining uint32, near bool) limiter.Status {
	st := limiter.Status{Code: limiter.OK, Remaining: remaining, ResetAfter: 30 * time.Second, Counts: limiter.Counts{TotalHits: 1, WithinLimit: 1}}
	if near {
		st.Counts.NearLimit = 1
	}
	return st
}

func overStatus() limiter.Status {
	return limiter.Status{Code: limiter.OverLimit, ResetAfter: 30 * time.Second, Counts: limiter.Counts{TotalHits: 1, OverLimit: 1}}
}

// find returns the rule with FullKey key.
func find(c *rules.Config, key string) *rules.Limit {
	for _, l := range c.Limits() {
		if l.FullKey == key {
			return l
		}
	}
	return nil
}

func TestTrafficPerRuleAndSecond(t *testing.T) {
	r := New(Config{Now: func() time.Time { return epoch }})
	cfg := parse(t, testRules)
	r.SetRules(cfg)
	user, ip := find(cfg, "api.user"), find(cfg, "api.ip")
	e := []rules.Entry{{Key: "user", Value: "alice"}}

	r.Tick(epoch)
	ok, near, over := okStatus(5, false), okStatus(1, true), overStatus()
	for range 3 {
		r.Observe("api", e, user, &ok, epoch)
	}
	r.Observe("api", e, user, &near, epoch)
	r.Observe("api", e, user, &over, epoch)
	r.Observe("api", []rules.Entry{{Key: "ip", Value: "1"}}, ip, &ok, epoch)
	r.Tick(epoch.Add(time.Second))
	// Nothing in the next second; then a gap of two seconds without ticks.
	r.Tick(epoch.Add(2 * time.Second))
	r.Observe("api", e, user, &ok, epoch)
	r.Tick(epoch.Add(5 * time.Second))

	tr := r.Traffic(6)
	if !tr.End.Equal(epoch.Add(5 * time.Second)) {
		t.Fatalf("End = %v", tr.End)
	}
	want := Series{
		Decisions: []uint32{0, 5, 0, 0, 0, 1},
		OverLimit: []uint32{0, 1, 0, 0, 0, 0},
		NearLimit: []uint32{0, 1, 0, 0, 0, 0},
	}
	if got := tr.Rules["api.user"]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("api.user = %v, want %v", got, want)
	}
	if got := tr.Rules["api.ip"].Decisions; !slices.Equal(got, []uint32{0, 1, 0, 0, 0, 0}) {
		t.Fatalf("api.ip decisions = %v", got)
	}
	if got := tr.Totals.Decisions; !slices.Equal(got, []uint32{0, 6, 0, 0, 0, 1}) {
		t.Fatalf("total decisions = %v", got)
	}
	// A full window later, every figure has left the window.
	r.Tick(epoch.Add((5 + Window) * time.Second))
	for _, v := range r.Traffic(Window).Rules["api.user"].Decisions {
		if v != 0 {
			t.Fatalf("a figure older than the window is still there: %v", r.Traffic(Window).Rules["api.user"].Decisions)
		}
	}
}

func TestReloadKeepsSeriesOfKeptRules(t *testing.T) {
	r := New(Config{Now: func() time.Time { return epoch }})
	cfg := parse(t, testRules)
	r.SetRules(cfg)
	r.Tick(epoch)
	ok := okStatus(5, false)
	r.Observe("api", []rules.Entry{{Key: "user", Value: "a"}}, find(cfg, "api.user"), &ok, epoch)
	r.Tick(epoch.Add(time.Second))

	// The user limit changes, ip goes, path comes.
	cfg2 := parse(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	r.SetRules(cfg2)
	rs, version := r.Rules()
	if version != 2 || len(rs) != 2 {
		t.Fatalf("Rules() = %v, %d", rs, version)
	}
	// A decision with the new rules counts in the kept series; one of
	// the old rules still in flight (its limit is cached from before)
	// counts nowhere.
	r.Observe("api", []rules.Entry{{Key: "user", Value: "a"}}, find(cfg2, "api.user"), &ok, epoch)
	r.Observe("api", []rules.Entry{{Key: "user", Value: "a"}}, find(cfg, "api.user"), &ok, epoch)
	r.Tick(epoch.Add(2 * time.Second))
	tr := r.Traffic(2)
	if got := tr.Rules["api.user"].Decisions; !slices.Equal(got, []uint32{1, 1}) {
		t.Fatalf("api.user across the reload = %v, want [1 1]", got)
	}
	if _, ok := tr.Rules["api.ip"]; ok {
		t.Fatal("a removed rule still has a series")
	}
	if got := tr.Rules["api.path"].Decisions; !slices.Equal(got, []uint32{0, 0}) {
		t.Fatalf("a new rule's series = %v", got)
	}
}

func TestMaxRulesBoundsSeries(t *testing.T) {
	r := New(Config{MaxRules: 1, Now: func() time.Time { return epoch }})
	cfg := parse(t, testRules)
	r.SetRules(cfg)
	rs, _ := r.Rules()
	if len(rs) != 2 || rs[0].Tracked == rs[1].Tracked {
		t.Fatalf("rules = %+v, want one of two tracked", rs)
	}
	untracked := rs[1]
	if rs[0].Tracked == false {
		untracked = rs[0]
	}
	over := overStatus()
	over.Counts.NearLimit = 1 // crossing the limit: always recorded
	r.Observe("api", []rules.Entry{{Key: "k", Value: "v"}}, untracked.Limit, &over, epoch)
	r.Tick(epoch)
	if n := len(r.Traffic(1).Rules); n != 1 {
		t.Fatalf("%d series, want 1", n)
	}
	// An untracked rule's keys still show.
	if keys := r.TopKeys(5)["api"]; len(keys) != 1 || keys[0].RuleID != untracked.ID {
		t.Fatalf("top keys = %+v", keys)
	}
}

func TestDuplicateKeysGetDistinctIDs(t *testing.T) {
	// Rules with several limits per descriptor list one key several times.
	l := parse(t, testRules).Limits()
	got := ruleIDs([]*rules.Limit{l[0], l[1], l[0], l[0]})
	if want := []string{"api.ip", "api.user", "api.ip#2", "api.ip#3"}; !slices.Equal(got, want) {
		t.Fatalf("ruleIDs = %q, want %q", got, want)
	}
}

func TestTopKeysFromObserve(t *testing.T) {
	now := epoch
	r := New(Config{Now: func() time.Time { return now }})
	cfg := parse(t, testRules)
	r.SetRules(cfg)
	user := find(cfg, "api.user")
	ok, near := okStatus(5, false), okStatus(2, true)
	// Far from the limit: not a top key.
	r.Observe("api", []rules.Entry{{Key: "user", Value: "calm"}}, user, &ok, now)
	for i := range 4 {
		// One near decision in 4 is recorded, by the clock's bits.
		r.Observe("api", []rules.Entry{{Key: "user", Value: "busy"}}, user, &near, now.Add(time.Duration(i)<<12))
	}
	crossing := overStatus()
	crossing.Counts.NearLimit = 1 // this decision crossed the limit: never sampled out
	r.Observe("api", []rules.Entry{{Key: "user", Value: "<script>"}}, user, &crossing, now)
	// A per-request override counts too, named by its limit.
	ovr := &rules.Limit{Domain: "api", RequestsPerUnit: 2, Unit: rules.Hour, UnitMultiplier: 1}
	r.Observe("api", []rules.Entry{{Key: "route", Value: "/x"}}, ovr, &crossing, now)

	now = now.Add(time.Second)
	keys := r.TopKeys(10)["api"]
	var got []string
	for _, k := range keys {
		got = append(got, fmt.Sprintf("%s=%s %s %d/%d over=%v", k.Entries[0].Key, k.Entries[0].Value, k.RuleID, k.Used, k.Capacity, k.Over))
	}
	want := []string{
		"route=/x  2/2 over=true",
		"user=<script> api.user 10/10 over=true",
		"user=busy api.user 8/10 over=false",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("top keys:\n%q\nwant\n%q", got, want)
	}
	if keys[1].ResetIn != 29*time.Second {
		t.Fatalf("ResetIn = %v", keys[1].ResetIn)
	}
	// Keys not seen for a minute are dropped even before their reset.
	now = now.Add(time.Minute)
	if keys := r.TopKeys(10); len(keys) != 0 {
		t.Fatalf("stale keys: %v", keys)
	}
}

func TestStoreLatencyAndErrors(t *testing.T) {
	r := New(Config{})
	r.Tick(epoch)
	for i := range 100 {
		// Durations of i ms, recorded as the hot path would.
		r.store.buckets[latencyBucket(time.Duration(i)*time.Millisecond)].Add(1)
	}
	r.StoreDone(time.Time{}, errors.New("store: down"))
	r.StoreDone(time.Time{}, fmt.Errorf("x: %w", context.Canceled)) // the caller's: not counted
	r.Tick(epoch.Add(time.Second))
	l, errs := r.StoreLatency()
	if errs != 1 || l.Samples != 100 || l.Window != time.Second {
		t.Fatalf("latency %+v, errors %d", l, errs)
	}
	within := func(got, want time.Duration) bool { return got >= want && got <= want+want/4+time.Microsecond }
	if !within(l.P50, 49*time.Millisecond) || !within(l.P90, 89*time.Millisecond) || !within(l.P99, 98*time.Millisecond) || !within(l.Max, 99*time.Millisecond) {
		t.Fatalf("percentiles %+v", l)
	}
	// A minute later the samples have left the window.
	for i := 2; i <= 62; i++ {
		r.Tick(epoch.Add(time.Duration(i) * time.Second))
	}
	if l, errs := r.StoreLatency(); l.Samples != 0 || errs != 0 || l.Window != time.Minute {
		t.Fatalf("after a minute: %+v, %d errors", l, errs)
	}
}

func TestLatencyBuckets(t *testing.T) {
	prev := -1
	for _, d := range []time.Duration{0, 999, time.Microsecond, 3 * time.Microsecond, 4 * time.Microsecond, 5 * time.Microsecond,
		7 * time.Microsecond, 8 * time.Microsecond, 100 * time.Microsecond, time.Millisecond, time.Second, time.Minute, time.Hour} {
		b := latencyBucket(d)
		if b < prev || b >= latencyBuckets {
			t.Fatalf("latencyBucket(%v) = %d after %d", d, b, prev)
		}
		prev = b
		if up := latencyUpper(b); up <= d && b < latencyBuckets-1 {
			t.Fatalf("latencyUpper(%d) = %v, below %v", b, up, d)
		} else if b < latencyBuckets-1 && d >= 4*time.Microsecond && up > d+d/4+time.Microsecond {
			t.Fatalf("latencyUpper(%d) = %v, too far above %v", b, up, d)
		}
	}
}

func TestNilRecorderRecordsNothing(t *testing.T) {
	var r *Recorder
	st := overStatus()
	r.SetRules(nil)
	r.Observe("d", nil, testLimit(1), &st, epoch)
	r.StoreDone(r.StoreStart(time.Now()), nil)
	r.Tick(epoch)
	if rs, _ := r.Rules(); rs != nil || len(r.TopKeys(1)) != 0 || r.Ticked() != nil {
		t.Fatal("a nil recorder returned something")
	}
}

func TestTickedIsClosedByTick(t *testing.T) {
	r := New(Config{})
	c := r.Ticked()
	select {
	case <-c:
		t.Fatal("closed before the tick")
	default:
	}
	r.Tick(epoch)
	select {
	case <-c:
	default:
		t.Fatal("not closed by the tick")
	}
	if r.Ticked() == c {
		t.Fatal("the next tick's channel is the same")
	}
}

func TestObserveAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race; make allocs runs this test")
	}
	r := New(Config{})
	cfg := parse(t, testRules)
	r.SetRules(cfg)
	user := find(cfg, "api.user")
	entries := []rules.Entry{{Key: "user", Value: "alice"}}
	for _, tt := range []struct {
		name string
		st   limiter.Status
	}{{"ok", okStatus(5, false)}, {"near", okStatus(1, true)}, {"over", overStatus()}} {
		i := 0
		allocs := testing.AllocsPerRun(1000, func() {
			entries[0].Value = values[i%len(values)]
			i++
			r.Observe("api", entries, user, &tt.st, epoch)
			r.StoreDone(r.StoreStart(time.Now()), nil)
		})
		if allocs != 0 {
			t.Errorf("%s: Observe allocates %v times, want 0", tt.name, allocs)
		}
	}
}

// values are 5,000 distinct keys: more than the sketch holds.
var values = func() []string {
	v := make([]string, 5000)
	for i := range v {
		v[i] = fmt.Sprint("user-", i)
	}
	return v
}()

func BenchmarkObserve(b *testing.B) {
	r := New(Config{})
	cfg := parse(b, testRules)
	r.SetRules(cfg)
	user := find(cfg, "api.user")
	for _, tt := range []struct {
		name string
		st   limiter.Status
	}{{"ok", okStatus(5, false)}, {"near", okStatus(1, true)}, {"over", overStatus()}} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				entries := []rules.Entry{{Key: "user"}}
				i := 0
				for pb.Next() {
					entries[0].Value = values[i%len(values)]
					i++
					// The clock's bits pick the samples: vary them.
					r.Observe("api", entries, user, &tt.st, epoch.Add(time.Duration(i*977)))
				}
			})
		})
	}
}

// TestFullTableOfLimitedKeys: when every slot holds a key at its limit
// right now, a key that only fills its own limit is skipped without cost,
// one over its limit still enters, and once those windows end new keys
// enter again.
func TestFullTableOfLimitedKeys(t *testing.T) {
	now := epoch
	r := New(Config{MaxKeys: 16, Now: func() time.Time { return now }})
	cfg := parse(t, testRules)
	r.SetRules(cfg)
	user := find(cfg, "api.user")
	fill := okStatus(0, true) // resets in 30 s
	observe := func(value string, st limiter.Status) {
		r.Observe("api", []rules.Entry{{Key: "user", Value: value}}, user, &st, now)
	}
	shown := func(value string) bool {
		for _, k := range r.TopKeys(100)["api"] {
			if k.Entries[0].Value == value {
				return true
			}
		}
		return false
	}
	for i := range 16 {
		observe(fmt.Sprint("held-", i), fill)
	}
	r.Tick(now)
	observe("filler", fill)
	if shown("filler") {
		t.Fatal("a key filling its limit took the slot of a key limited right now")
	}
	crossing := overStatus()
	crossing.Counts.NearLimit = 1
	observe("refused", crossing)
	if !shown("refused") {
		t.Fatal("a key over its limit did not enter")
	}
	now = now.Add(31 * time.Second)
	r.Tick(now)
	observe("filler", fill)
	if !shown("filler") {
		t.Fatal("after the windows ended, a key filling its limit did not enter")
	}
}

// TestListLimitsAreRulesOfTheirOwn: every limit of a rate_limits list is a
// rule of the live view, named as in its statistics.
func TestListLimitsAreRulesOfTheirOwn(t *testing.T) {
	r := New(Config{})
	r.SetRules(parse(t, `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, name: sustained}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5}
`))
	got, _ := r.Rules()
	var ids []string
	for _, rule := range got {
		ids = append(ids, fmt.Sprintf("%s=%d/%s", rule.ID, rule.Limit.RequestsPerUnit, rule.Limit.Unit))
	}
	want := []string{"api.ip=5/SECOND", "api.user.second=2/SECOND", "api.user.sustained=5/MINUTE"}
	if !slices.Equal(ids, want) {
		t.Errorf("rules %v, want %v", ids, want)
	}
}

// TestHeapKeepsNoReplacedRuleSet loads a thousand rule sets, each with a
// key decided over its limit (a top-keys slot and the rule cache hold it):
// the heap after GC does not grow with the number of sets loaded. Each set
// was pinned whole before (49 MB -> 306 MB in the service). Heap figures
// need a build without the race detector: make allocs runs it.
func TestHeapKeepsNoReplacedRuleSet(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes heap figures meaningless: make allocs runs this test")
	}
	// 50 rules with 1 KiB keys: about 80 KiB a set.
	var b strings.Builder
	b.WriteString("domain: api\ndescriptors:\n")
	for i := range 50 {
		fmt.Fprintf(&b, "  - key: k%04d%s\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", i, strings.Repeat("x", 1024))
	}
	text := b.String()
	r := New(Config{MaxKeys: 4096})
	now := time.Unix(1_700_000_000, 0)
	over := overStatus()
	load := func(i int) {
		c := parse(t, text)
		r.SetRules(c)
		l := c.Limits()[i%50]
		r.Observe("api", []rules.Entry{{Key: l.Levels[0], Value: fmt.Sprint(i)}}, l, &over, now)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for i := range 50 {
		load(i)
	}
	base := heap()
	for i := 50; i < 1000; i++ {
		load(i)
	}
	after := heap()
	runtime.KeepAlive(r)
	// 950 more sets pinned would be about 75 MB; what grows is the
	// slots' own keys and limits (1 KiB and a little each).
	if after > base+8<<20 {
		t.Errorf("heap after GC %d MB with 50 sets loaded, %d MB with 1000: replaced rule sets are kept", base>>20, after>>20)
	}
	t.Logf("heap after GC: %d MB after 50 sets, %d MB after 1000", base>>20, after>>20)
}
