// Package provider finds rules and turns them into whole, validated
// rules.Config snapshots: from a directory on disk (read once or watched
// for changes) or from an xDS management server (WatchXDS). It hands every
// snapshot to its caller and never swaps a config itself; publishing it
// and keeping the last good one on a failed reload is the caller's job.
//
// It knows the file system and the xDS client protocol, and nothing of the
// rate-limit service, stores or statistics; xDS types stay inside it.
package provider

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// FileConfig says where the rule files are and how to read them. The
// directory is Root/Subdirectory/AppDirectory, as envoyproxy/ratelimit
// joins RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY.
type FileConfig struct {
	// Root is RUNTIME_ROOT. It, or any directory below it on the way to
	// the rules, may be a symbolic link that deployments swap to publish
	// a new version (current -> v2); Watch notices the swap.
	//
	// envoyproxy/ratelimit's RUNTIME_WATCH_ROOT chooses between watching
	// Root and watching the rules directory, each mode missing some
	// changes. Watch always watches both, so that setting has no field.
	Root string
	// Subdirectory is RUNTIME_SUBDIRECTORY (default "").
	Subdirectory string
	// AppDirectory is RUNTIME_APPDIRECTORY ("config" in settings).
	AppDirectory string
	// IgnoreDotFiles skips files and directories whose names start with a
	// dot (RUNTIME_IGNOREDOTFILES; default false). Directories whose names
	// start with ".." (Kubernetes ConfigMap internals) are always skipped,
	// and a file is judged by its own name, not its link's target: the
	// files of a ConfigMap volume (web.yaml -> ..data/web.yaml) load either
	// way, as in envoyproxy/ratelimit.
	IgnoreDotFiles bool
	// Options is passed to rules.Parse.
	Options rules.Options
	// QuietPeriod is how long the rule files must stay unchanged before
	// Watch loads them (RUNTIME_QUIET_PERIOD; default 1s). Watch reads the
	// files once no change has been seen for QuietPeriod, and again
	// QuietPeriod later, and loads only when both reads agree, so a file
	// being written (removed then created again, truncated then written,
	// written piece by piece) is loaded once its writer has paused for at
	// least QuietPeriod, never halfway. A reload therefore takes about
	// 2 × QuietPeriod after the last change. While changes never pause,
	// the files are still read every 10 × QuietPeriod, and loaded as soon
	// as two reads agree.
	//
	// Changes that are all atomic swaps write nothing in place and wait
	// less: a Kubernetes ConfigMap or Secret update (the kubelet renames
	// ..data_tmp over ..data) or a symbolic link renamed over another
	// (current -> v2) loads once no change has been seen for
	// min(QuietPeriod, 100ms), after two reads in a row agree; about
	// 0.1 s in all. Any other change in the same burst, or reads that
	// disagree, make it settle as above.
	QuietPeriod time.Duration
	// MaxSettle bounds the wait for the files to settle: when the reads
	// still disagree after MaxSettle (a writer that never stops), Watch
	// reports an ErrUnsettled error, loads nothing, and goes on waiting,
	// reporting again every MaxSettle; the rules in use stay. Default
	// 30 × QuietPeriod.
	MaxSettle time.Duration
	// AllowEmptyReload lets a reload with no domain at all replace rules
	// that had some (RUNTIME_ALLOW_EMPTY_RELOAD; default false). Without
	// it such a reload is reported as ErrEmptyReload and the rules in use
	// stay: an emptied directory, or a symlink swapped to one without
	// rules, is far more often a deployment mistake than a wish to drop
	// every limit. Dropping every limit on purpose stays possible without
	// it: a file with a domain and no descriptors.
	AllowEmptyReload bool
	// Now is the clock for WatchStats; nil means time.Now.
	Now func() time.Time
	// Recheck is how often Watch reads the rule files again, whatever
	// the events, and compares a hash of them with what it last loaded:
	// a change that raised no event (a network file system, a rule file
	// linked to one outside the watched tree, a lost event) then reloads
	// within Recheck + 2 × QuietPeriod, as an event would. An unchanged
	// re-check costs reading and hashing the files and reloads nothing.
	// Zero (the default here; 60s in settings) disables it.
	Recheck time.Duration
}

// Dir returns the rules directory: Root/Subdirectory/AppDirectory.
func (c FileConfig) Dir() string { return filepath.Join(c.Root, c.Subdirectory, c.AppDirectory) }

// ReadFiles reads the rule files of the directory: every *.yaml and *.yml
// file, in subdirectories too, sorted by path. Each file is named in
// errors by its path relative to the directory. Other files are ignored.
// Symbolic links to files are followed; links to directories are not.
func ReadFiles(cfg FileConfig) ([]rules.File, error) {
	_, files, err := readFiles(cfg)
	return files, err
}

// readFiles is ReadFiles that also returns the rules directory with its
// symlinks resolved, the one it read.
func readFiles(cfg FileConfig) (string, []rules.File, error) {
	dir := cfg.Dir()
	// The root itself may be a symlink (current -> v2); walk its target.
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", nil, fmt.Errorf("provider: rules directory: %w", err)
	}
	var files []rules.File
	err = filepath.WalkDir(resolved, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == resolved {
			if !d.IsDir() {
				return fmt.Errorf("%s is not a directory", dir)
			}
			return nil
		}
		name := d.Name()
		if d.IsDir() {
			if strings.HasPrefix(name, "..") || (cfg.IgnoreDotFiles && strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !isRuleFile(name, cfg.IgnoreDotFiles) {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			info, err := os.Stat(path)
			if err != nil {
				return err
			}
			if !info.Mode().IsRegular() {
				return nil
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(resolved, path)
		if err != nil {
			return err
		}
		// A file past the bound is not read whole: its first bytes past
		// the bound are enough for rules.Parse to refuse it by name.
		data, err := readAtMost(path, rules.MaxFileBytes+1)
		if err != nil {
			return err
		}
		if err != nil {
			return err
		}
		files = append(files, rules.File{Name: filepath.ToSlash(rel), Data: data})
		return nil
	})
	if err != nil {
		return "", nil, fmt.Errorf("provider: read rules in %s: %w", dir, err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return resolved, files, nil
}

// readAtMost reads at most n bytes of a file: one that grows while it is
// read is cut there, and refused by its size.
func readAtMost(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// isRuleFile reports whether a file name is one to load.
func isRuleFile(name string, ignoreDotFiles bool) bool {
	if ignoreDotFiles && strings.HasPrefix(name, ".") {
		return false
	}
	ext := strings.ToLower(filepath.Ext(name))
	return ext == ".yaml" || ext == ".yml"
}
