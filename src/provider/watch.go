package provider

import (
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

// errNoDirectory is returned by Watch when not even an ancestor of the
// rules directory can be watched.
var errNoDirectory = errors.New("provider: nothing to watch: no ancestor of the rules directory exists")

// ErrEmptyReload is reported (wrapped) when a reload finds no domain at all
// while the rules in use have some, and FileConfig.AllowEmptyReload is
// false. Nothing is loaded.
var ErrEmptyReload = errors.New("no domain left")

// ErrUnsettled is reported (wrapped) when the rule files kept changing for
// FileConfig.MaxSettle. Nothing is loaded; Watch goes on waiting.
var ErrUnsettled = errors.New("still changing")

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
	fsw     *fsnotify.Watcher
	onLoad  func(Snapshot)
	onError func(error)
	cancel  context.CancelFunc
	done    chan struct{}
	// now asks the goroutine for a read at once (Reload).
	now chan struct{}

	// watched maps each watched directory to the entries of it that
	// matter. Only Watch and then the run goroutine touch it.
	watched map[string]watchSpec
	// last is what the last load read, and domains how many domains the
	// last successful load had. Only Watch and then the run goroutine
	// touch them.
	last    content
	domains int

	// mu guards stats.
	mu    sync.Mutex
	stats WatchStats
}

// watchSpec says which events of a watched directory reload: all of them,
// or only those about the listed entries.
type watchSpec struct {
	all   bool
	names map[string]bool
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
	if cfg.QuietPeriod <= 0 {
		cfg.QuietPeriod = defaultQuietPeriod
	}
	if cfg.MaxSettle <= 0 {
		cfg.MaxSettle = 30 * cfg.QuietPeriod
	}
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
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("provider: watch %s: %w", cfg.Dir(), err)
	}
	w := &Watcher{
		cfg:     cfg,
		fsw:     fsw,
		onLoad:  onLoad,
		onError: onError,
		done:    make(chan struct{}),
		now:     make(chan struct{}, 1),
		watched: map[string]watchSpec{},
	}
	if err := w.updateWatches(); err != nil {
		fsw.Close()
		return nil, err
	}
	// Load only once the watches are in place, so that no change falls
	// between the first load and the watching.
	w.load(readFiles(w.cfg))
	ctx, w.cancel = context.WithCancel(ctx)
	go w.run(ctx)
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
func (w *Watcher) Wait() {
	<-w.done
}

// Done is closed when the Watcher has stopped, by Close or by the end of
// the context given to Watch.
func (w *Watcher) Done() <-chan struct{} {
	return w.done
}

// Reload asks for the files to be read at once and loaded if they are
// not what the rules in use were read from, without waiting for them to
// settle: the caller (an operator's SIGHUP) says the files are complete. A
// load fails, and keeps the rules in use, as any other would. It does not
// wait for the read; a Reload asked while one is pending is the same one.
func (w *Watcher) Reload() {
	select {
	case w.now <- struct{}{}:
	default:
	}
}

// Stats returns the counts of loads so far.
func (w *Watcher) Stats() WatchStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	defer w.fsw.Close()
	quiet := w.cfg.QuietPeriod
	// Since Go 1.23 a stopped timer's channel holds no stale tick, so
	// Reset alone restarts the quiet period.
	timer := time.NewTimer(quiet)
	timer.Stop()
	defer timer.Stop()
	var recheck <-chan time.Time
	if w.cfg.Recheck > 0 {
		ticker := time.NewTicker(w.cfg.Recheck)
		defer ticker.Stop()
		recheck = ticker.C
	}

	// A reload is due from a change until two reads of the files agree.
	// A read happens once no change has been seen for the quiet period,
	// or maxWait after the previous read (or the first change) while
	// changes never pause. An event only says that something changed, not
	// that the writer is done: removing a file before writing it again,
	// truncating it, or writing it in pieces each raise events with pauses
	// between them, and a read in such a pause finds a valid but partial
	// configuration. Asking a second read, a quiet period later, to find
	// the same bytes means a writer is seen as done only after pausing
	// for at least that long.
	//
	// Changes that are all atomic swaps (see atomicChange) leave no file
	// half-written: each read sees one whole version, and only a read
	// that raced a swap can mix two. For them the first read is made
	// after a shorter pause (maxSwapQuiet) and checked by a second one at
	// once, which differs if a swap fell inside the first; a disagreement
	// or any other change makes the reload settle as usual. A Kubernetes
	// ConfigMap update then applies in about 0.1 s instead of 2 s.
	swapQuiet := min(quiet, maxSwapQuiet)
	var (
		due bool
		// swapsOnly holds while every change of this reload was an
		// atomic swap.
		swapsOnly bool
		// since is when the wait for the next read began: the first
		// change of this reload, then the last read.
		since time.Time
		// candidate is what the last read of this reload found, if
		// read; settling is when that reload's first read was made.
		candidate content
		read      bool
		settling  time.Time
	)
	maxWait := 10 * quiet
	changed := func(swap bool) {
		now := time.Now()
		if !due {
			due, since, swapsOnly = true, now, true
		}
		swapsOnly = swapsOnly && swap
		wait := quiet
		if swapsOnly {
			wait = swapQuiet
		}
		timer.Reset(max(min(wait, since.Add(maxWait).Sub(now)), 0))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if w.relevant(ev) {
				changed(atomicChange(ev))
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// An overflowed event queue loses events: reload to be sure.
			w.onError(fmt.Errorf("provider: watch %s: %w", w.cfg.Dir(), err))
			changed(false)
		case <-timer.C:
			if err := w.updateWatches(); err != nil {
				w.onError(err)
			}
			if swapsOnly && !read {
				candidate, read = contentOf(readFiles(w.cfg)), true
			}
			dir, files, err := readFiles(w.cfg)
			now, at := contentOf(dir, files, err), time.Now()
			if read && now == candidate {
				due, swapsOnly, read, settling = false, false, false, time.Time{}
				w.load(dir, files, err)
				continue
			}
			swapsOnly = false
			switch {
			case settling.IsZero():
				settling = at
			case at.Sub(settling) >= w.cfg.MaxSettle:
				// A writer that never stops: say so, keep the rules in
				// use, and keep waiting for a pause, counting again.
				w.fail(fmt.Errorf("provider: reload of %s: %w after %v; keeping the rules in use until the files stay unchanged for %v",
					w.cfg.Dir(), ErrUnsettled, w.cfg.MaxSettle, quiet))
				settling = at
			}
			candidate, read, since = now, true, at
			timer.Reset(quiet)
		case <-recheck:
			// A reload already due will read everything anyway. A change
			// found is handled as an event would be, settling included.
			if !due && w.recheck() {
				changed(false)
			}
		case <-w.now:
			if err := w.updateWatches(); err != nil {
				w.onError(err)
			}
			dir, files, err := readFiles(w.cfg)
			if contentOf(dir, files, err) != w.last {
				w.load(dir, files, err)
			}
			// Whatever was settling is read: a later event starts anew.
			timer.Stop()
			due, swapsOnly, read, settling = false, false, false, time.Time{}
		}
	}
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

// relevant reports whether an event may change the rules.
func (w *Watcher) relevant(ev fsnotify.Event) bool {
	if _, self := w.watched[ev.Name]; self {
		// A watched directory itself was removed or renamed.
		return true
	}
	spec, ok := w.watched[filepath.Dir(ev.Name)]
	if !ok {
		return false
	}
	return spec.all || spec.names[filepath.Base(ev.Name)]
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

// fail counts a failed load and reports it.
func (w *Watcher) fail(err error) {
	w.mu.Lock()
	w.stats.Failures++
	w.stats.LastError = err
	w.mu.Unlock()
	w.onError(err)
}

// updateWatches watches what the rules depend on now: the rules directory
// as its symlinks resolve today and its subdirectories (every event); the
// directories holding it, holding Root and holding each symlink met on the
// way from Root to it (events about those entries only, so a replaced
// directory or a swapped symlink reloads); or, while the directory is
// missing, its nearest existing ancestor.
func (w *Watcher) updateWatches() error {
	want := map[string]watchSpec{}
	all := func(dir string) {
		want[dir] = watchSpec{all: true}
	}
	entry := func(dir, name string) {
		s := want[dir]
		if s.all {
			return
		}
		if s.names == nil {
			s.names = map[string]bool{}
		}
		s.names[name] = true
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
		for _, link := range symlinkHops(p) {
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

	// Add every path again, even those watched already: a directory
	// removed and created anew under the same name lost its watch.
	var errs []error
	for path, spec := range want {
		if err := w.fsw.Add(path); err != nil {
			delete(want, path)
			if !errors.Is(err, fs.ErrNotExist) && spec.all {
				errs = append(errs, fmt.Errorf("provider: watch %s: %w", path, err))
			}
		}
	}
	for path := range w.watched {
		if _, ok := want[path]; !ok {
			// The directory may be gone already; nothing to undo then.
			_ = w.fsw.Remove(path)
		}
	}
	w.watched = want
	if len(want) == 0 {
		errs = append(errs, errNoDirectory)
	}
	return errors.Join(errs...)
}

// maxSymlinkHops bounds symlinkHops, as the kernel bounds a lookup (40 on
// Linux), so that a link loop ends.
const maxSymlinkHops = 40

// symlinkHops returns the symbolic links met when resolving the last
// element of path: path itself if it is a link, then its target if that
// is a link too, and so on. Directories earlier in path are resolved by
// the system, and the caller asks about them separately.
func symlinkHops(path string) []string {
	var links []string
	for range maxSymlinkHops {
		info, err := os.Lstat(path)
		if err != nil || info.Mode()&fs.ModeSymlink == 0 {
			break
		}
		links = append(links, path)
		target, err := os.Readlink(path)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return links
}
