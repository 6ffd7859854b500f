package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	t.Parallel()
	good := t.TempDir()
	write := func(dir, name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(good, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write(good, "README.md", "not rules")
	bad := t.TempDir()
	write(bad, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n  - key: \"\"\n")

	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr []string
	}{
		{
			name:       "valid",
			args:       []string{"-config_dir", good},
			wantStdout: "ok: 1 file(s), 1 domain(s), 1 rule(s) in " + good + "\ndomains: a\n",
		},
		{
			name:       "valid with the dashed flag",
			args:       []string{"-config-dir", good},
			wantStdout: "ok: 1 file(s), 1 domain(s), 1 rule(s) in " + good + "\ndomains: a\n",
		},
		{
			name:     "invalid",
			args:     []string{"-config_dir", bad},
			wantCode: 1,
			wantStderr: []string{
				`rules: a.yaml:4: descriptor "a.k": rate_limit: invalid unit "fortnight"`,
				`rules: a.yaml:5: descriptor 2 of "a": empty key`,
				"2 problem(s) in " + bad,
			},
		},
		{
			name:       "missing directory",
			args:       []string{"-config_dir", filepath.Join(bad, "nope")},
			wantCode:   1,
			wantStderr: []string{"provider: rules directory"},
		},
		{name: "no directory", args: nil, wantCode: 2, wantStderr: []string{"usage:"}},
		{
			// The rules `go run ./cmd/ratelimit` serves must stay valid.
			name:       "repository config",
			args:       []string{"-config_dir", "../../config"},
			wantStdout: "ok: 1 file(s), 1 domain(s), 7 rule(s) in ../../config\ndomains: default\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("run(%q) = %d, want %d; stderr:\n%s", tt.args, code, tt.wantCode, stderr.String())
			}
			if stdout.String() != tt.wantStdout {
				t.Errorf("run(%q) stdout = %q, want %q", tt.args, stdout.String(), tt.wantStdout)
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("run(%q) stderr = %q, want it to contain %q", tt.args, stderr.String(), s)
				}
			}
		})
	}
}
