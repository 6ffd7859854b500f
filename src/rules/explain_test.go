package rules

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

const explainRules = `
domain: web
descriptors:
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: path
    value_regex: "^/v[0-9]+/users$"
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 7}
`

// TestExplain: each way a descriptor matches, step by step, and each
// reason it does not, naming what the rules have where it stopped.
func TestExplain(t *testing.T) {
	cfg, err := Parse([]File{{Name: "web.yaml", Data: []byte(explainRules)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		domain string
		give   []Entry
		steps  string // "by:rule@line" per step
		rule   string // the limit's FullKey, "" for none
		why    []string
	}{
		{"value", "web", entries("path=/login", "remote_address=10.0.0.1"), "value:path_/login@4 key:remote_address@7", "web.path_/login.remote_address", nil},
		{"wildcard", "web", entries("path=/api/orders"), "wildcard:path_/api/*@9", "web.path_/api/*", nil},
		{"value_regex", "web", entries("path=/v2/users"), "value_regex:path_~^/v[0-9]+/users$@12", "web.path_~^/v[0-9]+/users$", nil},
		{"key_default", "web", entries("user=alice"), "key:user@15", "web.user", nil},
		{"unknown_domain", "wbe", entries("user=alice"), "", "", []string{`domain "wbe" is not in the rules`, `"web"`}},
		{"unknown_key", "web", entries("usr=alice"), "", "", []string{`no rule has the key "usr"`, `"path", "tenant", "tier", "user"`}},
		{"value_not_matched", "web", entries("tier=silver"), "", "", []string{`the value "silver" of key "tier" matches no rule`, `"gold"`, "no rule for the key alone"}},
		{"value_not_matched_regex", "web", entries("path=/other"), "", "", []string{`"/api/*"`, `"/login"`, `"~^/v[0-9]+/users$"`}},
		{"no_limit_here", "web", entries("tenant=acme"), "key:tenant@20", "", []string{"has no rate_limit", `"user"`}},
		{"longer_than_rules", "web", entries("user=alice", "extra=1"), "key:user@15", "", []string{"the rules end at user", "entry 1 of 2"}},
		{"deeper_key_unknown", "web", entries("path=/login", "user=bob"), "value:path_/login@4", "", []string{"entry 2", `no rule has the key "user"`, `"remote_address"`}},
		{"no_entries", "web", nil, "", "", []string{"no entries"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := cfg.Explain(tt.domain, tt.give)
			var steps []string
			for _, s := range x.Steps {
				line := s.Source[strings.LastIndex(s.Source, ":")+1:]
				steps = append(steps, s.By+":"+s.Rule+"@"+line)
			}
			if got := strings.Join(steps, " "); got != tt.steps {
				t.Errorf("steps %q, want %q", got, tt.steps)
			}
			rule := ""
			if x.Limit != nil {
				rule = x.Limit.FullKey
			}
			if rule != tt.rule {
				t.Errorf("rule %q, want %q", rule, tt.rule)
			}
			if m := cfg.Match(tt.domain, tt.give); m.Limit != x.Limit {
				t.Errorf("Explain's limit %v, Match's %v", x.Limit, m.Limit)
			}
			for _, w := range tt.why {
				if !strings.Contains(x.Why, w) {
					t.Errorf("why %q lacks %q", x.Why, w)
				}
			}
			if (tt.why == nil) != (x.Why == "") {
				t.Errorf("why %q, want one: %v", x.Why, tt.why != nil)
			}
		})
	}
}

// TestExplainAgreesWithMatch: over random descriptors made of the rules'
// own keys and values (and others), Explain's limit is Match's.
func TestExplainAgreesWithMatch(t *testing.T) {
	cfg := loadMatch(t, "wildcard", "example2", "share_threshold", "value_to_metric")
	keys := []string{"path", "host", "tenant", "user", "message_type", "to_number", "key", "other"}
	values := []string{"", "/v1/users", "/v2/users/7/orders", "/v1/exact", "/v1/x", "a.example.com", "marketing", "x", "*"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20_000 {
		var es []Entry
		for range 1 + r.IntN(3) {
			es = append(es, Entry{Key: keys[r.IntN(len(keys))], Value: values[r.IntN(len(values))]})
		}
		for _, d := range cfg.Domains() {
			if x, m := cfg.Explain(d, es), cfg.Match(d, es); x.Limit != m.Limit || (x.Limit == nil) != (x.Why != "") {
				t.Fatalf("Explain(%s, %v) = %+v, Match = %v", d, es, x, m.Limit)
			}
		}
	}
}

// TestExplainListsBounded: a level of many keys is named by its first
// ten and a count.
func TestExplainListsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	for i := range 30 {
		fmt.Fprintf(&b, "  - key: k%02d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
	}
	cfg, err := Parse([]File{{Name: "many.yaml", Data: []byte(b.String())}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	x := cfg.Explain("many", entries("nope=1"))
	if !strings.Contains(x.Why, `"k09" and 20 more`) || strings.Contains(x.Why, "k10") {
		t.Errorf("why %q, want the first 10 keys and a count", x.Why)
	}
}
