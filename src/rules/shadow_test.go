package rules

import "testing"

// shadowRules has an enforced limit beside a shadow twin, and a
// descriptor whose only limit is a shadow one.
const shadowRules = `domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 5, algorithm: sliding_window, shadow_mode: true, name: strict}
  - key: path
    rate_limits:
      - {unit: hour, requests_per_unit: 100, shadow_mode: true}
`

func TestParseShadowLimits(t *testing.T) {
	t.Parallel()
	cfg := parseFiles(t, "a.yaml", shadowRules)
	l := cfg.Match("d", entries("user=alice")).Limit
	if l == nil || len(l.Limits) != 2 {
		t.Fatalf("Match(user=alice) = %v, want a list of 2", l)
	}
	if l.Limits[0].Shadow || !l.Limits[1].Shadow {
		t.Errorf("Shadow = %t, %t; want false, true", l.Limits[0].Shadow, l.Limits[1].Shadow)
	}
	if l.Limits[1].ShadowMode {
		t.Error("a shadow item set the descriptor's ShadowMode")
	}
	if !l.Limits[0].Enforced() || l.Limits[1].Enforced() {
		t.Errorf("Enforced() = %t, %t; want true, false", l.Limits[0].Enforced(), l.Limits[1].Enforced())
	}
	if p := cfg.Match("d", entries("path=/x")).Limit; p == nil || !p.Shadow || len(p.Limits) != 1 {
		t.Errorf("Match(path=/x) = %+v, want a list of one shadow limit", p)
	}
	want := `d.path: unit=HOUR requests_per_unit=100, shadow_mode: false, quota_mode: false, rate_limits: 1/1 hour_shadow, shadow: true
d.user: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false, rate_limits: 1/2 minute
d.user: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false, rate_limits: 2/2 strict, shadow: true, algorithm: sliding_window, name: strict
`
	if got := cfg.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
}

// TestParseShadowTwin: a shadow limit may have the algorithm and window of
// the limit in force beside it: it counts in a key of its own, and
// unnamed, its statistics are named after its window and "_shadow".
func TestParseShadowTwin(t *testing.T) {
	t.Parallel()
	cfg := parseFiles(t, "a.yaml", `domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 60}
      - {unit: minute, requests_per_unit: 30, shadow_mode: true}
`)
	l := cfg.Match("d", entries("user=alice")).Limit
	if l == nil || len(l.Limits) != 2 || l.Limits[0].StatLevel != "minute" || l.Limits[1].StatLevel != "minute_shadow" {
		t.Fatalf("Match(user=alice) = %+v, want the limit and its shadow twin, minute and minute_shadow", l)
	}
}
