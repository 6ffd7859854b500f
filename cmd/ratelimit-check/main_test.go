package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/src/provider"
	"github.com/ratelimitd/ratelimit/src/replay"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// write writes a rule file, creating its directory.
func write(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

const (
	webV1 = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 5}
`
	// webV2 raises one limit, changes one algorithm and adds a rule.
	webV2 = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 100}
`
	// listsV1 has a descriptor with two limits and a value_regex.
	listsV1 = `domain: web
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 50, name: hourly}
  - key: path
    value_regex: /api/.*
    rate_limit: {unit: minute, requests_per_unit: 9}
`
	// apiRules and apiMore define one domain in two files: valid only
	// with -merge_domain_configs.
	apiRules = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	apiMore  = "domain: api\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
)

// quotaRules are a domain with quota_buckets only (RLQS).
const quotaRules = `domain: web
quota_buckets:
  - bucket: {tenant: "*"}
    rate_limit: {unit: second, requests_per_unit: 100}
  - policy: deny_all
`

func TestRun(t *testing.T) {
	t.Parallel()
	good := t.TempDir()
	write(t, good, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write(t, good, "README.md", "not rules")
	bad := t.TempDir()
	write(t, bad, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n  - key: \"\"\n")

	v1, v2, v1Again := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, v1, "web.yaml", webV1)
	write(t, v2, "web.yaml", webV2)
	// The same rules in other files and lines: no difference.
	write(t, v1Again, "team/web.yml", "# moved\n"+webV1)
	merged := t.TempDir()
	write(t, merged, "api.yaml", apiRules)
	write(t, merged, "api-more.yaml", apiMore)
	dotted := t.TempDir()
	write(t, dotted, "web.yaml", webV1)
	write(t, dotted, ".api.yaml", apiRules)
	empty := t.TempDir()
	quota := t.TempDir()
	write(t, quota, "web.yaml", quotaRules)
	lists, listsMore := t.TempDir(), t.TempDir()
	write(t, lists, "web.yaml", listsV1)
	write(t, listsMore, "web.yaml", strings.Replace(listsV1, "requests_per_unit: 50", "requests_per_unit: 60", 1))

	webV1Dump := "web.path_/login: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false\n" +
		"web.user: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n"

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
			name:       "valid_with_the_dashed_flag",
			args:       []string{"-config-dir", good},
			wantStdout: "ok: 1 file(s), 1 domain(s), 1 rule(s) in " + good + "\ndomains: a\n",
		},
		{
			// As the service with WRITE_BEHIND_INTERVAL: fixed windows only.
			name:     "write_behind_refuses_other_algorithms",
			args:     []string{"-write_behind", "-config_dir", v2},
			wantCode: 1,
			wantStderr: []string{
				`rules: web.yaml:7: descriptor "web.path_/login": rate_limit: algorithm sliding_window is not supported by the shared store (write-behind counting (WRITE_BEHIND_INTERVAL) bounds its over-admission on fixed_window only)`,
				"1 problem(s) in " + v2,
			},
		},
		{
			name:       "write_behind_takes_fixed_windows",
			args:       []string{"-write_behind", "-config_dir", good},
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
			name:       "missing_directory",
			args:       []string{"-config_dir", filepath.Join(bad, "nope")},
			wantCode:   1,
			wantStderr: []string{"provider: rules directory"},
		},
		{name: "no_directory", args: nil, wantCode: 2, wantStderr: []string{"usage:"}},
		{
			// The rules `go run ./cmd/ratelimit` serves must stay valid.
			name:       "repository_config",
			args:       []string{"-config_dir", "../../config"},
			wantStdout: "ok: 1 file(s), 1 domain(s), 10 rule(s) in ../../config\ndomains: default\n",
		},
		{
			name:       "dump",
			args:       []string{"-config_dir", v1, "-dump"},
			wantStdout: webV1Dump,
		},
		{
			name:       "quota_rules",
			args:       []string{"-config_dir", quota},
			wantStdout: "ok: 1 file(s), 1 domain(s), 0 rule(s), 2 quota rule(s) in " + quota + "\ndomains: web\n",
		},
		{
			name: "dump_quota_rules",
			args: []string{"-config_dir", quota, "-dump"},
			wantStdout: "web quota_buckets[1] {tenant=*}: unit=SECOND requests_per_unit=100, burst: 100, policy: fair_share\n" +
				"web quota_buckets[2] default: policy: deny_all\n",
		},
		{
			// Every limit of a list, on a line of its own.
			name: "dump_lists",
			args: []string{"-config_dir", lists, "-dump"},
			wantStdout: "web.path_~/api/.*: unit=MINUTE requests_per_unit=9, shadow_mode: false, quota_mode: false\n" +
				"web.user: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false, rate_limits: 1/2 second\n" +
				"web.user: unit=HOUR requests_per_unit=50, shadow_mode: false, quota_mode: false, rate_limits: 2/2 hourly, name: hourly\n",
		},
		{
			name:     "diff_lists",
			args:     []string{"-diff", lists, listsMore},
			wantCode: 1,
			wantStdout: "~ web.user: rate_limits[2].requests_per_unit 50 -> 60\n" +
				"1 change(s) from " + lists + " to " + listsMore + ": 0 added, 0 removed, 1 changed, 0 restarting counters\n",
		},
		{
			name:       "dump_invalid",
			args:       []string{"-dump", "-config_dir", bad},
			wantCode:   1,
			wantStderr: []string{"2 problem(s) in " + bad},
		},
		{
			name:       "dump_ignore_dot_files",
			args:       []string{"-config_dir", dotted, "-dump", "-ignore_dot_files"},
			wantStdout: webV1Dump,
		},
		{
			name:       "diff_same",
			args:       []string{"-diff", v1, v1Again},
			wantStdout: "no difference between " + v1 + " and " + v1Again + "\n",
		},
		{
			name:     "diff_changes",
			args:     []string{"-diff", v1, v2},
			wantCode: 1,
			wantStdout: "+ web.ip: unit=SECOND requests_per_unit=100, shadow_mode: false, quota_mode: false\n" +
				"~ web.path_/login: algorithm fixed_window -> sliding_window (counters restart)\n" +
				"~ web.user: requests_per_unit 10 -> 20\n" +
				"3 change(s) from " + v1 + " to " + v2 + ": 1 added, 0 removed, 2 changed, 1 restarting counters\n",
		},
		{
			name:     "diff_back",
			args:     []string{"-diff", v2, v1},
			wantCode: 1,
			wantStdout: "- web.ip: unit=SECOND requests_per_unit=100, shadow_mode: false, quota_mode: false\n" +
				"~ web.path_/login: algorithm sliding_window -> fixed_window (counters restart)\n" +
				"~ web.user: requests_per_unit 20 -> 10\n" +
				"3 change(s) from " + v2 + " to " + v1 + ": 0 added, 1 removed, 2 changed, 1 restarting counters\n",
		},
		{
			name:       "diff_invalid_new",
			args:       []string{"-diff", v1, bad},
			wantCode:   2,
			wantStderr: []string{`rules: a.yaml:4: descriptor "a.k"`, "2 problem(s) in " + bad},
		},
		{
			name:       "diff_invalid_both",
			args:       []string{"-diff", merged, bad},
			wantCode:   2,
			wantStderr: []string{`duplicate domain "api"`, "1 problem(s) in " + merged, "2 problem(s) in " + bad},
		},
		{
			name:     "diff_merge_domain_configs",
			args:     []string{"-diff", "-merge_domain_configs", v1, merged},
			wantCode: 1,
			wantStdout: "+ domain api\n" +
				"+ api.j: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false\n" +
				"+ api.k: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false\n" +
				"- domain web\n" +
				"- web.path_/login: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false\n" +
				"- web.user: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n" +
				"6 change(s) from " + v1 + " to " + merged + ": 3 added, 3 removed, 0 changed, 0 restarting counters\n",
		},
		{
			name:       "diff_ignore_dot_files",
			args:       []string{"-diff", "-ignore_dot_files", v1, dotted},
			wantStdout: "no difference between " + v1 + " and " + dotted + "\n",
		},
		{
			name:     "diff_to_empty",
			args:     []string{"-diff", v1, empty},
			wantCode: 1,
			wantStdout: "- domain web\n" +
				"- web.path_/login: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false\n" +
				"- web.user: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n" +
				"3 change(s) from " + v1 + " to " + empty + ": 0 added, 3 removed, 0 changed, 0 restarting counters\n",
			wantStderr: []string{"warning: " + empty + " has no domain left", "RUNTIME_ALLOW_EMPTY_RELOAD=true"},
		},
		{
			name:       "diff_missing_directory",
			args:       []string{"-diff", v1, filepath.Join(v1, "nope")},
			wantCode:   2,
			wantStderr: []string{"provider: rules directory"},
		},
		{name: "diff_one_directory", args: []string{"-diff", v1}, wantCode: 2, wantStderr: []string{"usage:"}},
		{name: "diff_with_config_dir", args: []string{"-diff", "-config_dir", v1, v1, v2}, wantCode: 2, wantStderr: []string{"usage:"}},
		{name: "diff_with_dump", args: []string{"-diff", "-dump", v1, v2}, wantCode: 2, wantStderr: []string{"usage:"}},
		{name: "unknown_flag", args: []string{"-config_dir", v1, "-dupm"}, wantCode: 2, wantStderr: []string{"-dupm", "usage:"}},
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
				t.Errorf("run(%q) stdout =\n%s\nwant\n%s", tt.args, stdout.String(), tt.wantStdout)
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("run(%q) stderr = %q, want it to contain %q", tt.args, stderr.String(), s)
				}
			}
		})
	}
}

// TestDumpIsWhatTheServiceLoads compares -dump with the rules the
// service's file provider loads from the same directory (a Kubernetes
// ConfigMap volume, with the settings Envoy Gateway uses): the same
// lines, so the command cannot show rules the service would not serve.
// TestWriteBehindFromTheEnvironment: in the service's environment, the
// check refuses what the service with WRITE_BEHIND_INTERVAL refuses.
func TestWriteBehindFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "web.yaml", webV2)
	for env, want := range map[string]int{"100ms": 1, "0": 0, "": 0} {
		t.Setenv("WRITE_BEHIND_INTERVAL", env)
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-config_dir", dir}, &stdout, &stderr); code != want {
			t.Errorf("WRITE_BEHIND_INTERVAL=%q: exit %d, want %d\n%s", env, code, want, stderr.String())
		}
	}
}

func TestDumpIsWhatTheServiceLoads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The kubelet's layout: the files are links through ..data into a
	// timestamped directory.
	write(t, dir, "..2026_11_24_10_00_00.123456789/web.yaml", webV2)
	write(t, dir, "..2026_11_24_10_00_00.123456789/api.yaml", apiRules)
	if err := os.Symlink("..2026_11_24_10_00_00.123456789", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"web.yaml", "api.yaml"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	files, err := provider.ReadFiles(provider.FileConfig{Root: dir, IgnoreDotFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.Parse(files, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-config_dir", dir, "-dump", "-ignore_dot_files"}, &stdout, &stderr); code != 0 {
		t.Fatalf("run = %d, want 0; stderr:\n%s", code, stderr.String())
	}
	if got, want := stdout.String(), cfg.Dump(); got != want || !strings.Contains(got, "api.k:") || !strings.Contains(got, "web.ip:") {
		t.Errorf("-dump =\n%s\nwant the service's\n%s", got, want)
	}
}

// writeCapture writes a capture of user's requests, one a second, each
// answered as want says (true: OVER_LIMIT).
func writeCapture(t *testing.T, dir, user string, want []bool) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"capture":1,"ns":1764246000000000000,"values":"plain","seconds":60,"requests":100}` + "\n")
	for i, over := range want {
		code := "OK"
		if over {
			code = "OVER_LIMIT"
		}
		fmt.Fprintf(&b, `{"ns":%d,"domain":"web","descriptors":[{"entries":[["user",%q]]}],"code":%q,"codes":[%q]}`+"\n",
			1764246000000000000+int64(i+1)*1e9, user, code, code)
	}
	fmt.Fprintf(&b, `{"summary":{"ns":1764246060000000000,"requests":%d,"dropped":0,"too_large":0,"bytes":1,"reason":"seconds"}}`+"\n", len(want))
	path := filepath.Join(dir, "web.ndjson")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplay(t *testing.T) {
	t.Parallel()
	// webV1 limits a user to 10 a minute, webV2 to 20.
	v1, v2, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, v1, "web.yaml", webV1)
	write(t, v2, "web.yaml", strings.Replace(webV2, "requests_per_unit: 20", "requests_per_unit: 8", 1))
	bad := t.TempDir()
	write(t, bad, "web.yaml", "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
	twelve := make([]bool, 12)
	twelve[10], twelve[11] = true, true // as webV1 answered them
	capturePath := writeCapture(t, tmp, "alice", twelve)
	broken := filepath.Join(tmp, "broken.ndjson")
	if err := os.WriteFile(broken, []byte(`{"capture":1,"ns":1}`+"\n"+`{"ns":1,"domain":"web"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{"same_as_the_capture", []string{"-replay", capturePath, "-config_dir", v1}, 0,
			[]string{"replayed 12 requests", "the same answer to every request and descriptor", "web.user", `user="alice"`}, ""},
		{"stricter_than_the_capture", []string{"-replay", capturePath, "-config_dir", v2}, 1,
			[]string{"2 descriptors answered differently; 2 requests refused by " + v2 + " only"}, ""},
		{"against_rules", []string{"-replay", capturePath, "-config_dir", v2, "-against", v1}, 1,
			[]string{"compared with " + v1, "admitted, refused by " + v2}, ""},
		{"json", []string{"-replay", capturePath, "-config_dir", v1, "-json"}, 0,
			[]string{`"requests": 12`, `"descriptors_differ": 0`, `"id": "web.user"`}, ""},
		{"bad_capture_line", []string{"-replay", broken, "-config_dir", v1}, 2, nil, "capture: line 2: not a request"},
		{"no_capture", []string{"-replay", filepath.Join(tmp, "none"), "-config_dir", v1}, 2, nil, "no such file"},
		{"invalid_rules", []string{"-replay", capturePath, "-config_dir", bad}, 2, nil, "problem(s) in " + bad},
		{"no_rules_dir", []string{"-replay", capturePath}, 2, nil, "usage:"},
		{"with_dump", []string{"-replay", capturePath, "-config_dir", v1, "-dump"}, 2, nil, "usage:"},
		{"against_alone", []string{"-config_dir", v1, "-against", v2}, 2, nil, "usage:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, s := range tt.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, stderr.String())
			}
		})
	}
}

// TestReplaySetsMemoryLimit: the replay sets the Go memory limit to what
// it holds at most (replay.Config.MemoryBound, from its flags) and the
// slack, so that the collector keeps the heap near it (GOGC is 400), and
// leaves a GOMEMLIMIT alone. Not parallel: the limit is the process's.
func TestReplaySetsMemoryLimit(t *testing.T) {
	v1, tmp := t.TempDir(), t.TempDir()
	write(t, v1, "web.yaml", webV1)
	capturePath := writeCapture(t, tmp, "alice", make([]bool, 3))
	// What the command sets, the test puts back.
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	args := []string{"-replay", capturePath, "-config_dir", v1, "-memory_max_bytes", "8388608", "-max_key_bytes", "1048576"}
	for _, env := range []string{"", "1GiB"} {
		t.Setenv("GOMEMLIMIT", env)
		debug.SetMemoryLimit(math.MaxInt64)
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		want := replay.Config{MemoryMaxBytes: 8 << 20, MaxKeyBytes: 1 << 20}.MemoryBound() + memoryLimitSlack
		if env != "" {
			want = math.MaxInt64
		}
		if got := debug.SetMemoryLimit(-1); got != want {
			t.Errorf("GOMEMLIMIT=%q: memory limit %d, want %d", env, got, want)
		}
	}
}
