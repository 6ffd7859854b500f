package rules

import (
	"strings"
	"testing"
	"time"
)

func parseQuotaFixtures(t *testing.T) *Config {
	t.Helper()
	files := []File{readFile(t, "testdata/quota/web.yaml"), readFile(t, "testdata/quota/no_default.yaml")}
	c, err := Parse(files, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestQuotaRules(t *testing.T) {
	t.Parallel()
	c := parseQuotaFixtures(t)
	if !c.HasQuota() {
		t.Fatal("HasQuota() = false")
	}
	got := c.QuotaRules()
	if len(got) != 6 {
		t.Fatalf("QuotaRules() has %d rules, want 6", len(got))
	}
	// Domains sorted (mobile before web), each in file order.
	tests := []struct {
		give       *QuotaRule
		wantSource string
		wantRate   float64
		wantBurst  uint32
		wantWindow time.Duration
		wantPolicy Policy
	}{
		{got[0], "no_default.yaml:3", 1, 3600, time.Hour, FairShare},
		{got[1], "web.yaml:8", 100, 20, time.Second, FairShare},
		{got[2], "web.yaml:13", 5, 600, 2 * time.Minute, Static},
		{got[3], "web.yaml:19", 0, 0, 0, DenyAll},
		{got[4], "web.yaml:21", 0, 0, 0, AllowAll},
		{got[5], "web.yaml:23", 5, 5, time.Second, FairShare},
	}
	for _, tt := range tests {
		q := tt.give
		if q.Source != tt.wantSource || q.Rate() != tt.wantRate || q.Capacity() != tt.wantBurst ||
			q.Window() != tt.wantWindow || q.Policy != tt.wantPolicy {
			t.Errorf("rule %s: source %s, rate %v, burst %d, window %v, policy %s; want %s, %v, %d, %v, %s",
				q, q.Source, q.Rate(), q.Capacity(), q.Window(), q.Policy,
				tt.wantSource, tt.wantRate, tt.wantBurst, tt.wantWindow, tt.wantPolicy)
		}
	}
	if !got[5].Default() || got[1].Default() {
		t.Errorf("Default() of the last web rule = %v, of the first = %v; want true, false", got[5].Default(), got[1].Default())
	}
}

func TestQuotaDump(t *testing.T) {
	t.Parallel()
	c := parseQuotaFixtures(t)
	want := []string{
		"mobile quota_buckets[1] {app=*}: unit=HOUR requests_per_unit=3600, burst: 3600, policy: fair_share",
		"web quota_buckets[1] {name=api, tenant=*}: unit=SECOND requests_per_unit=100, burst: 20, policy: fair_share, name: api-per-tenant",
		"web quota_buckets[2] {name=api, path=/v1/*, tenant~beta-[0-9]+}: unit=MINUTE requests_per_unit=600, burst: 600, unit_multiplier: 2, policy: static",
		"web quota_buckets[3] {name=blocked}: policy: deny_all",
		"web quota_buckets[4] {name=internal}: policy: allow_all",
		"web quota_buckets[5] default: unit=SECOND requests_per_unit=5, burst: 5, policy: fair_share",
	}
	dump := c.Dump()
	// The descriptor rules come first, as envoyproxy/ratelimit writes them.
	if !strings.HasPrefix(dump, "web.remote_address: unit=SECOND requests_per_unit=10") {
		t.Errorf("Dump() does not start with the descriptor rule:\n%s", dump)
	}
	if !strings.HasSuffix(dump, strings.Join(want, "\n")+"\n") {
		t.Errorf("Dump() =\n%s\nwant it to end with\n%s", dump, strings.Join(want, "\n"))
	}
}

func TestMatchQuota(t *testing.T) {
	t.Parallel()
	c := parseQuotaFixtures(t)
	tests := []struct {
		name   string
		domain string
		id     map[string]string
		want   string // the rule's Source, "" for none
	}{
		{"any_tenant", "web", map[string]string{"name": "api", "tenant": "acme"}, "web.yaml:8"},
		{"empty_value_matches_star", "web", map[string]string{"name": "api", "tenant": ""}, "web.yaml:8"},
		{"regex_and_wildcard", "web", map[string]string{"name": "api", "tenant": "beta-7", "path": "/v1/users"}, "web.yaml:13"},
		{"regex_whole_value", "web", map[string]string{"name": "api", "tenant": "xbeta-7", "path": "/v1/users"}, "web.yaml:23"},
		{"wildcard_prefix_only", "web", map[string]string{"name": "api", "tenant": "beta-7", "path": "/v2/users"}, "web.yaml:23"},
		{"exact", "web", map[string]string{"name": "blocked"}, "web.yaml:19"},
		{"exact_case_sensitive", "web", map[string]string{"name": "Blocked"}, "web.yaml:23"},
		{"extra_key_is_another_bucket", "web", map[string]string{"name": "blocked", "x": "y"}, "web.yaml:23"},
		{"missing_key_is_another_bucket", "web", map[string]string{"tenant": "acme"}, "web.yaml:23"},
		{"no_default", "mobile", map[string]string{"app": "ios"}, "no_default.yaml:3"},
		{"no_default_no_match", "mobile", map[string]string{"platform": "ios"}, ""},
		{"unknown_domain", "nope", map[string]string{"name": "api"}, ""},
		{"empty_id_gets_default", "web", map[string]string{}, "web.yaml:23"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := c.MatchQuota(tt.domain, tt.id)
			got := ""
			if q != nil {
				got = q.Source
			}
			if got != tt.want {
				t.Errorf("MatchQuota(%q, %v) = %q, want %q", tt.domain, tt.id, got, tt.want)
			}
		})
	}
	var nilConfig *Config
	if nilConfig.MatchQuota("web", map[string]string{"a": "b"}) != nil || nilConfig.HasQuota() {
		t.Error("a nil Config matches a quota rule")
	}
}

func TestQuotaErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		line int
		msg  string
	}{
		{"not_a_list", "domain: d\nquota_buckets: {a: b}\n", 2,
			`quota_buckets: want a list of bucket rules, got a map`},
		{"item_not_a_map", "domain: d\nquota_buckets:\n  - x\n", 3,
			`quota_buckets[1]: want a map with bucket, rate_limit and policy, got "x"`},
		{"misspelled_key", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    ratelimit: {unit: second, requests_per_unit: 1}\n", 4,
			`quota_buckets[1]: unknown key "ratelimit" (did you mean "rate_limit"?)`},
		{"missing_rate_limit", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n", 3,
			`quota_buckets[1]: policy fair_share needs a rate_limit (unit and requests_per_unit)`},
		{"rate_limit_with_deny_all", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    policy: deny_all\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 5,
			`quota_buckets[1]: rate_limit has no effect with policy deny_all`},
		{"unknown_policy", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    policy: fair\n", 4,
			`quota_buckets[1]: policy: unknown policy "fair" (want fair_share, static, deny_all or allow_all)`},
		{"zero_requests", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    rate_limit: {unit: second, requests_per_unit: 0}\n", 4,
			`quota_buckets[1]: rate_limit: requests_per_unit must be at least 1 (policy deny_all denies every request)`},
		{"missing_unit", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    rate_limit: {requests_per_unit: 3}\n", 4,
			`quota_buckets[1]: rate_limit: missing unit (second, minute, hour, day, week, month or year)`},
		{"bad_unit", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 3\n", 5,
			`quota_buckets[1]: rate_limit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		{"algorithm_not_for_quota", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      algorithm: token_bucket\n", 7,
			`quota_buckets[1]: rate_limit: unknown key "algorithm"`},
		{"zero_burst", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      burst: 0\n", 7,
			`quota_buckets[1]: rate_limit: burst must be at least 1 (leave it out to use requests_per_unit)`},
		{"zero_multiplier", "domain: d\nquota_buckets:\n  - bucket: {a: b}\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      unit_multiplier: 0\n", 7,
			`quota_buckets[1]: rate_limit: unit_multiplier must be at least 1`},
		{"empty_bucket", "domain: d\nquota_buckets:\n  - bucket: {}\n    policy: deny_all\n", 3,
			`quota_buckets[1]: bucket: want a map of bucket id keys to values, got an empty map (leave bucket out for the domain's default)`},
		{"bucket_list", "domain: d\nquota_buckets:\n  - bucket: [a]\n    policy: deny_all\n", 3,
			`quota_buckets[1]: bucket: want a map of bucket id keys to values, got a list (leave bucket out for the domain's default)`},
		{"bucket_value_list", "domain: d\nquota_buckets:\n  - bucket: {a: [b]}\n    policy: deny_all\n", 3,
			`quota_buckets[1]: bucket: a: want a value or {value_regex: ...}, got a list`},
		{"bad_regex", "domain: d\nquota_buckets:\n  - bucket:\n      a: {value_regex: \"(\"}\n    policy: deny_all\n", 4,
			`quota_buckets[1]: bucket: a: value_regex: invalid regular expression "(": missing closing ): "("`},
		{"misspelled_value_regex", "domain: d\nquota_buckets:\n  - bucket:\n      a: {valueregex: x}\n    policy: deny_all\n", 4,
			`quota_buckets[1]: bucket: a: unknown key "valueregex" (did you mean "value_regex"?)`},
		{"default_not_last", "domain: d\nquota_buckets:\n  - policy: deny_all\n  - bucket: {a: b}\n    policy: allow_all\n", 4,
			`quota_buckets[2]: comes after the domain's default (at fuzz.yaml:3), which matches every bucket id first; put the default last`},
		{"same_bucket_twice", "domain: d\nquota_buckets:\n  - bucket: {a: b, c: \"*\"}\n    policy: deny_all\n  - bucket: {c: \"*\", a: b}\n    policy: allow_all\n", 5,
			`quota_buckets[2]: matches the same bucket ids as the rule at fuzz.yaml:3, which wins`},
		{"duplicate_bucket_key", "domain: d\nquota_buckets:\n  - bucket:\n      a: b\n      a: c\n    policy: deny_all\n", 5,
			`quota_buckets[1]: bucket: duplicate key "a"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]File{{Name: "fuzz.yaml", Data: []byte(tt.yaml)}}, Options{})
			if c != nil {
				t.Fatalf("Parse accepted:\n%s", tt.yaml)
			}
			errs := problems(t, err)
			for _, e := range errs {
				if e.Line == tt.line && e.Msg == tt.msg {
					return
				}
			}
			t.Errorf("Parse(%s) errors:\n%v\nwant line %d: %s", tt.name, err, tt.line, tt.msg)
		})
	}
}

func TestQuotaMergedDomains(t *testing.T) {
	t.Parallel()
	files := []File{
		{Name: "a.yaml", Data: []byte("domain: d\nquota_buckets:\n  - bucket: {a: b}\n    policy: deny_all\n")},
		{Name: "b.yaml", Data: []byte("domain: d\nquota_buckets:\n  - bucket: {a: c}\n    policy: allow_all\n")},
	}
	c, err := Parse(files, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if q := c.MatchQuota("d", map[string]string{"a": "c"}); q == nil || q.Index != 2 || q.Source != "b.yaml:3" {
		t.Errorf("MatchQuota in the second file = %v, want quota_buckets[2] at b.yaml:3", q)
	}
	if _, err := Parse(files, Options{}); err == nil || !strings.Contains(err.Error(), `duplicate domain "d"`) {
		t.Errorf("Parse without MergeDomains: %v, want a duplicate domain", err)
	}
}
