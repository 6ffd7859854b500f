package provider

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/ratelimitd/ratelimit/src/filewatch"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// defaultQuietPeriod is FileConfig.QuietPeriod when unset. A writer that
// pauses longer than this between two pieces of a file is seen as done, so
// it is generous: tools that remove and recreate a file, or write it in
// several steps, pause for milliseconds, and one that paused 0.35 s was
// seen in the field. Two of them are the delay of a reload.
const defaultQuietPeriod = time.Second

// maxSwapQuiet bounds the quiet period of a reload whose changes were all
// atomic swaps (see atomicChange). Such a reload has no writer to wait
// for; a short pause still gathers the steps of one swap (Kubernetes
// makes ..data_tmp, renames it over ..data, links new files and removes
// the old version within milliseconds) into one reload.
const maxSwapQuiet = 100 * time.Millisecond

// ErrEmptyReload is reported (wrapped) when a reload finds no domain at all
// while the rules in use have some, and FileConfig.AllowEmptyReload is
// false. Nothing is loaded.
var ErrEmptyReload = errors.New("no domain left")

// ErrUnsettled is reported (wrapped) when the rule files kept changing for
// FileConfig.MaxSettle. Nothing is loaded; Watch goes on waiting.
var ErrUnsettled = filewatch.ErrUnsettled

// Watcher reloads a rules directory whenever anything in it changes:
// files written, created, removed, renamed or chmod-ed, subdirectories
// added, the directory itself replaced, or a symbolic link on the way to
// it (Root -> v2) swapped. Each reload waits for the files to settle (see
// FileConfig.QuietPeriod), reads and validates every file again and
// reports a whole new Snapshot, or the error, through the callbacks given
// to Watch. A reload that would leave no domain after rules with some is
// an error unless FileConfig.AllowEmptyReload is set. With
// FileConfig.Recheck it also reads the files periodically and reloads the
// same way when they changed unseen.
//
// Its goroutine is owned by the Watcher: it stops when the context given
// to Watch is done or when Close is called, and Close waits for it. The
// methods are safe for concurrent use.
type Watcher struct {
	cfg     FileConfig
	fw      *filewatch.Watcher
	onLoad  func(Snapshot)
	onError func(error)
	cancel  context.CancelFunc
	done    chan struct{}

	// read is what the last read found, for the load that may follow
	// (filewatch.Files); last is what the last load read, and domains
	// how many domains the last successful load had. Only Watch and then
	// the watching goroutine touch them.
	read struct {
		dir   string
		files []rules.File
		err   error
	}
	last    content
	domains int

	// mu guards stats.
	mu    sync.Mutex
	stats WatchStats
}

// WatchStats counts a Watcher's reloads.
type WatchStats struct {
	// Loads counts the successful loads, the first one included.
	Loads uint64
	// Failures counts the loads that gave an error: invalid rules, a
	// reload with no domain left (ErrEmptyReload), files that would not
	// settle (ErrUnsettled, once per FileConfig.MaxSettle).
	Failures uint64
	// LastLoad is when the last successful load finished.
	LastLoad time.Time
	// LastError is the error of the last load, nil if it succeeded.
	LastError error
	// Rechecks counts the periodic re-checks (FileConfig.Recheck),
	// whether they found a change or not.
	Rechecks uint64
}

// content identifies what a load read: the rules directory as its
// symlinks resolved, and a hash of the rule files' names and bytes, or of
// the error that stopped the reading.
type content struct {
	dir string
	sum [sha256.Size]byte
}

// contentOf returns the content of what readFiles returned.
func contentOf(dir string, files []rules.File, err error) content {
	h := sha256.New()
	// Each name and body is preceded by its length, so that no two sets
	// of files hash the same by moving bytes from one to the next.
	var n [8]byte
	write := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	if err != nil {
		write([]byte("error"))
		write([]byte(err.Error()))
	}
	for _, f := range files {
		write([]byte(f.Name))
		write(f.Data)
	}
	c := content{dir: dir}
	h.Sum(c.sum[:0])
	return c
}

// fingerprint is c as filewatch compares reads.
func (c content) fingerprint() filewatch.Fingerprint {
	h := sha256.New()
	h.Write([]byte(c.dir))
	h.Write([]byte{0})
	h.Write(c.sum[:])
	return filewatch.Fingerprint(h.Sum(nil))
}

// ruleFiles is the Watcher as filewatch follows it.
type ruleFiles Watcher

func (f *ruleFiles) Watches() map[string]filewatch.Spec { return (*Watcher)(f).watches() }

func (f *ruleFiles) Read() filewatch.Fingerprint {
	r := &f.read
	r.dir, r.files, r.err = readFiles(f.cfg)
	return contentOf(r.dir, r.files, r.err).fingerprint()
}

func (f *ruleFiles) Apply() {
	r := f.read
	f.read.files = nil
	(*Watcher)(f).load(r.dir, r.files, r.err)
}

func (f *ruleFiles) Current() filewatch.Fingerprint { return f.last.fingerprint() }

func (f *ruleFiles) Changed() bool { return (*Watcher)(f).recheck() }

// Watch loads the rules directory, reports the result through onLoad or
// onError before it returns, and then watches the directory, reloading
// once each burst of changes has settled (see FileConfig.QuietPeriod).
// The first load does not wait: there are no rules in use yet to protect
// from a half-written file, and the files are read again if they change.
// Callbacks run one at a time, from Watch and then from the Watcher's
// goroutine; they must not block for long. A failed reload is only
// reported: keeping the previous config is the caller's job.
//
// Watch fails only when the watching itself cannot start. A missing rules
// directory is a load error, and its creation is noticed later.
func Watch(ctx context.Context, cfg FileConfig, onLoad func(Snapshot), onError func(error)) (*Watcher, error) {
	cfg.QuietPeriod = cmp.Or(max(cfg.QuietPeriod, 0), defaultQuietPeriod)
	cfg.MaxSettle = cmp.Or(max(cfg.MaxSettle, 0), 30*cfg.QuietPeriod)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("provider: watch %s: %w", cfg.Root, err)
	}
	cfg.Root = root
	if onLoad == nil {
		onLoad = func(Snapshot) {}
	}
	if onError == nil {
		onError = func(error) {}
	}
	w := &Watcher{
		cfg:     cfg,
		onLoad:  onLoad,
		onError: onError,
		done:    make(chan struct{}),
	}
	fw, err := filewatch.New(filewatch.Config{
		Quiet:     cfg.QuietPeriod,
		SwapQuiet: min(cfg.QuietPeriod, maxSwapQuiet),
		MaxSettle: cfg.MaxSettle,
		Recheck:   cfg.Recheck,
		Swap:      atomicChange,
		OnError:   w.watchError,
	}, (*ruleFiles)(w))
	if err != nil {
		return nil, fmt.Errorf("provider: watch %s: %w", cfg.Dir(), err)
	}
	w.fw = fw
	if err := w.updateWatches(); err != nil {
		fw.Close()
		return nil, err
	}
	// Load only once the watches are in place, so that no change falls
	// between the first load and the watching.
	w.load(readFiles(w.cfg))
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		fw.Run(ctx)
	}()
	return w, nil
}

// Close stops the Watcher and waits for its goroutine to end. No callback
// runs after Close returns. Close may be called more than once.
func (w *Watcher) Close() error {
	w.cancel()
	<-w.done
	return nil
}

// Wait blocks until the Watcher has stopped, by Close or by the end of the
// context given to Watch.
func (w *Watcher) Wait() { <-w.done }

// Done is closed when the Watcher has stopped, by Close or by the end of
// the context given to Watch.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Reload asks for the files to be read at once and loaded if they are
// not what the rules in use were read from, without waiting for them to
// settle: the caller (an operator's SIGHUP) says the files are complete. A
// load fails, and keeps the rules in use, as any other would. It does not
// wait for the read; a Reload asked while one is pending is the same one.
func (w *Watcher) Reload() { w.fw.Now() }

// Stats returns the counts of loads so far.
func (w *Watcher) Stats() WatchStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// atomicChange reports whether an event is an atomic swap, after which a
// read of the rule files sees either the version before or the one after,
// whole:
//   - a change of an entry whose name starts with ".." and is no rule
//     file: the internals of a Kubernetes ConfigMap or Secret volume
//     (..data, ..data_tmp, ..2026_11_24_10_00_00.123456789), which the
//     kubelet fills completely before renaming ..data_tmp over ..data,
//     the link every visible file goes through;
//   - the creation of a symbolic link, which is how a link is renamed over
//     another (current -> v2) and how the kubelet adds a file.
//
// Writes, removals and creations of anything else may be steps of an
// unfinished change, so they are not.
func atomicChange(ev fsnotify.Event) bool {
	name := filepath.Base(ev.Name)
	if strings.HasPrefix(name, "..") && !isRuleFile(name, false) {
		return true
	}
	if !ev.Has(fsnotify.Create) {
		return false
	}
	info, err := os.Lstat(ev.Name)
	return err == nil && info.Mode()&fs.ModeSymlink != 0
}

// recheck reads the rule files and reports whether they are not what the
// last load read, so that a reload is due.
func (w *Watcher) recheck() bool {
	now := contentOf(readFiles(w.cfg))
	w.mu.Lock()
	w.stats.Rechecks++
	w.mu.Unlock()
	if now.sum != w.last.sum {
		return true
	}
	if now.dir != w.last.dir {
		// The same rules reached through links that now lead elsewhere:
		// nothing to load, but the watches are on the old place, which
		// may be why no event came.
		if err := w.updateWatches(); err != nil {
			w.onError(err)
		}
		w.last = now
	}
	return false
}

// load parses what readFiles returned and reports the result.
func (w *Watcher) load(dir string, files []rules.File, err error) {
	w.last = contentOf(dir, files, err)
	var cfg *rules.Config
	if err == nil {
		if cfg, err = rules.Parse(files, w.cfg.Options); err != nil {
			err = capProblems(err)
		}
	}
	if err == nil && cfg.Empty() && w.domains > 0 && !w.cfg.AllowEmptyReload {
		err = fmt.Errorf("provider: reload of %s: %w (the rules in use have %d); keeping them (RUNTIME_ALLOW_EMPTY_RELOAD=true allows an empty reload)",
			w.cfg.Dir(), ErrEmptyReload, w.domains)
	}
	if err != nil {
		w.fail(err)
		return
	}
	w.domains = len(cfg.Domains())
	now := w.cfg.Now()
	w.mu.Lock()
	w.stats.Loads++
	w.stats.LastLoad = now
	w.stats.LastError = nil
	w.mu.Unlock()
	src := Source{Kind: SourceFiles, Location: w.cfg.Dir(), Version: "sha256:" + hex.EncodeToString(w.last.sum[:8]), LoadedAt: now}
	if dir != w.cfg.Dir() {
		src.Location += " -> " + dir
	}
	w.onLoad(Snapshot{Rules: cfg, Source: src})
}

// watchError reports an error of the watching; files that would not
// settle count as a failed load.
func (w *Watcher) watchError(err error) {
	if errors.Is(err, filewatch.ErrUnsettled) {
		w.fail(fmt.Errorf("provider: reload of %s: %w; keeping the rules in use", w.cfg.Dir(), err))
		return
	}
	w.onError(fmt.Errorf("provider: %s: %w", w.cfg.Dir(), err))
}

// updateWatches watches what watches names.
func (w *Watcher) updateWatches() error {
	err := w.fw.Update()
	if errors.Is(err, filewatch.ErrNothingWatched) {
		return fmt.Errorf("provider: %w: no ancestor of the rules directory %s exists", err, w.cfg.Dir())
	}
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return nil
}

// fail counts a failed load and reports it.
func (w *Watcher) fail(err error) {
	w.mu.Lock()
	w.stats.Failures++
	w.stats.LastError = err
	w.mu.Unlock()
	w.onError(err)
}

// watches returns what the rules depend on now: the rules directory
// as its symlinks resolve today and its subdirectories (every event); the
// directories holding it, holding Root and holding each symlink met on the
// way from Root to it (events about those entries only, so a replaced
// directory or a swapped symlink reloads); or, while the directory is
// missing, its nearest existing ancestor.
func (w *Watcher) watches() map[string]filewatch.Spec {
	want := map[string]filewatch.Spec{}
	all := func(dir string) {
		want[dir] = filewatch.Spec{All: true}
	}
	entry := func(dir, name string) {
		s := want[dir]
		if s.All {
			return
		}
		if s.Names == nil {
			s.Names = map[string]bool{}
		}
		s.Names[name] = true
		want[dir] = s
	}

	dir := w.cfg.Dir()
	entry(filepath.Dir(dir), filepath.Base(dir))
	entry(filepath.Dir(w.cfg.Root), filepath.Base(w.cfg.Root))
	// A watch on a path follows its symlinks once, when it is added: a
	// watch on current/ratelimit watches v1/ratelimit and sees nothing
	// when current is swapped to v2. The swap is a change of the link's
	// entry in the directory holding it, so watch that entry, for every
	// link on the way (Root, Root/Subdirectory, the rules directory) and
	// every link those point through.
	for _, p := range []string{w.cfg.Root, filepath.Join(w.cfg.Root, w.cfg.Subdirectory), dir} {
		for _, link := range filewatch.Links(p) {
			entry(filepath.Dir(link), filepath.Base(link))
		}
	}
	if resolved, err := filepath.EvalSymlinks(dir); err == nil {
		entry(filepath.Dir(resolved), filepath.Base(resolved))
		_ = filepath.WalkDir(resolved, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			name := d.Name()
			if path != resolved && (strings.HasPrefix(name, "..") || (w.cfg.IgnoreDotFiles && strings.HasPrefix(name, "."))) {
				return filepath.SkipDir
			}
			all(path)
			return nil
		})
	} else {
		// Watch the nearest existing ancestor for the next component.
		for child, parent := dir, filepath.Dir(dir); parent != child; child, parent = parent, filepath.Dir(parent) {
			if info, err := os.Stat(parent); err == nil && info.IsDir() {
				entry(parent, filepath.Base(child))
				break
			}
		}
	}

	return want
}
