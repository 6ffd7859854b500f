package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// splitRLConfig splits a /rlconfig body into its header lines (those
// starting with "#") and the rest, failing if a header line comes after
// a rule line.
func splitRLConfig(t *testing.T, body string) (header map[string]string, continued []string, rest string) {
	t.Helper()
	header = map[string]string{}
	lines := strings.SplitAfter(body, "\n")
	i := 0
	for ; i < len(lines) && strings.HasPrefix(lines[i], "#"); i++ {
		line := strings.TrimSuffix(lines[i], "\n")
		if c, ok := strings.CutPrefix(line, "#   "); ok {
			continued = append(continued, c)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "# "), ": ")
		if !ok {
			t.Errorf("/rlconfig header line %q is not \"# name: value\"", line)
		}
		header[name] = value
	}
	rest = strings.Join(lines[i:], "")
	for _, l := range lines[i:] {
		if strings.HasPrefix(l, "#") {
			t.Errorf("/rlconfig header line %q after the rules", l)
		}
	}
	return header, continued, rest
}

// TestRLConfigSource reads /rlconfig over HTTP through a load, a failed
// reload and a good one: its header says where the rules came from, when
// they loaded and the last failed load since, and its rule lines stay
// exactly the rules' Dump.
func TestRLConfigSource(t *testing.T) {
	before := time.Now()
	srv, root := start(t, serverRules, map[string]string{"RUNTIME_QUIET_PERIOD": "10ms"})
	url := "http://" + srv.Addrs().Debug.String() + "/rlconfig"
	read := func() (map[string]string, []string, string) {
		t.Helper()
		code, body := get(t, url)
		if code != 200 {
			t.Fatalf("/rlconfig: %d %q", code, body)
		}
		return splitRLConfig(t, body)
	}

	h, _, rulesText := read()
	if want := "web.user: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false\n"; rulesText != want {
		t.Errorf("/rlconfig rules = %q, want %q", rulesText, want)
	}
	if want := "files " + filepath.Join(root, "config"); h["source"] != want {
		t.Errorf("source = %q, want %q", h["source"], want)
	}
	version, loadedText := h["version"], h["loaded"]
	if !strings.HasPrefix(version, "sha256:") {
		t.Errorf("version = %q, want sha256:...", version)
	}
	loaded, err := time.Parse(time.RFC3339, h["loaded"])
	if err != nil || loaded.Before(before.Truncate(time.Millisecond)) || loaded.After(time.Now()) || !strings.HasSuffix(h["loaded"], "Z") {
		t.Errorf("loaded = %q (%v), want a UTC time since the start", h["loaded"], err)
	}
	if e, ok := h["last load error"]; ok {
		t.Errorf("last load error = %q after a good load, want none", e)
	}

	// Two problems: the error spans two lines, both in the header.
	bad := "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: \"\"\n"
	if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/rlconfig shows the failed reload", func() bool { h, _, _ := read(); return h["last load error"] != "" })
	h, continued, failedRules := read()
	if failedRules != rulesText || h["version"] != version || h["loaded"] != loadedText {
		t.Errorf("after a failed reload: version %s loaded %s, rules %q; want the rules in use, %s loaded %s, %q",
			h["version"], h["loaded"], failedRules, version, loadedText, rulesText)
	}
	e := h["last load error"]
	if !strings.Contains(e, `rules: web.yaml:4: descriptor "web.user": rate_limit: invalid unit "fortnight"`) ||
		len(continued) != 1 || !strings.Contains(continued[0], `rules: web.yaml:5: descriptor 2 of "web": empty key`) {
		t.Errorf("last load error = %q, then %q; want both problems, one a line", e, continued)
	}
	if at, err := time.Parse(time.RFC3339, strings.Fields(e)[0]); err != nil || at.Before(loaded) {
		t.Errorf("last load error %q: want its time first, after the load (%v)", e, err)
	}

	good := strings.Replace(serverRules, "requests_per_unit: 2", "requests_per_unit: 5", 1)
	if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/rlconfig shows the new rules", func() bool { _, _, r := read(); return strings.Contains(r, "requests_per_unit=5") })
	h, continued, _ = read()
	if _, ok := h["last load error"]; ok || len(continued) != 0 {
		t.Errorf("after a good reload: last load error %q %q, want none", h["last load error"], continued)
	}
	if h["version"] == version || h["loaded"] == "" {
		t.Errorf("after a good reload: version %q, loaded %q; want a new version", h["version"], h["loaded"])
	}
}

// TestRLConfigWithoutRules reads /rlconfig of a server started without
// valid rules (FORCE_START_WITHOUT_INITIAL_CONFIG): the error that keeps
// it unhealthy, and no rules.
func TestRLConfigWithoutRules(t *testing.T) {
	srv, _ := start(t, "domain: [broken", map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"})
	_, body := get(t, "http://"+srv.Addrs().Debug.String()+"/rlconfig")
	h, _, rest := splitRLConfig(t, body)
	if !strings.Contains(h["last load error"], "rules: web.yaml:1:") || rest != "no rules loaded\n" || h["source"] != "" {
		t.Errorf("/rlconfig without rules = %q, want the load error and \"no rules loaded\"", body)
	}
}
