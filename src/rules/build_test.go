package rules

import (
	"reflect"
	"strings"
	"testing"
)

// TestBuildMatchesParse builds from data the rules of a YAML file and
// checks that both give the same tree.
func TestBuildMatchesParse(t *testing.T) {
	t.Parallel()
	yaml := `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, name: per_user}
    descriptors:
      - key: path
        value: /login
        shadow_mode: true
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 2, replaces: [{name: per_user}]}
  - key: api_key
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}
  - key: file
    value: "*.pdf"
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 3, unit_multiplier: 6}
  - key: internal
    rate_limit: {unlimited: true}
`
	parsed, err := Parse([]File{{Name: "web.yaml", Data: []byte(yaml)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	built, err := Build([]Source{{Name: `config "web"`, Domain: "web", Descriptors: []Descriptor{
		{Key: "user", RateLimit: &RateLimit{Unit: "minute", RequestsPerUnit: 10, Name: "per_user"}, Descriptors: []Descriptor{
			{Key: "path", Value: "/login", ShadowMode: true, DetailedMetric: true,
				RateLimit: &RateLimit{Unit: "SECOND", RequestsPerUnit: 2, Replaces: []string{"per_user"}}},
		}},
		{Key: "api_key", QuotaMode: true, RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 5, Algorithm: "token_bucket", Burst: 20}},
		{Key: "file", Value: "*.pdf", ShareThreshold: true, ValueToMetric: true,
			RateLimit: &RateLimit{Unit: "hour", RequestsPerUnit: 3, UnitMultiplier: 6}},
		{Key: "internal", RateLimit: &RateLimit{Unlimited: true}},
	}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := built.Dump(), parsed.Dump(); got != want {
		t.Errorf("Build().Dump() =\n%s\nwant (Parse)\n%s", got, want)
	}
	for _, entries := range [][]Entry{
		{{"user", "alice"}},
		{{"user", "alice"}, {"path", "/login"}},
		{{"file", "report.pdf"}},
		{{"api_key", "k"}},
	} {
		p, b := parsed.Match("web", entries), built.Match("web", entries)
		if p.Limit == nil || b.Limit == nil {
			t.Fatalf("Match(%v) = %v (Build), %v (Parse), want both", entries, b.Limit, p.Limit)
		}
		// Everything but where the rule was written is the same.
		pl, bl := *p.Limit, *b.Limit
		if bl.Source == "" || !strings.HasPrefix(bl.Source, `config "web"`) {
			t.Errorf("Match(%v).Limit.Source = %q, want it to name the source", entries, bl.Source)
		}
		pl.Source, bl.Source = "", ""
		if !reflect.DeepEqual(pl, bl) {
			t.Errorf("Match(%v).Limit = %+v (Build), want %+v (Parse)", entries, bl, pl)
		}
		if p.StatKey != b.StatKey || !reflect.DeepEqual(p.KeyEntries, b.KeyEntries) {
			t.Errorf("Match(%v) = %q %v (Build), want %q %v (Parse)", entries, b.StatKey, b.KeyEntries, p.StatKey, p.KeyEntries)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	t.Parallel()
	limit := func(unit string, rpu uint32) *RateLimit { return &RateLimit{Unit: unit, RequestsPerUnit: rpu} }
	tests := []struct {
		name string
		give []Descriptor
		opts Options
		want []string
	}{
		{
			name: "bad_limit_unit",
			give: []Descriptor{{Key: "user", RateLimit: limit("9", 1)}},
			want: []string{`descriptor "web.user": rate_limit: invalid unit "9" (want second, minute, hour, day, week, month or year)`},
		},
		{
			name: "missing_unit",
			give: []Descriptor{{Key: "user", RateLimit: limit("", 1)}},
			want: []string{`descriptor "web.user": rate_limit: missing unit (second, minute, hour, day, week, month or year)`},
		},
		{
			name: "unlimited_with_unit",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "second", Unlimited: true}}},
			want: []string{`descriptor "web.user": rate_limit: unit "second" given with unlimited: true; an unlimited rule has no unit`},
		},
		{
			name: "unlimited_with_algorithm",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unlimited: true, Algorithm: "token_bucket", Burst: 3}}},
			want: []string{
				`descriptor "web.user": rate_limit: algorithm has no effect with unlimited: true`,
				`descriptor "web.user": rate_limit: burst has no effect with unlimited: true`,
			},
		},
		{
			name: "empty_key",
			give: []Descriptor{{Value: "v", RateLimit: limit("second", 1)}},
			want: []string{`descriptor 1 of "web": empty key`},
		},
		{
			name: "duplicate_key",
			give: []Descriptor{{Key: "user"}, {Key: "path"}, {Key: "user"}},
			want: []string{`descriptor "web.user": duplicate composite key (first defined at config "web" (domain web), descriptor 1 of "web")`},
		},
		{
			name: "nested_problem",
			give: []Descriptor{{Key: "user", Descriptors: []Descriptor{{Key: "path", Value: "/a", RateLimit: limit("week", 0)}, {Key: "path", Value: "/b", RateLimit: limit("fortnight", 1)}}}},
			want: []string{`descriptor "web.user.path_/b": rate_limit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		},
		{
			name: "share_threshold_without_wildcard",
			give: []Descriptor{{Key: "file", Value: "a.pdf", ShareThreshold: true}},
			want: []string{`descriptor "web.file_a.pdf": share_threshold needs a wildcard value (containing '*') or a value_regex, so that the values it matches can share one counter`},
		},
		{
			name: "unknown_algorithm",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 1, Algorithm: "leaky_bucket"}}},
			want: []string{`descriptor "web.user": rate_limit: unknown algorithm "leaky_bucket" (want fixed_window, sliding_window, sliding_log or token_bucket)`},
		},
		{
			name: "burst_without_token_bucket",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 1, Burst: 2}}},
			want: []string{`descriptor "web.user": rate_limit: burst is only for algorithm token_bucket`},
		},
		{
			name: "replaces_self",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 1, Name: "a", Replaces: []string{"b", "a", ""}}}},
			want: []string{
				`descriptor "web.user": rate_limit: replaces: a rule cannot replace its own name "a"`,
				`descriptor "web.user": rate_limit: replaces: empty name`,
			},
		},
		{
			name: "sliding_log_too_large",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: MaxSlidingLog + 1, Algorithm: "sliding_log"}}},
			want: []string{`descriptor "web.user": rate_limit: sliding_log keeps one timestamp per request; requests_per_unit 10001 is above its maximum of 10000 (use sliding_window)`},
		},
		{
			name: "window_too_long",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "year", RequestsPerUnit: 1, UnitMultiplier: 1 << 31}}},
			want: []string{`descriptor "web.user": rate_limit: unit_multiplier 2147483648 makes a window longer than 9223372036 seconds`},
		},
		{
			name: "unsupported_algorithm",
			give: []Descriptor{{Key: "user", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 1, Algorithm: "sliding_window"}}},
			opts: Options{StoreName: "memcached", Supports: func(a Algorithm) bool { return a == FixedWindow }},
			want: []string{`descriptor "web.user": rate_limit: algorithm sliding_window is not supported by the memcached store (it cannot run it atomically)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := Source{Name: `config "web" (domain web)`, Domain: "web", Descriptors: tt.give}
			c, err := Build([]Source{src}, tt.opts)
			if c != nil {
				t.Errorf("Build returned a config along with errors")
			}
			var got []string
			for _, p := range problems(t, err) {
				if p.File != src.Name || p.Line != 0 {
					t.Errorf("problem %q: File %q Line %d, want %q and 0", p.Msg, p.File, p.Line, src.Name)
				}
				got = append(got, p.Msg)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Build errors =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestBuildDomains(t *testing.T) {
	t.Parallel()
	a := Source{Name: "a", Domain: "api", Descriptors: []Descriptor{{Key: "k1", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 1}}}}
	b := Source{Name: "b", Domain: "api", Descriptors: []Descriptor{{Key: "k2", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: 2}}}}

	_, err := Build([]Source{a, b}, Options{})
	if want := `rules: b: duplicate domain "api" (also in a; set MERGE_DOMAIN_CONFIG=true to merge)`; err == nil || err.Error() != want {
		t.Errorf("Build(a, b) = %v, want %q", err, want)
	}
	cfg, err := Build([]Source{a, b}, Options{MergeDomains: true})
	if err != nil {
		t.Fatalf("Build(a, b, merge) = %v", err)
	}
	for _, k := range []string{"k1", "k2"} {
		if m := cfg.Match("api", []Entry{{k, "x"}}); m.Limit == nil {
			t.Errorf("merged Match(api, %s) = nil, want a limit", k)
		}
	}

	_, err = Build([]Source{{Name: "nameless"}}, Options{})
	if want := `rules: nameless: empty domain`; err == nil || err.Error() != want {
		t.Errorf("Build(no domain) = %v, want %q", err, want)
	}

	cfg, err = Build(nil, Options{})
	if err != nil || !cfg.Empty() {
		t.Errorf("Build(nil) = %v, %v, want an empty config", cfg.Domains(), err)
	}
	cfg, err = Build([]Source{{Name: "only", Domain: "only"}}, Options{})
	if err != nil || !reflect.DeepEqual(cfg.Domains(), []string{"only"}) {
		t.Errorf("Build(domain without descriptors) = %v, %v, want [only]", cfg.Domains(), err)
	}
}
