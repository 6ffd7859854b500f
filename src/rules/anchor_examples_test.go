package rules

import (
	"testing"
)

// The rules of envoyproxy/ratelimit's repository beyond its README (whose
// examples are TestMatchExample1 to 9): the demo it runs with Envoy
// (examples/ratelimit/config) and the rules of its integration tests
// (test/integration/runtime), as fixtures of our own that keep each
// file's point. All of them load together, as they do in the anchor's
// demo, and each descriptor the anchor's README or tests send gets the
// limit they state.

// anchorFixtures are every fixture of this file, loaded at once.
var anchorFixtures = []string{
	"anchor_demo", "anchor_mongo", "anchor_quota",
	"anchor_basic", "anchor_another", "anchor_share", "anchor_sanitize",
}

func TestAnchorExamplesLoadTogether(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, anchorFixtures...)
	want := []string{"another", "basic", "mongo_cps", "quota", "rl", "sanitize", "share-threshold-test"}
	got := cfg.Domains()
	if len(got) != len(want) {
		t.Fatalf("Domains() = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Domains() = %v, want %v", got, want)
		}
	}
}

// TestAnchorDemo sends the descriptors of the anchor's demo requests
// (curl /test, /header, /twoheader with the README's headers).
func TestAnchorDemo(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, anchorFixtures...)
	checkMatches(t, cfg, "rl", []matchCase{
		// curl /test: the route's source and destination clusters.
		{give: entries("source_cluster=proxy", "destination_cluster=mock"), fullKey: "rl.source_cluster_proxy.destination_cluster_mock", rpu: 4},
		{give: entries("source_cluster=proxy", "destination_cluster=other")},
		{give: entries("source_cluster=proxy")},
		// curl /header -H "foo: foo".
		{give: entries("foo=foo"), fullKey: "rl.foo", rpu: 5},
		// curl /twoheader -H "foo: foo" -H "bar: bar".
		{give: entries("foo=foo", "bar=bar"), fullKey: "rl.foo.bar", rpu: 6},
		// -H "bar: banned": a limit of 0, every request refused.
		{give: entries("foo=foo", "bar=banned"), fullKey: "rl.foo.bar_banned", rpu: 0},
		// -H "baz: baz": limited per second.
		{give: entries("foo=foo", "baz=baz"), fullKey: "rl.foo.baz", rpu: 2},
		// -H "baz: not-so-shady": the key-only rule, so limited too.
		{give: entries("foo=foo", "baz=not-so-shady"), fullKey: "rl.foo.baz", rpu: 2},
		// -H "baz: shady": its own rule, in shadow mode.
		{give: entries("foo=foo", "baz=shady"), fullKey: "rl.foo.baz_shady", rpu: 1},
		{give: entries("foo=foo", "bay=anything"), fullKey: "rl.foo.bay", rpu: 0},
		{give: entries("qux=anything"), fullKey: "rl.qux", rpu: 0},
		{give: entries("foo=foo", "other=x")},
	})
	flags := []struct {
		give              []Entry
		shadow, unlimited bool
		unit              Unit
	}{
		{give: entries("foo=foo", "baz=shady"), shadow: true, unit: Minute},
		{give: entries("foo=foo", "baz=not-so-shady"), unit: Second},
		{give: entries("foo=foo", "bar=banned"), unit: Minute},
		{give: entries("foo=foo", "bay=b"), unlimited: true},
		{give: entries("qux=q"), unlimited: true},
	}
	for _, f := range flags {
		l := cfg.Match("rl", f.give).Limit
		if l.ShadowMode != f.shadow || l.Unlimited != f.unlimited || l.Unit != f.unit {
			t.Errorf("Match(rl, %v) = shadow %t, unlimited %t, unit %v; want %t, %t, %v",
				f.give, l.ShadowMode, l.Unlimited, l.Unit, f.shadow, f.unlimited, f.unit)
		}
	}
}

func TestAnchorDemoMongoAndQuota(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, anchorFixtures...)
	checkMatches(t, cfg, "mongo_cps", []matchCase{
		{give: entries("database=users"), fullKey: "mongo_cps.database_users", rpu: 7},
		{give: entries("database=default"), fullKey: "mongo_cps.database_default", rpu: 7},
		{give: entries("database=other")},
	})
	checkMatches(t, cfg, "quota", []matchCase{
		{give: entries("service=service_1"), fullKey: "quota.service_service_1", rpu: 3},
		{give: entries("service=service_2"), fullKey: "quota.service_service_2", rpu: 6},
		{give: entries("service=service_3")},
	})
	for _, s := range []string{"service_1", "service_2"} {
		if l := cfg.Match("quota", entries("service="+s)).Limit; !l.QuotaMode || l.Unit != Minute {
			t.Errorf("quota %s: QuotaMode %t, unit %v; want true, MINUTE", s, l.QuotaMode, l.Unit)
		}
	}
}

// TestAnchorIntegrationRules sends what the anchor's integration tests
// send to its rules.
func TestAnchorIntegrationRules(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, anchorFixtures...)
	checkMatches(t, cfg, "basic", []matchCase{
		{give: entries("key1=foo"), fullKey: "basic.key1", rpu: 40},
		{give: entries("key1_local=foo"), fullKey: "basic.key1_local", rpu: 40},
		{give: entries("one_per_minute=foo"), fullKey: "basic.one_per_minute", rpu: 1},
		{give: entries("key2=foo")},
	})
	checkMatches(t, cfg, "another", []matchCase{
		{give: entries("key2=foo"), fullKey: "another.key2", rpu: 15},
		{give: entries("key3=foo"), fullKey: "another.key3", rpu: 8},
		{give: entries("key4=foo"), fullKey: "another.key4", rpu: 12},
		{give: entries("key2_local=foo"), fullKey: "another.key2_local", rpu: 15},
		{give: entries("key3_local=foo"), fullKey: "another.key3_local", rpu: 8},
		{give: entries("key4_local=foo"), fullKey: "another.key4_local", rpu: 12},
	})
	for key, unit := range map[string]Unit{"key2": Minute, "key3": Hour, "key4": Day} {
		if l := cfg.Match("another", entries(key+"=v")).Limit; l.Unit != unit {
			t.Errorf("another.%s: unit %v, want %v", key, l.Unit, unit)
		}
	}
	checkMatches(t, cfg, "share-threshold-test", []matchCase{
		// Every file under files/ counts against one shared counter...
		{give: entries("files=files/a.pdf"), fullKey: "share-threshold-test.files_files/*", rpu: 12, keyEnts: entries("files=files/*")},
		{give: entries("files=files/b.csv"), fullKey: "share-threshold-test.files_files/*", rpu: 12, keyEnts: entries("files=files/*")},
		// ...where each file under files_no_share/ has its own.
		{give: entries("files_no_share=files_no_share/a.pdf"), fullKey: "share-threshold-test.files_no_share_files_no_share/*", rpu: 12},
		{give: entries("files=other/a.pdf")},
	})
	checkMatches(t, cfg, "sanitize", []matchCase{
		{give: entries("grpc_path=/pb.Service/Method"), fullKey: "sanitize.grpc_path", rpu: 45, stat: "sanitize.grpc_path_/pb.Service/Method"},
		{give: entries("detailed_path=/a:b/c"), fullKey: "sanitize.detailed_path", rpu: 45, stat: "sanitize.detailed_path_/a:b/c"},
	})
}
