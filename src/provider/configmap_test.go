package provider

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// configMap is a directory laid out as the kubelet lays out a mounted
// ConfigMap: the files are links through ..data, itself a link to a
// timestamped directory holding one version of every file.
type configMap struct {
	dir     string
	updates int
	// files are the names of the current version.
	files map[string]bool
	// fill, when set, is how long writing a new version takes: the time
	// from the new timestamped directory to the swap of ..data.
	fill time.Duration
}

// newConfigMap publishes files as the first version of a ConfigMap in dir.
func newConfigMap(t *testing.T, dir string, files map[string]string) *configMap {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &configMap{dir: dir}
	c.update(t, files)
	return c
}

// update publishes a new version of the ConfigMap's files in the steps of
// the kubelet's AtomicWriter: a new timestamped directory written whole,
// ..data_tmp linked to it and renamed over ..data, links made for new
// files and removed for files gone, the old directory removed.
func (c *configMap) update(t *testing.T, files map[string]string) {
	t.Helper()
	c.updates++
	ts := fmt.Sprintf("..2026_11_24_10_00_00.%09d", c.updates)
	start := time.Now()
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A large ConfigMap takes a while to write; nothing of it shows
	// until ..data is swapped.
	time.Sleep(time.Until(start.Add(c.fill)))
	data, tmp := filepath.Join(c.dir, "..data"), filepath.Join(c.dir, "..data_tmp")
	old, _ := os.Readlink(data)
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if _, err := os.Lstat(filepath.Join(c.dir, name)); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(c.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for name := range c.files {
		if _, ok := files[name]; !ok {
			if err := os.Remove(filepath.Join(c.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.files = map[string]bool{}
	for name := range files {
		c.files[name] = true
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWatchConfigMapUpdate updates a ConfigMap volume as the kubelet does,
// with RUNTIME_IGNOREDOTFILES off and on (Envoy Gateway sets it): the
// files reached through ..data load, the timestamped directories never
// load twice, and an update loads without waiting for the quiet period,
// set here far beyond the test's deadline: nothing is written in place,
// so there is no writer to wait for.
func TestWatchConfigMapUpdate(t *testing.T) {
	t.Parallel()
	for _, ignoreDotFiles := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignore_dot_files_%t", ignoreDotFiles), func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			cm := newConfigMap(t, filepath.Join(root, "ratelimit", "config"), map[string]string{"a.yaml": rule("a", 1)})
			cfg := FileConfig{Root: root, Subdirectory: "ratelimit", AppDirectory: "config", IgnoreDotFiles: ignoreDotFiles, QuietPeriod: time.Minute}
			r := &recorder{}
			w, err := Watch(t.Context(), cfg, r.onLoad, r.onError)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close() })
			if got := r.latest().Domains(); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("first load: domains %v, want [a]", got)
			}

			cm.update(t, map[string]string{"a.yaml": rule("a", 2)})
			waitFor(t, "the updated file loads", func() bool { return r.rpu("a") == 2 })

			// A new key: the kubelet links a new visible file.
			cm.update(t, map[string]string{"a.yaml": rule("a", 3), "b.yaml": rule("b", 4)})
			waitFor(t, "the update with a new file loads", func() bool { return r.rpu("a") == 3 && r.rpu("b") == 4 })

			if _, errs := r.counts(); errs != 0 {
				r.mu.Lock()
				t.Errorf("errors reported: %v", r.errs)
				r.mu.Unlock()
			}
			if got := r.latest().Domains(); !slices.Equal(got, []string{"a", "b"}) {
				t.Errorf("domains %v, want [a b]", got)
			}
		})
	}
}

// TestWatchConfigMapKeyRemoved removes a key of a ConfigMap: the kubelet
// removes its visible link, which is not an atomic swap, so the reload
// settles as usual and the file unloads.
func TestWatchConfigMapKeyRemoved(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cm := newConfigMap(t, filepath.Join(root, "config"), map[string]string{"a.yaml": rule("a", 1), "b.yaml": rule("b", 2)})
	_, r := startWatch(t, FileConfig{Root: root, AppDirectory: "config", IgnoreDotFiles: true})
	cm.update(t, map[string]string{"a.yaml": rule("a", 1)})
	waitFor(t, "b unloads", func() bool { return r.rpu("b") == -1 && r.rpu("a") == 1 })
	if _, errs := r.counts(); errs != 0 {
		t.Errorf("%d errors reported, want none", errs)
	}
}

// TestWatchSwapThenWriteSettles follows a ConfigMap update with a file
// written in place, in two pieces, in the same burst of changes: the
// write makes the reload settle as usual, so the half-written file is
// never loaded, although the swap alone would have loaded at once.
func TestWatchSwapThenWriteSettles(t *testing.T) {
	t.Parallel()
	const n = 20
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	cm := newConfigMap(t, dir, map[string]string{"a.yaml": rule("a", 1)})
	path := filepath.Join(dir, "local.yaml")
	writeFile(t, path, versioned("local", 1, n))
	// The pause of the writer is longer than a swap's quiet period and
	// well inside the quiet period of other changes.
	const quiet, pause = time.Second, 3 * maxSwapQuiet
	_, r := watch(t, FileConfig{Root: root, AppDirectory: "config", QuietPeriod: quiet})

	cm.update(t, map[string]string{"a.yaml": rule("a", 2)})
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	content := versioned("local", 2, n)
	cut := strings.Index(content, "  - key: k04\n")
	if _, err := f.WriteString(content[:cut]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	if _, err := f.WriteString(content[cut:]); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, r, "local", n, 2)
	checkEveryLoad(t, r, "local", n, map[int]bool{1: true, 2: true}, "a")
	if got := r.rpu("a"); got != 2 {
		t.Errorf("a = %d, want the update's 2", got)
	}
}

// TestWatchConfigMapSwapsNeverMix publishes ConfigMap versions of many
// files whose writing takes about the swap quiet period, so that the read
// of a reload often runs while ..data is swapped: every load must hold one
// version of all the files, never some of one version and some of the
// next.
func TestWatchConfigMapSwapsNeverMix(t *testing.T) {
	t.Parallel()
	const files, swaps = 200, 20
	version := func(v int) map[string]string {
		m := map[string]string{}
		for i := range files {
			d := fmt.Sprintf("d%03d", i)
			m[d+".yaml"] = rule(d, v)
		}
		return m
	}
	root := t.TempDir()
	cm := newConfigMap(t, filepath.Join(root, "config"), version(1))
	_, r := watch(t, FileConfig{Root: root, AppDirectory: "config", IgnoreDotFiles: true})
	for v := 2; v <= swaps; v++ {
		// Pace, not an assertion: the reload's read starts a swap quiet
		// period after the new directory appears, around the swap.
		cm.fill = maxSwapQuiet + time.Duration(v%10)*time.Millisecond
		cm.update(t, version(v))
	}
	waitFor(t, "the last version loads", func() bool { return r.rpu("d000") == swaps && r.rpu("d199") == swaps })

	r.mu.Lock()
	defer r.mu.Unlock()
	for i, cfg := range r.configs {
		var seen []int
		for f := range files {
			m := cfg.Match(fmt.Sprintf("d%03d", f), []rules.Entry{{Key: "k", Value: "v"}})
			if m.Limit == nil {
				seen = append(seen, -1)
				continue
			}
			seen = append(seen, int(m.Limit.RequestsPerUnit))
		}
		if slices.Min(seen) != slices.Max(seen) || seen[0] < 1 {
			t.Errorf("load %d mixes versions %d to %d", i+1, slices.Min(seen), slices.Max(seen))
		}
	}
	if len(r.errs) != 0 {
		t.Errorf("errors reported: %v", r.errs)
	}
	t.Logf("%d swaps, %d loads", swaps-1, len(r.configs)-1)
}
