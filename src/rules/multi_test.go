package rules

import (
	"strings"
	"testing"
)

func TestMatchRateLimits(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "multi")
	m := cfg.Match("multi", entries("user=alice"))
	if m.Limit == nil {
		t.Fatal("Match(user=alice) = no match")
	}
	l := m.Limit
	if len(l.Limits) != 3 || l.Limits[0] != l {
		t.Fatalf("Match(user=alice).Limit.Limits = %v, want 3 limits, the first the Match's", l.Limits)
	}
	tests := []struct {
		unit      Unit
		rpu       uint32
		alg       Algorithm
		statLevel string
	}{
		{Second, 2, FixedWindow, "second"},
		{Minute, 5, FixedWindow, "sustained"},
		{Hour, 100, TokenBucket, "hour_token_bucket"},
	}
	for i, tt := range tests {
		got := l.Limits[i]
		if got.Unit != tt.unit || got.RequestsPerUnit != tt.rpu || got.Algorithm != tt.alg || got.StatLevel != tt.statLevel || got.Index != i {
			t.Errorf("Limits[%d] = %s %d %s %q #%d, want %s %d %s %q #%d", i,
				got.Unit, got.RequestsPerUnit, got.Algorithm, got.StatLevel, got.Index, tt.unit, tt.rpu, tt.alg, tt.statLevel, i)
		}
		if got.FullKey != "multi.user" || got.Domain != "multi" || len(got.Levels) != 1 || got.Levels[0] != "user" {
			t.Errorf("Limits[%d] key = %q %q %v, want the descriptor's", i, got.FullKey, got.Domain, got.Levels)
		}
		if len(got.Limits) != 3 {
			t.Errorf("Limits[%d].Limits has %d limits, want the list's 3", i, len(got.Limits))
		}
	}
	if m.StatKey != "multi.user" {
		t.Errorf("StatKey = %q, want multi.user", m.StatKey)
	}
	if got := len(cfg.Limits()); got != 10 {
		t.Errorf("len(Limits()) = %d, want 10: every limit of every list", got)
	}
}

func TestMatchValueRegex(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "multi")
	checkMatches(t, cfg, "multi", []matchCase{
		// Exact wins over everything.
		{give: entries("path=/api/exact"), fullKey: "multi.path_/api/exact", rpu: 1},
		// A wildcard wins over a value_regex that matches too.
		{give: entries("path=/api/wild/v1/x"), fullKey: "multi.path_/api/wild*", rpu: 2},
		// Regexes in file order: the first that matches.
		{give: entries("path=/api/v2/users"), fullKey: "multi.path_~/api/v[0-9]+/.*", rpu: 3},
		{give: entries("path=/api/other"), fullKey: "multi.path_~/api/.*", rpu: 4},
		// The whole value must match: no regex matches "/x/api/".
		{give: entries("path=/x/api/other"), fullKey: "multi.path", rpu: 5},
		{give: entries("path=/api"), fullKey: "multi.path", rpu: 5},
		// share_threshold: the pattern stands in for the value.
		{give: entries("host=www.example.com"), fullKey: "multi.host_~[a-z]+\\.example\\.com", rpu: 6,
			keyEnts: entries("host=~[a-z]+\\.example\\.com")},
		{give: entries("host=WWW.example.com")},
		// A regex level in the middle of a chain; "bot|crawler" is
		// anchored as a whole, so "robot" does not match.
		{give: entries("agent=crawler", "user=bob"), fullKey: "multi.agent_~bot|crawler.user", rpu: 7},
		{give: entries("agent=robot", "user=bob")},
		// A value or key spelling a regex node's composite key does not
		// pick its rule.
		{give: entries("path=~/api/.*"), fullKey: "multi.path", rpu: 5},
		{give: entries("host_~[a-z]+\\.example\\.com=x")},
	})
}

func TestMatchValueRegexDoesNotAllocate(t *testing.T) {
	cfg := loadMatch(t, "multi")
	for _, give := range [][]Entry{
		entries("path=/api/v2/users"),
		entries("path=/api/other"),
		entries("path=/x/api/other"),
		entries("agent=crawler", "user=bob"),
		entries("user=alice"),
	} {
		allocs := testing.AllocsPerRun(100, func() { cfg.Match("multi", give) })
		if allocs != 0 {
			t.Errorf("Match(multi, %v) allocates %v times, want 0", give, allocs)
		}
	}
}

func TestDumpRateLimits(t *testing.T) {
	t.Parallel()
	cfg := parseFiles(t, "a.yaml", `domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5, unit_multiplier: 5, name: sustained}
  - key: path
    value_regex: /api/.*
    rate_limit: {unit: second, requests_per_unit: 3}
`)
	want := `d.path_~/api/.*: unit=SECOND requests_per_unit=3, shadow_mode: false, quota_mode: false
d.user: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, rate_limits: 1/2 second
d.user: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, rate_limits: 2/2 sustained, unit_multiplier: 5, name: sustained
`
	if got := cfg.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
}

func TestParseRateLimitsAndRegexErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		line int
		msg  string
	}{
		{"one_and_list", `
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    rate_limits:
      - {unit: minute, requests_per_unit: 5}`, 5, `descriptor "d.a": give rate_limit or rate_limits, not both`},
		{"list_not_a_list", `
  - key: a
    rate_limits: {unit: minute, requests_per_unit: 5}`, 4, `descriptor "d.a": rate_limits: want a list of rate_limit maps, got a map`},
		{"empty_list", `
  - key: a
    rate_limits: []`, 4, `descriptor "d.a": rate_limits: empty list (leave rate_limits out to set no limit)`},
		{"too_many_limits", `
  - key: a
    rate_limits: [{unit: second, requests_per_unit: 1}, {unit: minute, requests_per_unit: 1},
      {unit: hour, requests_per_unit: 1}, {unit: day, requests_per_unit: 1}, {unit: week, requests_per_unit: 1},
      {unit: month, requests_per_unit: 1}, {unit: year, requests_per_unit: 1}, {unit: second, requests_per_unit: 1, unit_multiplier: 2},
      {unit: second, requests_per_unit: 1, unit_multiplier: 3}]`, 4, `descriptor "d.a": rate_limits: 9 limits, the most a descriptor may have is 8`},
		{"bad_item", `
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: fortnight, requests_per_unit: 1}`, 6, `descriptor "d.a": rate_limits[2]: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		{"null_item", `
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      -`, 6, `descriptor "d.a": rate_limits[2]: want a map with unit and requests_per_unit, got nothing`},
		{"same_window", `
  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 5, name: other}`, 6, `descriptor "d.a": rate_limits[2]: same algorithm and window as rate_limits[1] (fixed_window, minute); they would count in one key, keep the stricter`},
		{"same_name", `
  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 10, name: x}
      - {unit: hour, requests_per_unit: 50, name: x}`, 6, `descriptor "d.a": rate_limits[2]: its statistics would be named "x" as those of rate_limits[1]; give the limits different names`},
		{"stat_level_is_a_child", `
  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: minute
        rate_limit: {unit: second, requests_per_unit: 1}`, 4, `descriptor "d.a": rate_limits: the statistics of rate_limits[1] ("minute") would share a name with the descriptor at x.yaml:7; give the limit a name`},
		{"bad_regex", `
  - key: a
    value_regex: "[a-"
    rate_limit: {unit: second, requests_per_unit: 1}`, 4, `descriptor "d.a_~[a-": value_regex: invalid regular expression "[a-": missing closing ]: "[a-"`},
		{"empty_regex", `
  - key: a
    value_regex: ""
    rate_limit: {unit: second, requests_per_unit: 1}`, 4, `descriptor "d.a_~": value_regex: empty pattern (leave value_regex out to match any value by key)`},
		{"long_regex", `
  - key: a
    value_regex: "` + strings.Repeat("a", MaxRegexLen+1) + `"
    rate_limit: {unit: second, requests_per_unit: 1}`, 4, `descriptor "d.a_~` + strings.Repeat("a", MaxRegexLen+1) + `": value_regex: pattern is 1025 bytes long, the limit is 1024`},
		{"value_and_regex", `
  - key: a
    value: b
    value_regex: "b.*"
    rate_limit: {unit: second, requests_per_unit: 1}`, 5, `descriptor "d.a_b": value_regex: give value or value_regex, not both`},
		{"regex_not_a_string", `
  - key: a
    value_regex: [b]
    rate_limit: {unit: second, requests_per_unit: 1}`, 4, `descriptor "d.a_~": value_regex: want a string, got a list`},
		{"duplicate_regex", `
  - key: a
    value_regex: "b.*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value_regex: "b.*"
    rate_limit: {unit: second, requests_per_unit: 2}`, 6, `descriptor "d.a_~b.*": duplicate composite key (first defined at x.yaml:3)`},
		{"shadow_in_rate_limit", `
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, shadow_mode: true}`, 4, `descriptor "d.a": rate_limit: unknown key "shadow_mode"`},
		{"shadow_not_bool", `
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 1, shadow_mode: maybe}`, 5, `descriptor "d.a": rate_limits[1]: shadow_mode: want true or false, got "maybe"`},
		{"shadow_unlimited", `
  - key: a
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unlimited: true, shadow_mode: true}`, 6, `descriptor "d.a": rate_limits[2]: shadow_mode has no effect with unlimited: true`},
		{"shadow_replaces", `
  - key: a
    rate_limits:
      - unit: second
        requests_per_unit: 1
        shadow_mode: true
        replaces: [{name: b}]`, 7, `descriptor "d.a": rate_limits[1]: a shadow limit cannot replace other limits: that would change what is enforced`},
		{"two_shadows_same_window", `
  - key: a
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 5, shadow_mode: true}
      - {unit: minute, requests_per_unit: 3, shadow_mode: true, name: other}`, 7, `descriptor "d.a": rate_limits[3]: same algorithm and window as rate_limits[2] (fixed_window, minute); they would count in one key, keep the stricter`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := File{Name: "x.yaml", Data: []byte("domain: d\ndescriptors:" + tt.yaml + "\n")}
			c, err := Parse([]File{f}, Options{})
			if c != nil {
				t.Fatalf("Parse(%s) returned a config, want an error", tt.name)
			}
			got := problems(t, err)
			want := &Error{File: "x.yaml", Line: tt.line, Msg: tt.msg}
			if len(got) == 0 || *got[0] != *want {
				t.Errorf("Parse(%s) errors = %q, want first %q", tt.name, got, want)
			}
		})
	}
}

func TestDiffRateLimits(t *testing.T) {
	t.Parallel()
	one := `domain: d
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
`
	two := `domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5}
`
	twoMore := strings.Replace(two, "requests_per_unit: 5", "requests_per_unit: 6", 1)
	three := two + "      - {unit: hour, requests_per_unit: 50}\n"
	// The step from shadow to enforced keeps the limit's key: its counts
	// go on.
	twoShadow := strings.Replace(two, "requests_per_unit: 5", "requests_per_unit: 5, shadow_mode: true", 1)
	twin := strings.Replace(two, "{unit: minute, requests_per_unit: 5}", "{unit: second, requests_per_unit: 1, shadow_mode: true}", 1)
	twinEnforced := "domain: d\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n"
	tests := []struct {
		name, from, to string
		want           []string
	}{
		{"single_to_list", one, two, []string{"~ d.user: rate_limits 0 -> 2, rate_limits[2] none -> minute (counters restart)"}},
		{"list_to_single", two, one, []string{"~ d.user: rate_limits 2 -> 0, rate_limits[2] minute -> none (counters restart)"}},
		{"limit_changed", two, twoMore, []string{"~ d.user: rate_limits[2].requests_per_unit 5 -> 6"}},
		{"limit_added", two, three, []string{"~ d.user: rate_limits 2 -> 3, rate_limits[3] none -> hour (counters restart)"}},
		{"limit_removed", three, two, []string{"~ d.user: rate_limits 3 -> 2, rate_limits[3] hour -> none"}},
		// A shadow limit counts in a key of its own.
		{"shadowed", two, twoShadow, []string{"~ d.user: rate_limits[2].shadow false -> true (counters restart)"}},
		{"enforced", twoShadow, two, []string{"~ d.user: rate_limits[2].shadow true -> false (counters restart)"}},
		// Enforced in place of the limit of its window, it takes that
		// limit's key, which goes on counting.
		{"twin_enforced", twin, twinEnforced, []string{"~ d.user: rate_limits 2 -> 1, rate_limits[1].requests_per_unit 2 -> 1, rate_limits[2] second_shadow -> none"}},
		{"list_added", "domain: d\n", two, []string{
			"+ d.user: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, rate_limits: 1/2 second; " +
				"d.user: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, rate_limits: 2/2 minute",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			from, to := parseFiles(t, "a.yaml", tt.from), parseFiles(t, "a.yaml", tt.to)
			var got []string
			for _, c := range Diff(from, to) {
				got = append(got, c.String())
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("Diff =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
