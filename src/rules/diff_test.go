package rules

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// parseFiles parses rule files given as name, YAML, name, YAML, ...
func parseFiles(t *testing.T, nameYAML ...string) *Config {
	t.Helper()
	var files []File
	for i := 0; i+1 < len(nameYAML); i += 2 {
		files = append(files, File{Name: nameYAML[i], Data: []byte(nameYAML[i+1])})
	}
	cfg, err := Parse(files, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// diffBase is the old config of most TestDiff cases: each case edits one
// thing of it.
const diffBase = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 5, name: login}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: client
    value: "*"
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 6}
`

func TestDiff(t *testing.T) {
	t.Parallel()
	// edit returns diffBase with old replaced by new, once.
	edit := func(old, new string) string {
		t.Helper()
		if !strings.Contains(diffBase, old) {
			t.Fatalf("diffBase has no %q", old)
		}
		return strings.Replace(diffBase, old, new, 1)
	}
	tests := []struct {
		name     string
		from, to []string // rule files: name, YAML, name, YAML...
		want     []string // Change.String() of each change
	}{
		{
			name: "same",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", diffBase},
		},
		{
			name: "moved_to_another_file_and_line",
			from: []string{"web.yaml", diffBase, "api.yaml", "domain: api\n"},
			to: []string{
				"a/api.yaml", "domain: api\n",
				"b/web.yaml", "# a comment moves every line\n" + strings.Replace(diffBase, "{unit: minute, requests_per_unit: 10}", "\n      unit: MINUTE\n      requests_per_unit: 10", 1),
			},
		},
		{
			name: "rule_added",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", diffBase + "  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 7}\n"},
			want: []string{"+ web.ip: unit=DAY requests_per_unit=7, shadow_mode: false, quota_mode: false"},
		},
		{
			name: "rule_removed_with_its_level",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1}\n", "")},
			want: []string{"- web.path_/login.user: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false"},
		},
		{
			name: "rule_removed_level_kept",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("    rate_limit: {unit: hour, requests_per_unit: 5, name: login}\n", "")},
			want: []string{"- web.path_/login: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false, name: login"},
		},
		{
			name: "limit_changed",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("requests_per_unit: 10}", "requests_per_unit: 20}")},
			want: []string{"~ web.user: requests_per_unit 10 -> 20"},
		},
		{
			name: "unit_changed",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("{unit: minute, requests_per_unit: 10}", "{unit: hour, requests_per_unit: 10}")},
			want: []string{"~ web.user: unit MINUTE -> HOUR (counters restart)"},
		},
		{
			name: "unit_multiplier_changed",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("{unit: minute, requests_per_unit: 10}", "{unit: minute, requests_per_unit: 10, unit_multiplier: 5}")},
			want: []string{"~ web.user: unit_multiplier 1 -> 5 (counters restart)"},
		},
		{
			// 60 seconds is one minute: the same window, the same keys.
			name: "same_window_other_unit",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("{unit: minute, requests_per_unit: 10}", "{unit: second, requests_per_unit: 10, unit_multiplier: 60}")},
			want: []string{"~ web.user: unit MINUTE -> SECOND, unit_multiplier 1 -> 60"},
		},
		{
			name: "algorithm_changed",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("{unit: minute, requests_per_unit: 10}", "{unit: minute, requests_per_unit: 10, algorithm: token_bucket}")},
			want: []string{"~ web.user: algorithm fixed_window -> token_bucket, burst none -> 10 (counters restart)"},
		},
		{
			name: "burst_changed",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("burst: 6", "burst: 9")},
			want: []string{"~ web.client_*.user: burst 6 -> 9"},
		},
		{
			// A token bucket's default burst is its limit.
			name: "burst_follows_limit",
			from: []string{"web.yaml", edit(", burst: 6", "")},
			to:   []string{"web.yaml", edit("requests_per_unit: 3, algorithm: token_bucket, burst: 6", "requests_per_unit: 4, algorithm: token_bucket")},
			want: []string{"~ web.client_*.user: requests_per_unit 3 -> 4, burst 3 -> 4"},
		},
		{
			name: "shadow_mode_and_quota_mode",
			from: []string{"web.yaml", diffBase},
			to: []string{"web.yaml", edit("  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
				"  - key: user\n    shadow_mode: true\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")},
			want: []string{"~ web.user: shadow_mode false -> true, quota_mode false -> true"},
		},
		{
			name: "unlimited",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("{unit: minute, requests_per_unit: 10}", "{unlimited: true}")},
			want: []string{"~ web.user: unit MINUTE -> UNKNOWN, requests_per_unit 10 -> 0, unlimited false -> true"},
		},
		{
			name: "name_and_replaces",
			from: []string{"web.yaml", diffBase},
			to: []string{"web.yaml", edit("{unit: second, requests_per_unit: 1}",
				"{unit: second, requests_per_unit: 1, name: one, replaces: [{name: login}]}")},
			want: []string{`~ web.path_/login.user: name "" -> "one", replaces [] -> [login]`},
		},
		{
			name: "detailed_metric",
			from: []string{"web.yaml", diffBase},
			to: []string{"web.yaml", edit("  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
				"  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")},
			want: []string{"~ web.user: detailed_metric false -> true"},
		},
		{
			name: "metadata",
			from: []string{"web.yaml", diffBase},
			to: []string{"web.yaml", edit("  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
				"  - key: user\n    metadata: {team: b, tier: 2}\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")},
			want: []string{`~ web.user: metadata none -> {"team":"b","tier":2}`},
		},
		{
			// value_to_metric on a level without a rule changes the
			// statistics of the rules below it.
			name: "value_to_metric_on_a_level",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("  - key: client\n    value: \"*\"\n", "  - key: client\n    value: \"*\"\n    value_to_metric: true\n")},
			want: []string{"~ web.client_*: value_to_metric false -> true"},
		},
		{
			// share_threshold makes every client share the rules' counters
			// below: their cache keys change.
			name: "share_threshold_on_a_level",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", edit("  - key: client\n    value: \"*\"\n", "  - key: client\n    value: \"*\"\n    share_threshold: true\n")},
			want: []string{"~ web.client_*: share_threshold false -> true (counters restart)"},
		},
		{
			name: "rule_added_on_a_level_whose_flag_changed",
			from: []string{"web.yaml", diffBase},
			to: []string{"web.yaml", edit("  - key: client\n    value: \"*\"\n",
				"  - key: client\n    value: \"*\"\n    value_to_metric: true\n    rate_limit: {unit: second, requests_per_unit: 100}\n")},
			want: []string{"+ web.client_*: unit=SECOND requests_per_unit=100, shadow_mode: false, quota_mode: false, value_to_metric: true; level value_to_metric false -> true"},
		},
		{
			name: "several_changes_in_dump_order",
			from: []string{"web.yaml", diffBase},
			to: []string{"web.yaml", strings.NewReplacer(
				"requests_per_unit: 10}", "requests_per_unit: 11}",
				"requests_per_unit: 1}", "requests_per_unit: 2}",
				"name: login", "name: signin",
			).Replace(diffBase)},
			want: []string{
				`~ web.path_/login: name "login" -> "signin"`,
				"~ web.path_/login.user: requests_per_unit 1 -> 2",
				"~ web.user: requests_per_unit 10 -> 11",
			},
		},
		{
			// An empty domain matters: per-request overrides apply only in
			// a configured domain.
			name: "empty_domain_added",
			from: []string{"web.yaml", diffBase},
			to:   []string{"web.yaml", diffBase, "api.yaml", "domain: api\n"},
			want: []string{"+ domain api"},
		},
		{
			name: "domain_removed_with_rules",
			from: []string{"web.yaml", diffBase, "api.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
			to:   []string{"web.yaml", diffBase},
			want: []string{
				"- domain api",
				"- api.k: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false",
			},
		},
		{
			name: "from_nothing",
			to:   []string{"api.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
			want: []string{
				"+ domain api",
				"+ api.k: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			from, to := parseFiles(t, tt.from...), parseFiles(t, tt.to...)
			var got []string
			for _, c := range Diff(from, to) {
				got = append(got, c.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Diff =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}

			// The other way round, every change is reported the other way.
			back := Diff(to, from)
			if len(back) != len(tt.want) {
				t.Fatalf("Diff(to, from) has %d changes, want %d", len(back), len(tt.want))
			}
			for i, c := range Diff(from, to) {
				b := back[i]
				want := map[ChangeKind]ChangeKind{Added: Removed, Removed: Added, Changed: Changed}[c.Kind]
				if b.Kind != want || b.Key() != c.Key() || b.Old != c.New || b.New != c.Old || b.Restarts != c.Restarts {
					t.Errorf("Diff(to, from)[%d] = %s, want the reverse of %s", i, b, c)
				}
			}
		})
	}
}

// TestDiffNil compares with nil configs, which are empty ones.
func TestDiffNil(t *testing.T) {
	t.Parallel()
	if got := Diff(nil, nil); got != nil {
		t.Errorf("Diff(nil, nil) = %v, want nil", got)
	}
	cfg := parseFiles(t, "web.yaml", diffBase)
	if got := Diff(cfg, nil); len(got) != 5 || got[0].Kind != Removed || got[0].Key() != "web" {
		t.Errorf("Diff(cfg, nil) = %v, want the domain and its 4 rules removed", got)
	}
}

// TestDiffSameIsNil compares every fixture with itself parsed again: no
// change, whatever its features.
func TestDiffSameIsNil(t *testing.T) {
	t.Parallel()
	names, err := filepath.Glob(filepath.Join("testdata", "match", "*.yaml"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(filepath.Base(n), ".yaml")
		a, b := loadMatch(t, name), loadMatch(t, name)
		if got := Diff(a, b); got != nil {
			t.Errorf("Diff(%s, %s) = %v, want nil", name, name, got)
		}
	}
}

func TestDiffQuota(t *testing.T) {
	t.Parallel()
	base := "domain: web\nquota_buckets:\n  - bucket: {tenant: \"*\"}\n    rate_limit: {unit: second, requests_per_unit: 100}\n  - bucket: {tenant: blocked}\n    policy: deny_all\n"
	tests := []struct {
		name string
		give string
		want []string
	}{
		{"same_moved_lines", "# a comment\n" + base, nil},
		{
			"limit_changed",
			strings.Replace(base, "requests_per_unit: 100", "requests_per_unit: 50", 1),
			[]string{
				"- web quota_buckets[1] {tenant=*}: unit=SECOND requests_per_unit=100, burst: 100, policy: fair_share",
				"+ web quota_buckets[1] {tenant=*}: unit=SECOND requests_per_unit=50, burst: 50, policy: fair_share",
			},
		},
		{
			"rule_added",
			base + "  - policy: allow_all\n",
			[]string{"+ web quota_buckets[3] default: policy: allow_all"},
		},
		{
			// The first match wins: the order is a change of behaviour.
			"order_changed",
			"domain: web\nquota_buckets:\n  - bucket: {tenant: blocked}\n    policy: deny_all\n  - bucket: {tenant: \"*\"}\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
			[]string{"~ domain web: quota_buckets order {tenant=*}: unit=SECOND requests_per_unit=100, burst: 100, policy: fair_share; {tenant=blocked}: policy: deny_all -> " +
				"order {tenant=blocked}: policy: deny_all; {tenant=*}: unit=SECOND requests_per_unit=100, burst: 100, policy: fair_share"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range Diff(parseFiles(t, "web.yaml", base), parseFiles(t, "web.yaml", tt.give)) {
				got = append(got, c.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Diff =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
