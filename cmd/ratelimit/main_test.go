package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestVersionFlag(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v9.8.7-test"
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-version"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("-version: exit %d, want 0; stderr %q", code, stderr.String())
	}
	if got, want := stdout.String(), "ratelimit v9.8.7-test\n"; got != want {
		t.Errorf("-version printed %q, want %q", got, want)
	}

	version = ""
	stdout.Reset()
	run([]string{"-version"}, &stdout, &stderr)
	if got := strings.TrimSpace(stdout.String()); got != "ratelimit dev" {
		t.Errorf("-version unstamped printed %q, want %q", got, "ratelimit dev")
	}
}

func TestBadUsage(t *testing.T) {
	for _, args := range [][]string{{"-nosuchflag"}, {"serve"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d", args, code, exitUsage)
		}
		if stderr.Len() == 0 {
			t.Errorf("run(%q) said nothing on stderr", args)
		}
	}
}
