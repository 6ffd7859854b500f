package provider

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// versioned returns a rule file for domain with n rules, k01 to kNN, whose
// limits say which version of the file they come from: rule i of version v
// allows v*1000+i requests. Every prefix of it that ends at a line break
// is valid YAML, as a file caught halfway through its writing would be.
func versioned(domain string, v, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - key: k%02d\n    rate_limit:\n      unit: minute\n      requests_per_unit: %d\n", i, v*1000+i)
	}
	return b.String()
}

// versionOf returns the version of domain's rules in cfg when cfg holds
// all n rules of one version, and an error saying what is wrong otherwise.
func versionOf(cfg *rules.Config, domain string, n int) (int, error) {
	v := -1
	for i := 1; i <= n; i++ {
		m := cfg.Match(domain, []rules.Entry{{Key: fmt.Sprintf("k%02d", i), Value: "x"}})
		if m.Limit == nil {
			return 0, fmt.Errorf("rule k%02d of %s missing (domains %v)", i, domain, cfg.Domains())
		}
		got := int(m.Limit.RequestsPerUnit)
		if got%1000 != i {
			return 0, fmt.Errorf("rule k%02d of %s allows %d", i, domain, got)
		}
		if v >= 0 && got/1000 != v {
			return 0, fmt.Errorf("%s mixes versions %d and %d", domain, v, got/1000)
		}
		v = got / 1000
	}
	return v, nil
}

// watch starts a Watcher on cfg as given (QuietPeriod and MaxSettle left
// at their defaults when zero) and records what it reports.
func watch(t *testing.T, cfg FileConfig) (*Watcher, *recorder) {
	t.Helper()
	r := &recorder{}
	w, err := Watch(t.Context(), cfg, r.onLoad, r.onError)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, r
}

// checkEveryLoad fails unless every config the Watcher loaded holds the n
// rules of domain whole, in a version listed in allowed, and the other
// domains listed in also. It returns the versions in the order loaded.
func checkEveryLoad(t *testing.T, r *recorder, domain string, n int, allowed map[int]bool, also ...string) []int {
	t.Helper()
	r.mu.Lock()
	configs := append([]*rules.Config(nil), r.configs...)
	r.mu.Unlock()
	var seen []int
	for i, cfg := range configs {
		v, err := versionOf(cfg, domain, n)
		if err != nil {
			t.Errorf("load %d served a partial configuration: %v", i+1, err)
			continue
		}
		if !allowed[v] {
			t.Errorf("load %d served version %d, want one of %v", i+1, v, allowed)
		}
		for _, d := range also {
			if !cfg.HasDomain(d) {
				t.Errorf("load %d lacks domain %s: %v", i+1, d, cfg.Domains())
			}
		}
		seen = append(seen, v)
	}
	return seen
}

// waitVersion waits until the latest load is version v of domain.
func waitVersion(t *testing.T, r *recorder, domain string, n, v int) {
	t.Helper()
	// The default quiet period makes a reload take about two seconds,
	// more on a loaded machine: wait well beyond that.
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("version %d of %s loaded", v, domain), func() bool {
		cfg := r.latest()
		if cfg == nil {
			return false
		}
		got, err := versionOf(cfg, domain, n)
		return err == nil && got == v
	})
}

// TestReloadWaitsForWritersToFinish rewrites a rule file the ways tools
// do when they do not write a new file and rename it over the old one.
// Each way leaves the file valid but partial for a while (a few of its
// rules, or none while another file still holds a domain); with the
// default quiet period none of these states may ever be loaded, and the
// final file must be.
func TestReloadWaitsForWritersToFinish(t *testing.T) {
	t.Parallel()
	const n = 40
	// pause is how long the writers below stop between two pieces: long
	// enough for a reload that does not wait for files to settle to catch
	// them halfway, and well inside the quiet period.
	const pause = 300 * time.Millisecond
	tests := []struct {
		name  string
		write func(t *testing.T, path, content string)
	}{
		{
			// rm, then the file written anew (cp, shell redirections,
			// many editors' "save" without a backup).
			name: "remove_then_create",
			write: func(t *testing.T, path, content string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				time.Sleep(pause)
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			// Truncated, then written in two steps with a pause, as a
			// program writing what it generates as it goes.
			name: "truncate_then_write_twice",
			write: func(t *testing.T, path, content string) {
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				cut := strings.Index(content, "  - key: k04\n")
				if _, err := f.WriteString(content[:cut]); err != nil {
					t.Fatal(err)
				}
				time.Sleep(pause)
				if _, err := f.WriteString(content[cut:]); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			// A slow writer: the file in 160 small pieces over about
			// three seconds, far longer than the wait of a reload, with
			// short pauses (a copy over a slow link, a template renderer).
			name: "slow_writer",
			write: func(t *testing.T, path, content string) {
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				lines := strings.SplitAfter(content, "\n")
				for _, line := range lines {
					if _, err := f.WriteString(line); err != nil {
						t.Fatal(err)
					}
					time.Sleep(3 * time.Second / time.Duration(len(lines)))
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			dir := filepath.Join(root, "config")
			path := filepath.Join(dir, "a.yaml")
			writeFile(t, path, versioned("a", 1, n))
			// A second domain, so that a state without a.yaml is a valid,
			// non-empty configuration and only waiting can keep it out.
			writeFile(t, filepath.Join(dir, "b.yaml"), rule("b", 1))
			_, r := watch(t, FileConfig{Root: root, AppDirectory: "config"})

			tt.write(t, path, versioned("a", 2, n))
			waitVersion(t, r, "a", n, 2)
			checkEveryLoad(t, r, "a", n, map[int]bool{1: true, 2: true}, "b")
			if _, errs := r.counts(); errs != 0 {
				r.mu.Lock()
				t.Errorf("errors reported: %v", r.errs)
				r.mu.Unlock()
			}
		})
	}
}

// TestReloadRefusesNoDomain empties the rules in the ways a deployment
// does by mistake. None may replace the rules in use: each is reported as
// ErrEmptyReload, and the next valid rules load as usual. With
// AllowEmptyReload the empty configuration loads.
func TestReloadRefusesNoDomain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// empty empties the rules that current/config leads to; full
		// publishes version 2 of a.yaml afterwards.
		empty, full func(t *testing.T, base string)
	}{
		{
			name: "symlink_to_empty_directory",
			empty: func(t *testing.T, base string) {
				writeFile(t, filepath.Join(base, "empty", "config", "README.md"), "rules go here\n")
				swapLink(t, filepath.Join(base, "current"), "empty")
			},
			full: func(t *testing.T, base string) {
				writeFile(t, filepath.Join(base, "v2", "config", "a.yaml"), versioned("a", 2, 3))
				swapLink(t, filepath.Join(base, "current"), "v2")
			},
		},
		{
			name: "only_file_removed",
			empty: func(t *testing.T, base string) {
				if err := os.Remove(filepath.Join(base, "v1", "config", "a.yaml")); err != nil {
					t.Fatal(err)
				}
			},
			full: func(t *testing.T, base string) {
				writeFile(t, filepath.Join(base, "v1", "config", "a.yaml"), versioned("a", 2, 3))
			},
		},
		{
			name: "only_file_renamed_away",
			empty: func(t *testing.T, base string) {
				from := filepath.Join(base, "v1", "config", "a.yaml")
				if err := os.Rename(from, from+".disabled"); err != nil {
					t.Fatal(err)
				}
			},
			full: func(t *testing.T, base string) {
				writeFile(t, filepath.Join(base, "v1", "config", "a.yaml"), versioned("a", 2, 3))
			},
		},
	}
	for _, tt := range tests {
		for _, allow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/allow_%t", tt.name, allow), func(t *testing.T) {
				t.Parallel()
				base := t.TempDir()
				writeFile(t, filepath.Join(base, "v1", "config", "a.yaml"), versioned("a", 1, 3))
				if err := os.Symlink("v1", filepath.Join(base, "current")); err != nil {
					t.Fatal(err)
				}
				w, r := watch(t, FileConfig{
					Root: filepath.Join(base, "current"), AppDirectory: "config",
					QuietPeriod: 20 * time.Millisecond, AllowEmptyReload: allow,
				})

				tt.empty(t, base)
				if allow {
					waitFor(t, "the empty configuration loads", func() bool { return r.latest().Empty() })
				} else {
					waitFor(t, "the empty reload is reported", func() bool { _, errs := r.counts(); return errs > 0 })
					r.mu.Lock()
					err := r.errs[0]
					r.mu.Unlock()
					if !errors.Is(err, ErrEmptyReload) || !strings.Contains(err.Error(), "RUNTIME_ALLOW_EMPTY_RELOAD") {
						t.Errorf("reported %v, want ErrEmptyReload naming RUNTIME_ALLOW_EMPTY_RELOAD", err)
					}
					if loads, _ := r.counts(); loads != 1 {
						t.Errorf("%d loads after the rules were emptied, want only the first", loads)
					}
					if s := w.Stats(); s.Failures != 1 || !errors.Is(s.LastError, ErrEmptyReload) {
						t.Errorf("Stats() = %+v, want one failure, ErrEmptyReload", s)
					}
				}

				tt.full(t, base)
				waitFor(t, "version 2 loads", func() bool {
					v, err := versionOf(r.latest(), "a", 3)
					return err == nil && v == 2
				})
			})
		}
	}
}

// TestReloadWriterThatNeverStops rewrites a rule file in place without
// pause. Nothing may load while it writes; the Watcher must say, once per
// MaxSettle, that the files do not settle, and load the last version once
// the writer stops.
func TestReloadWriterThatNeverStops(t *testing.T) {
	t.Parallel()
	const n = 20
	root := t.TempDir()
	path := filepath.Join(root, "config", "a.yaml")
	writeFile(t, path, versioned("a", 1, n))
	w, r := watch(t, FileConfig{
		Root: root, AppDirectory: "config",
		QuietPeriod: 100 * time.Millisecond, MaxSettle: 600 * time.Millisecond,
	})

	unsettled := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, err := range r.errs {
			if errors.Is(err, ErrUnsettled) {
				return true
			}
		}
		return false
	}
	// Write until the Watcher gives up waiting, bounded by a deadline.
	deadline := time.Now().Add(30 * time.Second)
	v := 2
	for ; !unsettled(); v++ {
		if time.Now().After(deadline) {
			t.Fatal("no ErrUnsettled reported while the file kept changing")
		}
		if err := os.WriteFile(path, []byte(versioned("a", v, n)), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // the writer's pace: changes far inside the quiet period
	}
	last := v - 1
	waitVersion(t, r, "a", n, last)

	// A load in the middle is whole: only a stall of the writer longer
	// than two quiet periods (a very loaded machine) allows one at all.
	allowed := map[int]bool{}
	for i := 1; i <= last; i++ {
		allowed[i] = true
	}
	// Errors other than ErrUnsettled are not checked: the same stall,
	// between the truncation and the write, would give an invalid file,
	// which is reported and not loaded, as it should be.
	checkEveryLoad(t, r, "a", n, allowed)
	if s := w.Stats(); s.Failures == 0 {
		t.Errorf("Stats() = %+v, want the unsettled reloads counted as failures", s)
	}
}

// swapLink points the symbolic link at link to target, atomically, as a
// deployment publishes a new version.
func swapLink(t *testing.T, link, target string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}
