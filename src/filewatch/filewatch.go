// Package filewatch follows files that an operator or Kubernetes may
// change while the service runs (the rule files, the TLS files) and tells
// their owner when to read them again: after file events once the files
// have settled, after a periodic re-check that found them changed, and at
// once when asked (SIGHUP). What the files are, how they are read and what
// a new version does are the owner's business (Files).
//
// fsnotify only says that something changed, not that the writer is done:
// removing a file before writing it again, truncating it or writing it in
// pieces each raise events with pauses between them, and a read in such a
// pause finds a valid but partial version. So a change is applied only
// when two reads, the second a quiet period after the first, found the
// same bytes; a writer is seen as done only after pausing for at least
// that long.
package filewatch

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// ErrUnsettled is given to Config.OnError (wrapped) when the files kept
// changing for Config.MaxSettle: nothing is applied, and the watch goes on
// waiting for a pause.
var ErrUnsettled = errors.New("still changing")

// ErrNothingWatched is returned by Update when not one of the directories
// Files.Watches names could be watched.
var ErrNothingWatched = errors.New("nothing to watch")

// Fingerprint identifies what a read found: the files' bytes, or the error
// that stopped the reading. Two reads that found the same have the same
// fingerprint.
type Fingerprint [sha256.Size]byte

// Spec says which events of a watched directory matter: all of them, or
// only those about the named entries.
type Spec struct {
	All   bool
	Names map[string]bool
}

// Files is what a Watcher follows. Its methods are called from one
// goroutine at a time: Update's caller's, then Run's.
type Files interface {
	// Watches returns the directories to watch now (symbolic links may
	// lead elsewhere since the last call), each with the events that
	// matter.
	Watches() map[string]Spec
	// Read reads the files, keeps what it found for Apply, and returns
	// its fingerprint.
	Read() Fingerprint
	// Apply puts in force what the last Read found; a version that
	// cannot be used is the owner's to report, and keeps the one in
	// force.
	Apply()
	// Current returns the fingerprint of the version in force.
	Current() Fingerprint
	// Changed is the periodic re-check: it reports whether the files
	// differ from the version in force.
	Changed() bool
}

// Config tunes a Watcher.
type Config struct {
	// Quiet is how long the files must stay unchanged between the two
	// reads of a change; 0 means one second.
	Quiet time.Duration
	// SwapQuiet replaces Quiet for a change made only of atomic swaps
	// (Swap), after which a read sees a whole version: the first read
	// comes SwapQuiet after the last swap and a second checks it at once.
	// 0 means Quiet.
	SwapQuiet time.Duration
	// MaxSettle bounds the wait for the files to settle: a writer that
	// never pauses is reported (ErrUnsettled) every MaxSettle. 0 means 30
	// quiet periods.
	MaxSettle time.Duration
	// Recheck is how often Files.Changed is asked; 0 means never.
	Recheck time.Duration
	// Swap reports whether an event is an atomic swap (see SwapQuiet);
	// nil means none is.
	Swap func(fsnotify.Event) bool
	// OnError receives the errors of the watching: a directory that
	// cannot be watched, an overflowed event queue, ErrUnsettled.
	OnError func(error)
	// NewWatcher is fsnotify.NewWatcher; a test makes it fail.
	NewWatcher func() (*fsnotify.Watcher, error)
}

// Watcher follows one Files. Create it with New or Polling, call Update
// once if the start must fail when nothing can be watched, then Run.
type Watcher struct {
	cfg   Config
	files Files
	fsw   *fsnotify.Watcher // nil: the re-check alone
	now   chan struct{}

	// mu guards watched, which Update and Run's events both use.
	mu      sync.Mutex
	watched map[string]Spec
}

func (cfg Config) normal() Config {
	cfg.Quiet = cmp.Or(max(cfg.Quiet, 0), time.Second)
	cfg.SwapQuiet = cmp.Or(max(cfg.SwapQuiet, 0), cfg.Quiet)
	cfg.SwapQuiet = min(cfg.SwapQuiet, cfg.Quiet)
	cfg.MaxSettle = cmp.Or(max(cfg.MaxSettle, 0), 30*cfg.Quiet)
	if cfg.OnError == nil {
		cfg.OnError = func(error) {}
	}
	if cfg.NewWatcher == nil {
		cfg.NewWatcher = fsnotify.NewWatcher
	}
	return cfg
}

// New returns a Watcher of files, or the error of the system's file
// notification (too many watchers open, say): then Polling still follows
// them through the re-check.
func New(cfg Config, files Files) (*Watcher, error) {
	cfg = cfg.normal()
	fsw, err := cfg.NewWatcher()
	if err != nil {
		return nil, err
	}
	return &Watcher{cfg: cfg, files: files, fsw: fsw, now: make(chan struct{}, 1), watched: map[string]Spec{}}, nil
}

// Polling returns a Watcher of files that relies on the periodic re-check
// and on Now alone.
func Polling(cfg Config, files Files) *Watcher {
	return &Watcher{cfg: cfg.normal(), files: files, now: make(chan struct{}, 1), watched: map[string]Spec{}}
}

// Close releases the system's watcher when Run was never called (Run
// releases it when it returns).
func (w *Watcher) Close() {
	if w.fsw != nil {
		_ = w.fsw.Close()
	}
}

// Now asks Run to read the files at once and apply them if they are not
// the version in force, without waiting for them to settle: the caller
// says they are complete. A Now asked while one is pending is the same
// one.
func (w *Watcher) Now() {
	select {
	case w.now <- struct{}{}:
	default:
	}
}

// Update watches what Files.Watches names now, again (a directory removed
// and made anew under the same name lost its watch), and stops watching
// what it no longer names. A directory that does not exist is skipped; one
// that exists and cannot be watched is an error, and so is a watch of
// nothing at all (ErrNothingWatched).
func (w *Watcher) Update() error {
	if w.fsw == nil {
		return nil
	}
	want := w.files.Watches()
	var errs []error
	for path, spec := range want {
		if err := w.fsw.Add(path); err != nil {
			delete(want, path)
			if !errors.Is(err, fs.ErrNotExist) && spec.All {
				errs = append(errs, fmt.Errorf("watch %s: %w", path, err))
			}
		}
	}
	w.mu.Lock()
	old := w.watched
	w.watched = want
	w.mu.Unlock()
	for path := range old {
		if _, ok := want[path]; !ok {
			// The directory may be gone already; nothing to undo then.
			_ = w.fsw.Remove(path)
		}
	}
	if len(want) == 0 {
		errs = append(errs, ErrNothingWatched)
	}
	return errors.Join(errs...)
}

// relevant reports whether an event may change the files.
func (w *Watcher) relevant(ev fsnotify.Event) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, self := w.watched[ev.Name]; self {
		// A watched directory itself was removed or renamed.
		return true
	}
	spec, ok := w.watched[filepath.Dir(ev.Name)]
	if !ok {
		return false
	}
	return spec.All || spec.Names[filepath.Base(ev.Name)]
}

func (w *Watcher) update() {
	if err := w.Update(); err != nil {
		w.cfg.OnError(err)
	}
}

// Run follows the files until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	var (
		events <-chan fsnotify.Event
		errs   <-chan error
	)
	if w.fsw != nil {
		defer w.fsw.Close()
		events, errs = w.fsw.Events, w.fsw.Errors
	}
	// Since Go 1.23 a stopped timer's channel holds no stale tick, so
	// Reset alone restarts the quiet period.
	s := &settle{w: w, timer: time.NewTimer(w.cfg.Quiet)}
	s.timer.Stop()
	defer s.timer.Stop()
	var recheck <-chan time.Time
	if w.cfg.Recheck > 0 {
		ticker := time.NewTicker(w.cfg.Recheck)
		defer ticker.Stop()
		recheck = ticker.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if w.relevant(ev) {
				s.changed(w.cfg.Swap != nil && w.cfg.Swap(ev))
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// An overflowed event queue loses events: read to be sure.
			w.cfg.OnError(fmt.Errorf("watch: %w", err))
			s.changed(false)
		case <-s.timer.C:
			s.readAgain()
		case <-recheck:
			// A change already due will read everything anyway. A change
			// found is handled as an event would be, settling included.
			if !s.due && w.files.Changed() {
				s.changed(false)
			}
		case <-w.now:
			w.update()
			if w.files.Read() != w.files.Current() {
				w.files.Apply()
			}
			// Whatever was settling is read: a later event starts anew.
			s.timer.Stop()
			s.reset()
		}
	}
}

// settle is the state of one change, from its first event until two
// reads agree. A read happens once no change has been seen for the quiet
// period, or 10 quiet periods after the previous read (or the first
// change) while changes never pause. Changes that are all atomic swaps
// leave no file half-written: each read sees one whole version, and only a
// read that raced a swap can mix two, so the first read comes after
// SwapQuiet and a second one checks it at once; a disagreement, or any
// other change, makes the change settle as usual.
type settle struct {
	w     *Watcher
	timer *time.Timer
	// due holds from a change until it is applied; swapsOnly while
	// every change since was a swap.
	due, swapsOnly bool
	// since is when the wait for the next read began: the first change,
	// then the last read.
	since time.Time
	// candidate is what the last read found, if read; settling is when
	// the first read of this change was made.
	candidate Fingerprint
	read      bool
	settling  time.Time
}

func (s *settle) reset() {
	s.due, s.swapsOnly, s.read, s.settling = false, false, false, time.Time{}
}

// changed notes an event (swap: an atomic one) and sets when to read.
func (s *settle) changed(swap bool) {
	now, quiet := time.Now(), s.w.cfg.Quiet
	if !s.due {
		s.due, s.since, s.swapsOnly = true, now, true
	}
	s.swapsOnly = s.swapsOnly && swap
	wait := quiet
	if s.swapsOnly {
		wait = s.w.cfg.SwapQuiet
	}
	s.timer.Reset(max(min(wait, s.since.Add(10*quiet).Sub(now)), 0))
}

// readAgain reads the files at the end of a wait, applies them when this read
// agrees with the previous one, and waits a quiet period again otherwise.
func (s *settle) readAgain() {
	w, quiet := s.w, s.w.cfg.Quiet
	w.update()
	if s.swapsOnly && !s.read {
		s.candidate, s.read = w.files.Read(), true
	}
	now, at := w.files.Read(), time.Now()
	if s.read && now == s.candidate {
		s.reset()
		w.files.Apply()
		return
	}
	s.swapsOnly = false
	switch {
	case s.settling.IsZero():
		s.settling = at
	case at.Sub(s.settling) >= w.cfg.MaxSettle:
		// A writer that never stops: say so, keep the version in force,
		// and keep waiting for a pause, counting again.
		w.cfg.OnError(fmt.Errorf("%w after %v (they must stay unchanged for %v)", ErrUnsettled, w.cfg.MaxSettle, quiet))
		s.settling = at
	}
	s.candidate, s.read, s.since = now, true, at
	s.timer.Reset(quiet)
}

// maxLinks bounds Links, as the kernel bounds a lookup (40 on Linux), so
// that a loop of links ends.
const maxLinks = 40

// Links returns the symbolic links met when resolving the last element of
// path: path itself if it is a link, then its target if that is a link
// too, and so on. A swap of any of them is a change of an entry of the
// directory holding it, which is where an owner watches. Directories
// earlier in path are resolved by the system; ask about them separately.
func Links(path string) []string {
	var links []string
	for range maxLinks {
		target, err := os.Readlink(path)
		if err != nil {
			break
		}
		links = append(links, path)
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return links
}
