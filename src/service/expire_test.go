package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

const expiryTest = `domain: test
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: page
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`

const expiryGone = `domain: gone
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// TestStatsExpiry: the statistics of a domain removed by a reload, and
// keys made of request values, go once they have gone STATS_IDLE_EXPIRY
// without a hit; the rules in use keep theirs however idle; a freed
// request-value slot takes a new value instead of _overflow.
func TestStatsExpiry(t *testing.T) {
	f := newFixture(t, service.Config{MaxDynamicStatKeys: 2, StatsExpiry: 10 * time.Minute})
	load := func(texts ...string) {
		var files []rules.File
		for i, text := range texts {
			files = append(files, rules.File{Name: string(rune('a'+i)) + ".yaml", Data: []byte(text)})
		}
		c, err := rules.Parse(files, rules.Options{})
		if err != nil {
			t.Fatal(err)
		}
		f.svc.SetRules(c)
	}
	hit := func(domain string, kv ...string) {
		r := req(desc(kv...))
		r.Domain = domain
		f.call(t, r)
	}
	names := func() map[string]uint64 { return f.reg.Snapshot() }
	sweep := func() { service.ExpireStats(f.svc, *f.clock.Load()) }

	load(expiryTest, expiryGone)
	hit("test", "user", "u")
	hit("gone", "user", "u")
	hit("test", "page", "p1")
	hit("test", "page", "p2")
	hit("test", "page", "p3") // past the two slots
	hit("nowhere", "user", "u")
	service.CountDecision(f.svc, "gone", true)
	for _, want := range []string{"ratelimit.service.rate_limit.gone.user.", "ratelimit.service.rate_limit.test.page_p1.",
		"ratelimit.service.rate_limit.test._overflow.", "ratelimit.service.decisions.__code=OK.__domain=gone"} {
		if !has(names(), want) {
			t.Fatalf("no statistic %s* before the expiry", want)
		}
	}

	load(expiryTest) // domain gone removed
	sweep()
	f.advance(5 * time.Minute)
	hit("test", "page", "p1") // p1 stays busy
	sweep()
	f.advance(6 * time.Minute)
	sweep()
	got := names()
	for _, gone := range []string{"ratelimit.service.rate_limit.gone.", "ratelimit.service.rate_limit.test.page_p2.",
		"ratelimit.service.rate_limit.test._overflow.", "ratelimit.service.rate_limit.nowhere.domain_not_found",
		"ratelimit.service.decisions.__code=OK.__domain=gone"} {
		if has(got, gone) {
			t.Errorf("%s* still there after 11 minutes without a hit", gone)
		}
	}
	// Idle for 11 minutes too, but a rule in use: kept.
	if !has(got, "ratelimit.service.rate_limit.test.user.total_hits") {
		t.Error("the rule in use lost its statistics")
	}
	if got["ratelimit.service.rate_limit.test.page_p1.total_hits"] != 2 {
		t.Errorf("page_p1 total_hits = %d, want 2: hit within the expiry, it stays", got["ratelimit.service.rate_limit.test.page_p1.total_hits"])
	}

	// p2's slot is free: a new value gets its own key, not _overflow.
	hit("test", "page", "p4")
	got = names()
	if got["ratelimit.service.rate_limit.test.page_p4.total_hits"] != 1 || has(got, "ratelimit.service.rate_limit.test._overflow.") {
		t.Errorf("a new value after the expiry: page_p4 %d, overflow present %v; want its own key",
			got["ratelimit.service.rate_limit.test.page_p4.total_hits"], has(got, "ratelimit.service.rate_limit.test._overflow."))
	}
	// The domain back: its counters start again from zero.
	load(expiryTest, expiryGone)
	hit("gone", "user", "u")
	if got := names()["ratelimit.service.rate_limit.gone.user.total_hits"]; got != 1 {
		t.Errorf("gone.user total_hits = %d after the domain came back, want 1", got)
	}
}

func has(snapshot map[string]uint64, prefix string) bool {
	for name := range snapshot {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}
