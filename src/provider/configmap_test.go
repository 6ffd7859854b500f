package provider

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWatchConfigMap updates a rules folder the way the kubelet updates a
// mounted ConfigMap: the files are links through ..data to a timestamped
// folder, and an update writes a new folder, swaps ..data to it with a
// rename, and removes the old one. Only the visible files load, with
// RUNTIME_IGNOREDOTFILES as Envoy Gateway sets it, and the swap reloads.
func TestWatchConfigMap(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	publish := func(version, text string) {
		t.Helper()
		writeFile(t, filepath.Join(dir, version, "web.yaml"), text)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "web.yaml")); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", "web.yaml"), filepath.Join(dir, "web.yaml")); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("..2024_01_01_00_00_00.1", rule("web", 1))
	_, r := startWatch(t, FileConfig{Root: root, Subdirectory: "ratelimit", AppDirectory: "config", IgnoreDotFiles: true})
	if got := r.rpu("web"); got != 1 {
		t.Fatalf("first load: limit %d, want 1", got)
	}

	publish("..2024_01_01_00_01_00.2", rule("web", 2))
	if err := os.RemoveAll(filepath.Join(dir, "..2024_01_01_00_00_00.1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ConfigMap update loads", func() bool { return r.rpu("web") == 2 })
	if _, errs := r.counts(); errs != 0 {
		t.Errorf("%d errors during the update, want none", errs)
	}
}
