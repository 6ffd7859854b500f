package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ratelimitd/ratelimit/loadgen"
)

func TestParseOverloadFlags(t *testing.T) {
	steps, err := parseSteps(" 64, 256,4096 ")
	if err != nil || len(steps) != 3 || steps[0] != 64 || steps[2] != 4096 {
		t.Errorf("parseSteps = %v, %v; want [64 256 4096]", steps, err)
	}
	for _, bad := range []string{"", "0", "-1", "x", ","} {
		if _, err := parseSteps(bad); err == nil {
			t.Errorf("parseSteps(%q) = nil error", bad)
		}
	}
	ds, err := parseDeadlines("2s,20ms")
	if err != nil || len(ds) != 2 || ds[0] != 2*time.Second || ds[1] != 20*time.Millisecond {
		t.Errorf("parseDeadlines = %v, %v; want [2s 20ms]", ds, err)
	}
	for _, bad := range []string{"", "0s", "-1s", "soon"} {
		if _, err := parseDeadlines(bad); err == nil {
			t.Errorf("parseDeadlines(%q) = nil error", bad)
		}
	}
}

func TestOverloadMarkdown(t *testing.T) {
	if got := errorsByCode(nil); got != "none" {
		t.Errorf("errorsByCode(nil) = %q, want none", got)
	}
	got := errorsByCode(map[codes.Code]uint64{codes.DeadlineExceeded: 3, codes.ResourceExhausted: 7, codes.Unavailable: 0})
	if want := "RESOURCE_EXHAUSTED 7, DEADLINE_EXCEEDED 3"; got != want {
		t.Errorf("errorsByCode = %q, want %q", got, want)
	}
	res := &loadgen.Result{OK: 10, Errors: map[codes.Code]uint64{}, Window: time.Second, InWindow: 10}
	md := overloadMarkdown([]overloadRow{
		{store: "redis", c: 64, deadline: 2 * time.Second, res: res, trips: 0, shed: 0},
		{store: "memory", c: 64, deadline: 2 * time.Second, res: res, trips: nan(), shed: 1},
		{store: "redis", impl: anchorVariant, c: 64, deadline: 2 * time.Second, res: res, trips: nan(), shed: nan()},
	}, overloadConfig{timing: timing{duration: time.Second}})
	for _, want := range []string{
		"| redis | this service | 64 | 2s | 10 |", "| none | 0 | 0 |", "| none | — | 1 |",
		"| redis | envoyproxy/ratelimit | 64 | 2s | 10 |", "| none | — | — |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}
