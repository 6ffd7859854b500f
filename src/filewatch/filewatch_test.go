package filewatch

import (
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/ratelimitd/ratelimit/harness"
)

// oneFile follows one file and records every version applied.
type oneFile struct {
	path string

	mu      sync.Mutex
	pending []byte
	cur     []byte
	applied []string
}

func (f *oneFile) Watches() map[string]Spec {
	return map[string]Spec{filepath.Dir(f.path): {Names: map[string]bool{filepath.Base(f.path): true}}}
}

func (f *oneFile) Read() Fingerprint {
	b, _ := os.ReadFile(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = b
	return sha256.Sum256(b)
}

func (f *oneFile) Apply() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur = f.pending
	f.applied = append(f.applied, string(f.pending))
}

func (f *oneFile) Current() Fingerprint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sha256.Sum256(f.cur)
}

func (f *oneFile) Changed() bool {
	b, _ := os.ReadFile(f.path)
	return sha256.Sum256(b) != f.Current()
}

func (f *oneFile) versions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.applied...)
}

func start(t *testing.T, w *Watcher) {
	t.Helper()
	if err := w.Update(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	t.Cleanup(func() { <-done })
}

// TestWriterInPieces writes a file in two pieces, each raising its event:
// only the whole file is applied, never the half.
func TestWriterInPieces(t *testing.T) {
	t.Parallel()
	f := &oneFile{path: filepath.Join(t.TempDir(), "a")}
	w, err := New(Config{Quiet: time.Second}, f)
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	fh, err := os.Create(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString("first half "); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString("second half"); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	harness.WaitFor(t, 10*time.Second, "the file to be applied", func() bool { return len(f.versions()) > 0 })
	// A version applied after a half would have come first.
	if got := f.versions(); got[0] != "first half second half" {
		t.Errorf("applied %q, want only the whole file", got)
	}
}

// TestNowDoesNotWait applies at once when asked, and not again when
// nothing changed.
func TestNowDoesNotWait(t *testing.T) {
	t.Parallel()
	f := &oneFile{path: filepath.Join(t.TempDir(), "a")}
	// A quiet period longer than the test: only Now can apply.
	w, err := New(Config{Quiet: time.Hour}, f)
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	if err := os.WriteFile(f.path, []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.Now()
	harness.WaitFor(t, 10*time.Second, "v1 applied", func() bool { return len(f.versions()) == 1 })
	w.Now() // may run before or after the swap below: v2 is applied once
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		t.Fatal(err)
	}
	w.Now()
	harness.WaitFor(t, 10*time.Second, "v2 applied", func() bool { return len(f.versions()) >= 2 })
	if got := f.versions(); len(got) != 2 || got[1] != "v2" {
		t.Errorf("applied %q, want v1 then v2 (an unchanged file is not applied again)", got)
	}
}

// TestPollingRecheck follows the file without fsnotify, through the
// re-check alone.
func TestPollingRecheck(t *testing.T) {
	t.Parallel()
	f := &oneFile{path: filepath.Join(t.TempDir(), "a")}
	_, err := New(Config{NewWatcher: func() (*fsnotify.Watcher, error) { return nil, errors.New("too many open files") }}, f)
	if err == nil {
		t.Fatal("New with a failing NewWatcher returned no error")
	}
	w := Polling(Config{Quiet: 10 * time.Millisecond, Recheck: 20 * time.Millisecond}, f)
	start(t, w)
	if err := os.WriteFile(f.path, []byte("polled"), 0o644); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the re-check to apply the file", func() bool { return len(f.versions()) > 0 })
	if got := f.versions(); got[0] != "polled" {
		t.Errorf("applied %q, want polled", got)
	}
}

// TestNothingWatched reports a watch of directories that do not exist.
func TestNothingWatched(t *testing.T) {
	t.Parallel()
	f := &oneFile{path: filepath.Join(t.TempDir(), "missing", "a")}
	w, err := New(Config{}, f)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Update(); !errors.Is(err, ErrNothingWatched) {
		t.Errorf("Update = %v, want ErrNothingWatched", err)
	}
}

// TestUnsettled reports a writer that never pauses.
func TestUnsettled(t *testing.T) {
	t.Parallel()
	f := &oneFile{path: filepath.Join(t.TempDir(), "a")}
	errs := make(chan error, 16)
	w, err := New(Config{Quiet: 20 * time.Millisecond, MaxSettle: 100 * time.Millisecond, OnError: func(err error) {
		select {
		case errs <- err:
		default:
		}
	}}, f)
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	stop := time.After(10 * time.Second)
	for i := 0; ; i++ {
		if err := os.WriteFile(f.path, []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, ErrUnsettled) {
				t.Fatalf("OnError(%v), want ErrUnsettled", err)
			}
			return
		case <-stop:
			t.Fatal("no ErrUnsettled while the file changed every 2 ms")
		case <-time.After(2 * time.Millisecond):
		}
	}
}
