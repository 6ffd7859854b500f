package harness

import (
	"os"
	"path/filepath"
	"testing"
)

// LockLoad serialises the tests that drive a steady load against a server
// and hold it to timings (the fault tests, the soak). go test runs packages
// in parallel, and on a small machine two such tests see each other's load
// as stalls of hundreds of milliseconds: answers late for their budget,
// errors outside the faults. LockLoad takes an exclusive lock on a file in
// the temporary directory, shared by every test process of the machine,
// waiting as long as another holds it, and releases it in tb.Cleanup. Tests
// should hold it for one load run (tens of seconds), not a whole suite.
// Where file locks are not supported it does nothing.
func LockLoad(tb testing.TB) {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "ratelimit-load.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		tb.Fatalf("harness: load lock: %v", err)
	}
	if err := lockFile(f); err != nil {
		_ = f.Close()
		tb.Fatalf("harness: load lock: %v", err)
	}
	// Closing the file releases the lock.
	tb.Cleanup(func() { _ = f.Close() })
}
