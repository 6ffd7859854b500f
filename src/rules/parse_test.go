package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// readFile loads a fixture as a File named after its base name.
func readFile(t testing.TB, path string) File {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return File{Name: filepath.Base(path), Data: data}
}

// problems splits a Parse error into its *Error parts.
func problems(t *testing.T, err error) []*Error {
	t.Helper()
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var out []*Error
	for _, e := range errs {
		var re *Error
		if !errors.As(e, &re) {
			t.Fatalf("error %q is not a *rules.Error", e)
		}
		out = append(out, re)
	}
	return out
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line int
		msg  string
	}{
		{"empty_domain", 1, `empty domain`},
		{"missing_domain", 2, `empty domain`},
		{"empty_file", 1, `empty domain`},
		{"not_a_map", 1, `want a map with domain and descriptors, got a list`},
		{"bad_yaml", 2, `invalid YAML: did not find expected '-' indicator`},
		{"two_documents", 2, `more than one YAML document; put each domain in its own file`},
		{"duplicate_key", 8, `descriptor "test-domain.key1_value1": duplicate composite key (first defined at duplicate_key.yaml:3)`},
		{"duplicate_yaml_key", 4, `descriptor "test-domain.key1": duplicate key "key"`},
		{"misspelled_key", 4, `descriptor "test-domain.key1": unknown key "ratelimit" (did you mean "rate_limit"?)`},
		{"misspelled_key2", 6, `descriptor "test-domain.key1": rate_limit: unknown key "requestsperunit" (did you mean "requests_per_unit"?)`},
		{"empty_key", 3, `descriptor 1 of "test-domain": empty key`},
		{"non_string_key", 4, `descriptor "test-domain.key1": key is not a string: "0.25"`},
		{"non_map_list", 3, `descriptor 1 of "test-domain": want a map with key, value, rate_limit and descriptors, got "a"`},
		{"descriptors_not_list", 3, `descriptors of "test-domain": want a list of descriptors, got a map`},
		{"bad_limit_unit", 5, `descriptor "test-domain.key1": rate_limit: invalid unit "foo" (want second, minute, hour, day, week, month or year)`},
		{"unknown_unit_name", 5, `descriptor "test-domain.key1": rate_limit: invalid unit "unknown" (want second, minute, hour, day, week, month or year)`},
		{"missing_unit", 5, `descriptor "test-domain.key1": rate_limit: missing unit (second, minute, hour, day, week, month or year)`},
		{"unlimited_with_unit", 6, `descriptor "test-domain.key1": rate_limit: unit "second" given with unlimited: true; an unlimited rule has no unit`},
		{"unlimited_with_algorithm", 6, `descriptor "test-domain.key1": rate_limit: algorithm has no effect with unlimited: true`},
		{"replaces_empty", 9, `descriptor "test-domain.key1": rate_limit: replaces: empty name`},
		{"replaces_self", 9, `descriptor "test-domain.key1": rate_limit: replaces: a rule cannot replace its own name "first"`},
		{"bad_requests_per_unit", 6, `descriptor "test-domain.key1": rate_limit: requests_per_unit: want a whole number from 0 to 4294967295, got "-5"`},
		{"bad_bool", 4, `descriptor "test-domain.key1": shadow_mode: want true or false, got "maybe"`},
		{"unknown_algorithm", 7, `descriptor "test-domain.key1": rate_limit: unknown algorithm "leaky_bucket" (want fixed_window, sliding_window, sliding_log or token_bucket)`},
		{"burst_without_token_bucket", 8, `descriptor "test-domain.key1": rate_limit: burst is only for algorithm token_bucket`},
		{"zero_burst", 8, `descriptor "test-domain.key1": rate_limit: burst must be at least 1 (leave it out to use requests_per_unit)`},
		{"zero_unit_multiplier", 7, `descriptor "test-domain.key1": rate_limit: unit_multiplier must be at least 1`},
		{"sliding_log_too_large", 6, `descriptor "test-domain.key1": rate_limit: sliding_log keeps one timestamp per request; requests_per_unit 20000 is above its maximum of 10000 (use sliding_window)`},
		{"share_threshold_without_wildcard", 5, `descriptor "test-domain.files_report.pdf": share_threshold needs a wildcard value (containing '*') or a value_regex, so that the values it matches can share one counter`},
		{"metadata_not_map", 7, `descriptor "test-domain.key1": metadata: want a map, got "service_1"`},
		{"descriptor_key_at_top", 2, `unknown key "key" (descriptor keys belong in a list under descriptors)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := readFile(t, filepath.Join("testdata", tt.name+".yaml"))
			c, err := Parse([]File{f}, Options{})
			if c != nil {
				t.Errorf("Parse(%s) returned a config along with errors", f.Name)
			}
			got := problems(t, err)
			if len(got) == 0 {
				t.Fatalf("Parse(%s) = nil error, want %q", f.Name, tt.msg)
			}
			want := &Error{File: f.Name, Line: tt.line, Msg: tt.msg}
			if *got[0] != *want {
				t.Errorf("Parse(%s) first error = %q, want %q", f.Name, got[0], want)
			}
		})
	}
}

// TestParseReportsEveryProblem checks that one bad rule does not hide the
// next ones, in the same file or in other files.
func TestParseReportsEveryProblem(t *testing.T) {
	t.Parallel()
	files := []File{
		readFile(t, "testdata/many_problems.yaml"),
		readFile(t, "testdata/bad_limit_unit.yaml"),
	}
	_, err := Parse(files, Options{})
	var got []string
	for _, p := range problems(t, err) {
		got = append(got, p.Error())
	}
	want := []string{
		`rules: many_problems.yaml:5: descriptor "test-domain.key1": rate_limit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`,
		`rules: many_problems.yaml:11: descriptor "test-domain.key2": rate_limit: unit_multiplier must be at least 1`,
		`rules: many_problems.yaml:14: descriptor "test-domain.key2.nested": unknown key "shadowmode" (did you mean "shadow_mode"?)`,
		`rules: many_problems.yaml:18: descriptor "test-domain.key2": duplicate composite key (first defined at many_problems.yaml:7)`,
		`rules: many_problems.yaml:19: descriptor 4 of "test-domain": empty key`,
		`rules: bad_limit_unit.yaml:1: duplicate domain "test-domain" (also in many_problems.yaml; set MERGE_DOMAIN_CONFIG=true to merge)`,
		`rules: bad_limit_unit.yaml:5: descriptor "test-domain.key1": rate_limit: invalid unit "foo" (want second, minute, hour, day, week, month or year)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse errors =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseDuplicateDomain(t *testing.T) {
	t.Parallel()
	a := File{Name: "a.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	b := File{Name: "b.yaml", Data: []byte("# second file\ndomain: api\ndescriptors:\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n")}
	c := File{Name: "c.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")}

	_, err := Parse([]File{a, b}, Options{})
	want := `rules: b.yaml:2: duplicate domain "api" (also in a.yaml; set MERGE_DOMAIN_CONFIG=true to merge)`
	if err == nil || err.Error() != want {
		t.Errorf("Parse(a, b) = %v, want %q", err, want)
	}

	cfg, err := Parse([]File{a, b}, Options{MergeDomains: true})
	if err != nil {
		t.Fatalf("Parse(a, b, merge) = %v", err)
	}
	for _, k := range []string{"k1", "k2"} {
		if m := cfg.Match("api", []Entry{{k, "x"}}); m.Limit == nil {
			t.Errorf("merged Match(api, %s) = nil, want a limit", k)
		}
	}

	_, err = Parse([]File{a, c}, Options{MergeDomains: true})
	want = `rules: c.yaml:3: descriptor "api.k1": duplicate composite key (first defined at a.yaml:3)`
	if err == nil || err.Error() != want {
		t.Errorf("Parse(a, c, merge) = %v, want %q", err, want)
	}
}

func TestParseSupports(t *testing.T) {
	t.Parallel()
	f := readFile(t, "testdata/match/modes.yaml")
	opts := Options{
		StoreName: "memcached",
		Supports:  func(a Algorithm) bool { return a == FixedWindow },
	}
	_, err := Parse([]File{f}, opts)
	var got []string
	for _, p := range problems(t, err) {
		got = append(got, p.Error())
	}
	want := []string{
		`rules: modes.yaml:22: descriptor "modes.api_key": rate_limit: algorithm token_bucket is not supported by the memcached store (it cannot run it atomically)`,
		`rules: modes.yaml:28: descriptor "modes.user": rate_limit: algorithm sliding_window is not supported by the memcached store (it cannot run it atomically)`,
		`rules: modes.yaml:34: descriptor "modes.login": rate_limit: algorithm sliding_log is not supported by the memcached store (it cannot run it atomically)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse errors =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	if _, err := Parse([]File{f}, Options{Supports: func(Algorithm) bool { return true }}); err != nil {
		t.Errorf("Parse with every algorithm supported = %v", err)
	}
}

func TestParseFields(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]File{readFile(t, "testdata/match/modes.yaml")}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		want Limit
	}{
		{"backend", Limit{
			FullKey: "modes.backend_primary", Domain: "modes", Levels: []string{"backend_primary"}, Source: "modes.yaml:4", RequestsPerUnit: 1000, Unit: Minute,
			UnitMultiplier: 1, Name: "primary_quota", QuotaMode: true,
			Metadata: map[string]any{"service_with_quota": map[string]any{
				"name": "primary", "weight": int64(3), "ratio": 0.5, "tags": []any{"a", "b"}, "enabled": true,
			}},
		}},
		{"api_key", Limit{
			FullKey: "modes.api_key", Domain: "modes", Levels: []string{"api_key"}, Source: "modes.yaml:18", RequestsPerUnit: 20, Unit: Second,
			UnitMultiplier: 1, Algorithm: TokenBucket, Burst: 40,
		}},
		{"user", Limit{
			FullKey: "modes.user", Domain: "modes", Levels: []string{"user"}, Source: "modes.yaml:24", RequestsPerUnit: 100, Unit: Minute,
			UnitMultiplier: 5, Algorithm: SlidingWindow,
		}},
		{"login", Limit{
			FullKey: "modes.login", Domain: "modes", Levels: []string{"login"}, Source: "modes.yaml:30", RequestsPerUnit: 10, Unit: Hour,
			UnitMultiplier: 1, Algorithm: SlidingLog,
		}},
	}
	for _, tt := range tests {
		value := "x"
		if tt.key == "backend" {
			value = "primary"
		}
		m := cfg.Match("modes", []Entry{{tt.key, value}})
		if m.Limit == nil {
			t.Errorf("Match(%s) = nil", tt.key)
			continue
		}
		if !reflect.DeepEqual(*m.Limit, tt.want) {
			t.Errorf("Match(%s).Limit = %+v, want %+v", tt.key, *m.Limit, tt.want)
		}
	}
	if w := cfg.Match("modes", []Entry{{"user", "x"}}).Limit.Window(); w.Minutes() != 5 {
		t.Errorf("Window() = %v, want 5m", w)
	}
}

func TestParseYAMLForms(t *testing.T) {
	t.Parallel()
	// Anchors, merge keys, YAML 1.1 booleans, numbers as values and flow
	// style all read as envoyproxy/ratelimit's yaml.v2 reads them.
	data := `
domain: forms
descriptors:
  - key: port
    value: 8080
    shadow_mode: yes
    rate_limit: &per_second
      unit: Second
      requests_per_unit: 5
  - key: other
    rate_limit:
      <<: *per_second
      requests_per_unit: 7
  - {key: flow, rate_limit: {unit: day, requests_per_unit: 0x10}}
`
	cfg, err := Parse([]File{{Name: "forms.yaml", Data: []byte(data)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		entry  Entry
		rpu    uint32
		unit   Unit
		shadow bool
	}{
		{Entry{"port", "8080"}, 5, Second, true},
		{Entry{"other", "x"}, 7, Second, false},
		{Entry{"flow", "x"}, 16, Day, false},
	}
	for _, tt := range tests {
		m := cfg.Match("forms", []Entry{tt.entry})
		if m.Limit == nil {
			t.Errorf("Match(%v) = nil", tt.entry)
			continue
		}
		if m.Limit.RequestsPerUnit != tt.rpu || m.Limit.Unit != tt.unit || m.Limit.ShadowMode != tt.shadow {
			t.Errorf("Match(%v) = %d/%v shadow %t, want %d/%v shadow %t", tt.entry,
				m.Limit.RequestsPerUnit, m.Limit.Unit, m.Limit.ShadowMode, tt.rpu, tt.unit, tt.shadow)
		}
	}
}

func TestParseAliasBomb(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: a\n    descriptors: &l0\n      - key: leaf\n")
	for i := 1; i <= 8; i++ {
		b.WriteString("  - key: k" + string(rune('0'+i)) + "\n    descriptors: &l" + string(rune('0'+i)) + "\n")
		for j := 0; j < 10; j++ {
			b.WriteString("      - key: c" + string(rune('0'+j)) + "\n        descriptors: *l" + string(rune('0'+i-1)) + "\n")
		}
	}
	_, err := Parse([]File{{Name: "bomb.yaml", Data: []byte(b.String())}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "alias expansions") {
		t.Errorf("Parse(alias bomb) = %v, want an alias expansion error", err)
	}
}

func TestParseEmpty(t *testing.T) {
	t.Parallel()
	cfg, err := Parse(nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Empty() || len(cfg.Domains()) != 0 || cfg.Dump() != "" {
		t.Errorf("Parse(nil) = %v domains, want an empty config", cfg.Domains())
	}
	cfg, err = Parse([]File{{Name: "d.yaml", Data: []byte("domain: only\n")}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Empty() || !reflect.DeepEqual(cfg.Domains(), []string{"only"}) {
		t.Errorf("Domains() = %v, want [only]", cfg.Domains())
	}
}

// TestRulesBounds: rules deeper than a request can reach, more descriptors
// than MaxDescriptors (aliases expanded: the alias budget counts uses, and
// one list used many times built 1,000,000 rules), and a file larger than
// MaxFileBytes are refused with the file and the reason.
func TestRulesBounds(t *testing.T) {
	chain := func(depth int) string {
		var b strings.Builder
		b.WriteString("domain: deep\ndescriptors:\n")
		for i := range depth {
			indent := strings.Repeat("  ", 2*i)
			fmt.Fprintf(&b, "%s  - key: k%d\n", indent, i)
			if i == depth-1 {
				fmt.Fprintf(&b, "%s    rate_limit: {unit: hour, requests_per_unit: 1}\n", indent)
			} else {
				fmt.Fprintf(&b, "%s    descriptors:\n", indent)
			}
		}
		return b.String()
	}
	if _, err := Parse([]File{{Name: "ok.yaml", Data: []byte(chain(MaxDepth))}}, Options{}); err != nil {
		t.Errorf("a chain %d deep: %v", MaxDepth, err)
	}
	_, err := Parse([]File{{Name: "deep.yaml", Data: []byte(chain(MaxDepth + 1))}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "deep.yaml:") || !strings.Contains(err.Error(), "nested 65 deep, more than 64") {
		t.Errorf("a chain %d deep: %v, want an error naming the file and the depth", MaxDepth+1, err)
	}

	// A list of 1,000 descriptors used 200 times: 200,000, aliases expanded.
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: base\n    descriptors: &list\n")
	for i := range 1000 {
		fmt.Fprintf(&b, "      - {key: k%d, rate_limit: {unit: hour, requests_per_unit: 1}}\n", i)
	}
	for i := range 200 {
		fmt.Fprintf(&b, "  - key: copy%d\n    descriptors: *list\n", i)
	}
	bomb := b.String()
	_, err = Parse([]File{{Name: "bomb.yaml", Data: []byte(bomb)}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "bomb.yaml:") || !strings.Contains(err.Error(), "more than 100000 descriptors") {
		t.Errorf("%d bytes expanding to 200,000 descriptors: %v, want refused past %d", len(bomb), err, MaxDescriptors)
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 1 {
		t.Errorf("the refusal has %d problems, want 1 (said once, then the walk stops):\n%.2000s", n, err)
	}

	_, err = Parse([]File{{Name: "big.yaml", Data: make([]byte, MaxFileBytes+1)}}, Options{})
	if err == nil || err.Error() != "rules: big.yaml: larger than the 4194304 bytes a rule file may hold" {
		t.Errorf("a file of %d bytes: %v", MaxFileBytes+1, err)
	}

	// Data from xDS: the same bounds.
	var deep []Descriptor
	for i := range MaxDepth + 1 {
		deep = []Descriptor{{Key: fmt.Sprintf("k%d", MaxDepth-i), Descriptors: deep}}
	}
	_, err = Build([]Source{{Name: `config "x" (domain x)`, Domain: "x", Descriptors: deep}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "nested 65 deep") {
		t.Errorf("a Source %d deep: %v", MaxDepth+1, err)
	}
}

// TestUnits pins each unit's name and length (the anchor's: a month is 30
// days, a year 365), and that a value outside the enum, as a cast from
// Envoy's proto may give, is UNKNOWN and 0 s long.
func TestUnits(t *testing.T) {
	want := map[Unit]struct {
		name string
		secs int64
	}{
		Second: {"SECOND", 1}, Minute: {"MINUTE", 60}, Hour: {"HOUR", 3600}, Day: {"DAY", 86400},
		Week: {"WEEK", 604800}, Month: {"MONTH", 2592000}, Year: {"YEAR", 31536000},
		Unknown: {"UNKNOWN", 0}, -1: {"UNKNOWN", 0}, 8: {"UNKNOWN", 0},
	}
	for u, w := range want {
		if u.String() != w.name || u.Seconds() != w.secs {
			t.Errorf("Unit(%d) = %s, %d s; want %s, %d s", int32(u), u, u.Seconds(), w.name, w.secs)
		}
		if p, ok := ParseUnit(strings.ToLower(w.name)); ok != (w.secs > 0) || ok && p != u {
			t.Errorf("ParseUnit(%q) = %v, %v", strings.ToLower(w.name), p, ok)
		}
	}
}

// TestAlgorithmRegistry pins the traits every package reads from the
// algorithms' registry instead of naming algorithms, and that a value
// outside it has none.
func TestAlgorithmRegistry(t *testing.T) {
	type traits struct{ windowed, continuous, burst, perHit, overUntilReset bool }
	want := map[Algorithm]traits{
		FixedWindow:                {windowed: true, overUntilReset: true},
		SlidingWindow:              {continuous: true, overUntilReset: true},
		SlidingLog:                 {continuous: true, perHit: true, overUntilReset: true},
		TokenBucket:                {continuous: true, burst: true},
		Algorithm(len(Algorithms)): {},
		255:                        {},
	}
	for a, w := range want {
		got := traits{a.Windowed(), a.Continuous(), a.HasBurst(), a.PerHit(), a.OverUntilReset()}
		if got != w {
			t.Errorf("%s (%d): traits %+v, want %+v", a, a, got, w)
		}
		if p, ok := ParseAlgorithm(a.String()); ok != a.known() || ok && p != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), p, ok)
		}
	}
	for a := range len(algorithms) {
		if known := Algorithm(a).known(); known != slices.Contains(Algorithms, Algorithm(a)) {
			t.Errorf("Algorithm %d: in the registry %v, in Algorithms %v", a, known, !known)
		}
	}
	if got := algorithmNames(func(Algorithm) bool { return true }); got != "fixed_window, sliding_window, sliding_log or token_bucket" {
		t.Errorf("algorithmNames = %q", got)
	}
}
