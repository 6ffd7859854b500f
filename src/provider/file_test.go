package provider

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// rule returns a rule file for domain with one rule of rpu per second.
func rule(domain string, rpu int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", domain, rpu)
}

// writeFile writes atomically (temporary name, then rename), as editors
// and deployment tools do, so a reload never sees half a file.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// LoadFiles reads and parses the rule files of the directory, as the
// watcher does: every problem of every file is reported, each naming its
// file and line, and a directory without rule files gives an empty config.
func LoadFiles(cfg FileConfig) (*rules.Config, error) {
	files, err := ReadFiles(cfg)
	if err != nil {
		return nil, err
	}
	return rules.Parse(files, cfg.Options)
}

func TestLoadFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 1))
	writeFile(t, filepath.Join(dir, "b.yml"), rule("b", 2))
	writeFile(t, filepath.Join(dir, "team", "c.YAML"), rule("c", 3))
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), rule("hidden", 4))
	writeFile(t, filepath.Join(dir, "README.md"), "not: [yaml")
	writeFile(t, filepath.Join(dir, "notes.txt"), "domain: ignored")
	// Kubernetes ConfigMap internals: a timestamped directory that the
	// visible files link into. Only the links must load.
	writeFile(t, filepath.Join(dir, "..2024_01_01", "d.yaml"), rule("d", 5))
	if err := os.Symlink(filepath.Join("..2024_01_01", "d.yaml"), filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name           string
		ignoreDotFiles bool
		want           []string
	}{
		{"with dot files", false, []string{"a", "b", "c", "d", "hidden"}},
		{"ignore dot files", true, []string{"a", "b", "c", "d"}},
	}
	for _, tt := range tests {
		cfg, err := LoadFiles(FileConfig{Root: root, Subdirectory: "ratelimit", AppDirectory: "config", IgnoreDotFiles: tt.ignoreDotFiles})
		if err != nil {
			t.Fatalf("%s: LoadFiles = %v", tt.name, err)
		}
		if got := cfg.Domains(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Domains() = %v, want %v", tt.name, got, tt.want)
		}
	}

	files, err := ReadFiles(FileConfig{Root: root, Subdirectory: "ratelimit", AppDirectory: "config", IgnoreDotFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	if want := []string{"a.yaml", "b.yml", "d.yaml", "team/c.YAML"}; !reflect.DeepEqual(names, want) {
		t.Errorf("ReadFiles names = %v, want %v", names, want)
	}
}

func TestLoadFilesErrors(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "config", "good.yaml"), rule("good", 1))
	writeFile(t, filepath.Join(root, "config", "bad.yaml"), "domain: bad\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n")

	_, err := LoadFiles(FileConfig{Root: root, AppDirectory: "config"})
	want := `rules: bad.yaml:5: descriptor "bad.k": rate_limit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`
	if err == nil || err.Error() != want {
		t.Errorf("LoadFiles = %v, want %q", err, want)
	}

	_, err = LoadFiles(FileConfig{Root: root, AppDirectory: "missing"})
	if err == nil || !strings.Contains(err.Error(), "provider: rules directory") {
		t.Errorf("LoadFiles(missing) = %v, want a rules directory error", err)
	}

	empty := t.TempDir()
	cfg, err := LoadFiles(FileConfig{Root: empty})
	if err != nil || !cfg.Empty() {
		t.Errorf("LoadFiles(empty directory) = %v, %v; want an empty config", cfg, err)
	}
}

// recorder keeps what a Watcher reports.
type recorder struct {
	mu      sync.Mutex
	configs []*rules.Config
	sources []Source
	errs    []error
}

func (r *recorder) onLoad(s Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.configs = append(r.configs, s.Rules)
	r.sources = append(r.sources, s.Source)
}

func (r *recorder) onError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *recorder) counts() (loads, errs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.configs), len(r.errs)
}

func (r *recorder) latest() *rules.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.configs) == 0 {
		return nil
	}
	return r.configs[len(r.configs)-1]
}

// rpu is the limit of key k in domain of the latest config, -1 if none.
func (r *recorder) rpu(domain string) int {
	m := r.latest().Match(domain, []rules.Entry{{Key: "k", Value: "v"}})
	if m.Limit == nil {
		return -1
	}
	return int(m.Limit.RequestsPerUnit)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, what, cond)
}

func startWatch(t *testing.T, cfg FileConfig) (*Watcher, *recorder) {
	t.Helper()
	cfg.QuietPeriod = 20 * time.Millisecond
	r := &recorder{}
	w, err := Watch(t.Context(), cfg, r.onLoad, r.onError)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, r
}

func TestWatchReloads(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 1))
	w, r := startWatch(t, FileConfig{Root: root, AppDirectory: "config"})

	if loads, errs := r.counts(); loads != 1 || errs != 0 {
		t.Fatalf("after Watch: %d loads, %d errors; want the first load reported before Watch returns", loads, errs)
	}

	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 2))
	waitFor(t, "a rewritten file reloads", func() bool { return r.rpu("a") == 2 })

	// An in-place write (truncate, then write) reloads too.
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rule("a", 3)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an in-place write reloads", func() bool { return r.rpu("a") == 3 })

	writeFile(t, filepath.Join(dir, "b.yaml"), rule("b", 4))
	waitFor(t, "a new file loads", func() bool { return r.rpu("b") == 4 })

	writeFile(t, filepath.Join(dir, "sub", "c.yaml"), rule("c", 5))
	waitFor(t, "a file in a new subdirectory loads", func() bool { return r.rpu("c") == 5 })

	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a removed file unloads", func() bool { return r.rpu("b") == -1 && r.rpu("a") == 3 })

	if err := os.Rename(filepath.Join(dir, "sub", "c.yaml"), filepath.Join(dir, "sub", "c.yaml.off")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a renamed-away file unloads", func() bool { return r.rpu("c") == -1 })

	loads, _ := r.counts()
	if err := os.Chmod(filepath.Join(dir, "a.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a chmod reloads", func() bool { l, _ := r.counts(); return l > loads })

	if s := w.Stats(); s.Failures != 0 || s.LastError != nil || s.Loads < 7 || s.LastLoad.IsZero() {
		t.Errorf("Stats() = %+v, want at least 7 loads and no failure", s)
	}
}

func TestWatchInvalidRewrite(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 1))
	w, r := startWatch(t, FileConfig{Root: root, AppDirectory: "config"})

	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n")
	waitFor(t, "the invalid rewrite is reported", func() bool { _, errs := r.counts(); return errs > 0 })
	if loads, _ := r.counts(); loads != 1 {
		t.Errorf("%d loads after an invalid rewrite, want only the first", loads)
	}
	r.mu.Lock()
	got := r.errs[0].Error()
	r.mu.Unlock()
	if want := `rules: a.yaml:5: descriptor "a.k": rate_limit: invalid unit "fortnight"`; !strings.HasPrefix(got, want) {
		t.Errorf("onError(%q), want it to start with %q", got, want)
	}
	if s := w.Stats(); s.Failures == 0 || s.LastError == nil {
		t.Errorf("Stats() = %+v, want a failure", s)
	}

	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 9))
	waitFor(t, "the fixed file loads", func() bool { return r.latest() != nil && r.rpu("a") == 9 })
	if s := w.Stats(); s.LastError != nil {
		t.Errorf("Stats().LastError = %v after a good load, want nil", s.LastError)
	}
}

func TestWatchIgnoresOtherFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 1))
	_, r := startWatch(t, FileConfig{Root: root, AppDirectory: "config"})

	writeFile(t, filepath.Join(dir, "README.md"), "domain: [not yaml")
	writeFile(t, filepath.Join(dir, "a.yaml.bak"), "garbage: [")
	// A valid file after the noise: once it is in, the noise was read too.
	writeFile(t, filepath.Join(dir, "b.yaml"), rule("b", 2))
	waitFor(t, "b loads", func() bool { return r.rpu("b") == 2 })
	if _, errs := r.counts(); errs != 0 {
		t.Errorf("non-YAML files gave %d errors, want none", errs)
	}
	if got := r.latest().Domains(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("Domains() = %v, want [a b]", got)
	}
}

// TestWatchSymlinkSwap publishes new rules the way deployments do: a
// symbolic link on the way to the rules is replaced, atomically, by one
// to another version. Each swap must reload, wherever the link is.
func TestWatchSymlinkSwap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// link is the symlink swapped, relative to the base directory;
		// root, sub and app make the FileConfig.
		link, root, sub, app string
		// target is where link points for version v ("v1", "v2").
		target func(v string) string
		// chain links root to link when link is not root itself.
		chain map[string]string
	}{
		{
			// The anchor's (Lyft's) runtime layout.
			name: "root", link: "current", root: "current", sub: "ratelimit", app: "config",
			target: func(v string) string { return v },
		},
		{
			name: "root_rules_at_top", link: "current", root: "current", app: "config",
			target: func(v string) string { return filepath.Join(v, "ratelimit") },
		},
		{
			name: "subdirectory", link: "root/ratelimit", root: "root", sub: "ratelimit", app: "config",
			target: func(v string) string { return filepath.Join("..", v, "ratelimit") },
		},
		{
			// current -> latest -> v1: the second link is the one swapped.
			name: "chained", link: "latest", root: "current", sub: "ratelimit", app: "config",
			target: func(v string) string { return v },
			chain:  map[string]string{"current": "latest"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base := t.TempDir()
			for _, v := range []string{"v1", "v2"} {
				writeFile(t, filepath.Join(base, v, "ratelimit", "config", "a.yaml"), rule("a", map[string]int{"v1": 1, "v2": 2}[v]))
			}
			if err := os.MkdirAll(filepath.Join(base, filepath.Dir(tt.link)), 0o755); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(base, tt.link)
			if err := os.Symlink(tt.target("v1"), link); err != nil {
				t.Fatal(err)
			}
			for from, to := range tt.chain {
				if err := os.Symlink(to, filepath.Join(base, from)); err != nil {
					t.Fatal(err)
				}
			}
			_, r := startWatch(t, FileConfig{Root: filepath.Join(base, tt.root), Subdirectory: tt.sub, AppDirectory: tt.app})
			if got := r.rpu("a"); got != 1 {
				t.Fatalf("first load: a = %d, want 1", got)
			}

			// The deployment swap: a new link, renamed over the old one.
			swap := func(v string) {
				tmp := link + ".tmp"
				if err := os.Symlink(tt.target(v), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, link); err != nil {
					t.Fatal(err)
				}
			}
			swap("v2")
			waitFor(t, "the swap to v2 reloads", func() bool { return r.rpu("a") == 2 })

			// After the swap, changes inside the new version reload too.
			writeFile(t, filepath.Join(base, "v2", "ratelimit", "config", "a.yaml"), rule("a", 3))
			waitFor(t, "a write inside v2 reloads", func() bool { return r.rpu("a") == 3 })

			swap("v1")
			waitFor(t, "the swap back to v1 reloads", func() bool { return r.rpu("a") == 1 })
		})
	}
}

// TestWatchRecheck changes a rule through a path no watch covers: the rule
// file is a link to a file in a directory outside the rules tree (a
// shared file, a mount), which is rewritten in place. No event reaches
// the Watcher; the periodic re-check must load it, and must load nothing
// while the content stays the same.
func TestWatchRecheck(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	shared := filepath.Join(base, "shared", "a.yaml")
	writeFile(t, shared, rule("a", 1))
	dir := filepath.Join(base, "root", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(shared, filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	w, r := startWatch(t, FileConfig{Root: filepath.Join(base, "root"), AppDirectory: "config", Recheck: 10 * time.Millisecond})

	// rechecks waits until n more re-checks have run.
	rechecks := func(what string, n uint64) {
		t.Helper()
		from := w.Stats().Rechecks
		waitFor(t, what, func() bool { return w.Stats().Rechecks >= from+n })
	}
	rechecks("re-checks of unchanged rules", 3)
	if loads, errs := r.counts(); loads != 1 || errs != 0 {
		t.Fatalf("unchanged rules: %d loads, %d errors; want only the first load", loads, errs)
	}

	if err := os.WriteFile(shared, []byte(rule("a", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-check loads the unseen change", func() bool { return r.rpu("a") == 2 })
	rechecks("re-checks after the change", 3)
	if loads, _ := r.counts(); loads != 2 {
		t.Errorf("%d loads after one change, want 2", loads)
	}

	// Invalid content is reported once, keeps nothing from being used
	// (the caller keeps its rules), and is not reported again while it
	// stays the same.
	if err := os.WriteFile(shared, []byte("domain: a\ndescriptors: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-check reports the invalid rules", func() bool { _, errs := r.counts(); return errs == 1 })
	rechecks("re-checks of the same invalid rules", 3)
	if loads, errs := r.counts(); loads != 2 || errs != 1 {
		t.Errorf("same invalid rules: %d loads, %d errors; want 2 and 1", loads, errs)
	}

	if err := os.WriteFile(shared, []byte(rule("a", 4)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-check loads the fixed rules", func() bool { return r.rpu("a") == 4 })
}

func TestWatchDirectoryReplaced(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	_, r := startWatch(t, FileConfig{Root: root, AppDirectory: "config"})
	if _, errs := r.counts(); errs != 1 {
		t.Fatalf("missing directory: %d errors, want 1", errs)
	}

	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 1))
	waitFor(t, "the created directory loads", func() bool { return r.latest() != nil && r.rpu("a") == 1 })

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	_, before := r.counts()
	waitFor(t, "the removal is reported", func() bool { _, errs := r.counts(); return errs > before })

	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 2))
	waitFor(t, "the recreated directory loads", func() bool { return r.rpu("a") == 2 })
}

func TestWatchStops(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "a.yaml"), rule("a", 1))
	ctx, cancel := context.WithCancel(t.Context())
	r := &recorder{}
	w, err := Watch(ctx, FileConfig{Root: root, QuietPeriod: time.Millisecond}, r.onLoad, r.onError)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Watcher did not stop when its context ended")
	}
	w.Wait()
	if err := w.Close(); err != nil {
		t.Errorf("Close after stop = %v", err)
	}
}

// TestWatchSource checks what a Snapshot says of where its rules came
// from: the directory as configured and as its symlinks resolve, a version
// that depends on the files' content only, and the time of the load.
func TestWatchSource(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	// v1 and v2 hold the same bytes: one version, whichever is linked.
	for _, v := range []string{"v1", "v2"} {
		writeFile(t, filepath.Join(base, v, "config", "a.yaml"), rule("a", 1))
	}
	current := filepath.Join(base, "current")
	if err := os.Symlink("v1", current); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	_, r := startWatch(t, FileConfig{Root: current, AppDirectory: "config", Now: func() time.Time { return at }})
	source := func() Source {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.sources[len(r.sources)-1]
	}
	first := source()
	want := Source{Kind: SourceFiles, Location: filepath.Join(current, "config") + " -> " + filepath.Join(base, "v1", "config"), LoadedAt: at}
	if first.Kind != want.Kind || first.Location != want.Location || !first.LoadedAt.Equal(at) || !strings.HasPrefix(first.Version, "sha256:") || len(first.Version) != len("sha256:")+16 {
		t.Errorf("first load's Source = %+v, want %+v with a sha256: version", first, want)
	}

	tmp := current + ".tmp"
	if err := os.Symlink("v2", tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, current); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(base, "v2", "config", "b.yaml"), rule("b", 2))
	waitFor(t, "v2 loads", func() bool { return r.rpu("b") == 2 })
	second := source()
	if want := filepath.Join(current, "config") + " -> " + filepath.Join(base, "v2", "config"); second.Location != want {
		t.Errorf("after the swap, Location = %q, want %q", second.Location, want)
	}
	if second.Version == first.Version {
		t.Errorf("Version %s for other content, want a new one", second.Version)
	}
	if err := os.Remove(filepath.Join(base, "v2", "config", "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b unloads", func() bool { return r.rpu("b") == -1 })
	if third := source(); third.Version != first.Version {
		t.Errorf("Version %s for v1's content in v2, want v1's %s", third.Version, first.Version)
	}

	plain := t.TempDir()
	writeFile(t, filepath.Join(plain, "config", "a.yaml"), rule("a", 1))
	_, r = startWatch(t, FileConfig{Root: plain, AppDirectory: "config"})
	if got := source(); got.Location != filepath.Join(plain, "config") || got.Version != first.Version {
		t.Errorf("without symlinks, Source = %+v, want Location %s and the version of the same content, %s", got, filepath.Join(plain, "config"), first.Version)
	}
}

// TestWatchReloadNow: Reload reads the files at once, without waiting for
// them to settle (here a quiet period of an hour would hold any change
// back), loads them when they changed, and loads nothing when they did
// not.
func TestWatchReloadNow(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 1))
	r := &recorder{}
	w, err := Watch(t.Context(), FileConfig{Root: root, AppDirectory: "config", QuietPeriod: time.Hour}, r.onLoad, r.onError)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 2))
	w.Reload()
	waitFor(t, "Reload loads the change at once", func() bool { return r.rpu("a") == 2 })

	w.Reload()
	w.Reload()
	// A later change with a Reload behind it: its load comes after the
	// two above were handled, in order.
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("a", 3))
	w.Reload()
	waitFor(t, "the next change", func() bool { return r.rpu("a") == 3 })
	if loads, errs := r.counts(); loads != 3 || errs != 0 {
		t.Errorf("%d loads, %d errors; want 3 (first, 2, 3): a Reload of unchanged files loads nothing", loads, errs)
	}
}
