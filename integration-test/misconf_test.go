package integration

import (
	"strings"
	"testing"
	"time"
)

// Common mistakes leave a line in the log that names their fix (issue
// 34, item 4); this file holds the tests of the built binary's lines.

const misconfRules = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n"

// linesWith returns p's log lines that hold every one of substrs.
func (p *proc) linesWith(substrs ...string) []string {
	var out []string
	for _, line := range strings.Split(p.logs(), "\n") {
		ok := line != ""
		for _, s := range substrs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// TestUnmatchedLoggedAtDebug: with LOG_LEVEL=debug, a flood of requests
// for an unknown domain, and of descriptors no rule matches, each leave a
// line naming what to fix, one a second at most; at the default level,
// none.
func TestUnmatchedLoggedAtDebug(t *testing.T) {
	for _, level := range []string{"debug", "warn"} {
		t.Run(level, func(t *testing.T) {
			p := start(t, map[string]string{"web.yaml": misconfRules}, "LOG_LEVEL="+level)
			c := p.client(t)
			start := time.Now()
			for range 200 {
				if _, err := c.ShouldRateLimit(callCtx(t), request("wbe", "user", "alice")); err != nil {
					t.Fatal(err)
				}
				if _, err := c.ShouldRateLimit(callCtx(t), request("web", "usr", "alice")); err != nil {
					t.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			domain := p.linesWith("unknown domain", "domain=wbe", "add the domain to the rules")
			desc := p.linesWith("descriptor matches no rule", "domain=web", `descriptor="usr=alice"`)
			if level != "debug" {
				if len(domain)+len(desc) != 0 {
					t.Errorf("at LOG_LEVEL=%s: %q %q, want no line", level, domain, desc)
				}
				return
			}
			// One a second at most: the flood took elapsed.
			most := int(elapsed/time.Second) + 1
			for what, got := range map[string][]string{"unknown domain": domain, "no rule": desc} {
				if len(got) < 1 || len(got) > most {
					t.Errorf("%s: %d lines for 200 requests in %v, want 1 to %d:\n%s", what, len(got), elapsed, most, p.logs())
				}
			}
		})
	}
}
