package service_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/service"
)

// logBuffer collects a logger's lines.
type logBuffer struct{ harness.Log }

func (l *logBuffer) lines(substr string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// A request for a domain no rule names, and a descriptor no rule matches,
// are each logged at debug level, one line a second at most whatever
// their number, with the held-back count in the next; at the default
// level (warn) not at all.
func TestUnmatchedLoggedAtDebugOnceASecond(t *testing.T) {
	tests := []struct {
		name string
		give *rlsv3.RateLimitRequest
		want []string // in the line
	}{
		{"unknown_domain", &rlsv3.RateLimitRequest{Domain: "tset", Descriptors: req(desc("user", "alice")).Descriptors},
			[]string{`msg="unknown domain: `, "add the domain to the rules", "domain=tset", "domains=[test]"}},
		{"no_rule", req(desc("usr", "alice")),
			[]string{`msg="descriptor matches no rule: `, "check its keys and values", "domain=test", `descriptor="usr=alice"`}},
		{"no_rule_value_cut", req(desc("path", strings.Repeat("v", 4000))),
			[]string{`msg="descriptor matches no rule: `, `descriptor="path=` + strings.Repeat("v", 64) + `..."`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, level := range []slog.Level{slog.LevelDebug, slog.LevelWarn} {
				var logs logBuffer
				f := newFixture(t, service.Config{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))})
				for range 500 {
					f.call(t, tt.give)
				}
				f.advance(time.Second)
				f.call(t, tt.give)
				got := logs.lines("level=DEBUG")
				if level != slog.LevelDebug {
					if len(got) != 0 {
						t.Errorf("at %v: %q, want no line", level, got)
					}
					continue
				}
				if len(got) != 2 {
					t.Fatalf("501 requests over a second logged %d lines, want 2:\n%s", len(got), strings.Join(got, "\n"))
				}
				for _, w := range tt.want {
					if !strings.Contains(got[0], w) {
						t.Errorf("line %q does not hold %q", got[0], w)
					}
				}
				if !strings.Contains(got[0], "suppressed=0") || !strings.Contains(got[1], "suppressed=499") {
					t.Errorf("lines %q, want suppressed=0 then suppressed=499", got)
				}
				if len(got[0]) > 512 {
					t.Errorf("line of %d bytes, want the values cut", len(got[0]))
				}
			}
		})
	}
}

// A request that matches a rule is not logged; nor is a descriptor of an
// unknown domain on its own (the domain's line says it all).
func TestMatchedNotLoggedAsUnmatched(t *testing.T) {
	var logs logBuffer
	f := newFixture(t, service.Config{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	f.call(t, req(desc("user", "alice")))
	f.call(t, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: req(desc("user", "alice")).Descriptors})
	if got := logs.lines("matches no rule"); len(got) != 0 {
		t.Errorf("logged %q, want no 'matches no rule' line", got)
	}
	if got := logs.lines("unknown domain"); len(got) != 1 {
		t.Errorf("logged %q, want one 'unknown domain' line", got)
	}
}
