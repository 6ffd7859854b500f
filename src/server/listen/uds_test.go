package listen

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClearSocketPath(t *testing.T) {
	dir := t.TempDir()

	if err := ClearSocketPath(filepath.Join(dir, "none.sock")); err != nil {
		t.Errorf("nothing at the path: %v, want nil", err)
	}

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ClearSocketPath(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("a regular file: %v, want an error saying it is not a socket", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "data" {
		t.Errorf("the file after: %q, %v; want it untouched", b, err)
	}

	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := ClearSocketPath(live); err == nil || !strings.Contains(err.Error(), "another process serves") {
		t.Errorf("a socket served: %v, want an error", err)
	}
	if c, err := net.Dial("unix", live); err != nil {
		t.Errorf("the served socket after: %v, want it still reachable", err)
	} else {
		c.Close()
	}

	// A socket whose server went away without removing it.
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	if err := ClearSocketPath(stale); err != nil {
		t.Errorf("a stale socket: %v, want it removed", err)
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale socket is still there: %v", err)
	}
}

// TestOwnSocketRemovesOnlyItsOwn: at shutdown the server removes its
// socket, but not one a successor put at the same path since.
func TestOwnSocketRemovesOnlyItsOwn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rl.sock")
	old, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	own, err := ClaimSocket(old, path)
	if err != nil {
		t.Fatal(err)
	}
	old.Close() // the drain closes the listener first: the path stays
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("closing the listener removed the path: %v", err)
	}
	// The successor finds a stale socket, replaces it and serves.
	if err := ClearSocketPath(path); err != nil {
		t.Fatal(err)
	}
	next, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	own.Remove()
	if c, err := net.Dial("unix", path); err != nil {
		t.Fatalf("the successor's socket after the old server's shutdown: %v", err)
	} else {
		c.Close()
	}

	// Its own socket, still in place, is removed.
	path2 := filepath.Join(t.TempDir(), "rl.sock")
	l, err := net.Listen("unix", path2)
	if err != nil {
		t.Fatal(err)
	}
	own2, err := ClaimSocket(l, path2)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	own2.Remove()
	if _, err := os.Lstat(path2); !os.IsNotExist(err) {
		t.Errorf("its own socket is still there after shutdown: %v", err)
	}
}
