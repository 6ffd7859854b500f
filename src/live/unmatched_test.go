package live

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// clockAt returns a clock the test moves.
func clockAt(t0 time.Time) (now func() time.Time, set func(time.Time)) {
	cur := t0
	return func() time.Time { return cur }, func(t time.Time) { cur = t }
}

// TestUnmatchedTables: unknown domains and the key chains of descriptors
// no rule matched are counted, most first, each key chain with its last
// descriptor as an example; they are forgotten a minute after they were
// last seen.
func TestUnmatchedTables(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now, set := clockAt(t0)
	r := New(Config{Now: now})
	for i := range 5 {
		r.UnknownDomain("wbe")
		r.NoRule("api", []rules.Entry{{Key: "usr", Value: fmt.Sprint("u", i)}})
	}
	r.UnknownDomain("other")
	r.NoRule("api", []rules.Entry{{Key: "path", Value: "/x"}, {Key: "method", Value: "GET"}})
	r.NoRule("api", nil) // no entries: nothing to show

	domains := r.UnknownDomains(10)
	if got := fmt.Sprintf("%d %s %d %s %d", len(domains), domains[0].Domain, domains[0].Count, domains[1].Domain, domains[1].Count); got != "2 wbe 5 other 1" {
		t.Errorf("UnknownDomains = %+v", domains)
	}
	keys := r.UnmatchedKeys(10)
	if len(keys) != 2 {
		t.Fatalf("UnmatchedKeys = %+v, want 2 chains", keys)
	}
	if k := keys[0]; k.Domain != "api" || fmt.Sprint(k.Keys) != "[usr]" || k.Count != 5 || fmt.Sprint(k.Example) != "[{usr u4}]" {
		t.Errorf("first chain = %+v, want api [usr] count 5, example usr=u4", k)
	}
	if k := keys[1]; fmt.Sprint(k.Keys) != "[path method]" || fmt.Sprint(k.Example) != "[{path /x} {method GET}]" {
		t.Errorf("second chain = %+v", k)
	}
	if got := r.UnmatchedKeys(1); len(got) != 1 {
		t.Errorf("UnmatchedKeys(1) = %d entries", len(got))
	}

	set(t0.Add(keyIdle + time.Second))
	if d, k := r.UnknownDomains(10), r.UnmatchedKeys(10); len(d)+len(k) != 0 {
		t.Errorf("after a minute idle: %+v %+v, want nothing", d, k)
	}
}

// TestUnmatchedTablesBounded: a flood of distinct domains and key chains
// (an attacker's) keeps each table at its capacity, and a domain asked
// all along stays first; past a second's unmatchedExact observations,
// one in unmatchedSample is recorded, counted unmatchedSample times.
func TestUnmatchedTablesBounded(t *testing.T) {
	now, _ := clockAt(time.Unix(1_700_000_000, 0))
	r := New(Config{Now: now})
	long := strings.Repeat("k", 300)
	for i := range 20_000 {
		r.UnknownDomain(fmt.Sprint("d", i))
		r.UnknownDomain("wbe")
		r.NoRule("api", []rules.Entry{{Key: fmt.Sprint(long, i), Value: "v"}})
		if i%100 == 0 {
			r.Tick(now()) // renew the budget: every observation recorded until unmatchedExact a second
		}
	}
	d := r.UnknownDomains(MaxUnknownDomains * 2)
	if len(d) > MaxUnknownDomains || len(r.unknownDomains.slots) > MaxUnknownDomains {
		t.Errorf("%d unknown domains held, want at most %d", len(r.unknownDomains.slots), MaxUnknownDomains)
	}
	if d[0].Domain != "wbe" {
		t.Errorf("first unknown domain %q, want the one asked all along", d[0].Domain)
	}
	k := r.UnmatchedKeys(MaxUnmatchedKeys * 2)
	if len(k) > MaxUnmatchedKeys || len(r.unmatchedKeys.slots) > MaxUnmatchedKeys {
		t.Errorf("%d key chains held, want at most %d", len(r.unmatchedKeys.slots), MaxUnmatchedKeys)
	}
	if !k[0].Truncated || len(k[0].Keys[0]) >= len(long) {
		t.Errorf("a 300-byte key is shown whole: %+v", k[0])
	}

	// Sampling past the budget: the count stays an estimate of all.
	s := New(Config{Now: now})
	const n = 100_000
	for range n {
		s.UnknownDomain("flood")
	}
	got := s.UnknownDomains(1)[0].Count
	if got < n/2 || got > 2*n {
		t.Errorf("count %d for %d requests in a second, want about %d", got, n, n)
	}
}

// TestUnmatchedAllocs: recording what matched nothing allocates nothing.
func TestUnmatchedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race; make allocs runs this test")
	}
	r := New(Config{})
	entries := []rules.Entry{{Key: "path", Value: "/x"}, {Key: "method", Value: "GET"}}
	domains := make([]string, 500)
	for i := range domains {
		domains[i] = fmt.Sprint("domain-", i)
	}
	i := 0
	allocs := testing.AllocsPerRun(5000, func() {
		r.UnknownDomain(domains[i%len(domains)])
		r.NoRule(domains[i%len(domains)], entries)
		i++
	})
	if allocs > 0 {
		t.Errorf("recording an unmatched request allocates %v times, want 0", allocs)
	}
}
