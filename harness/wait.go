package harness

import (
	"errors"
	"runtime"
	"testing"
	"time"
)

// WaitFor polls cond every 10ms until it holds, and fails t if it does not
// within d. what says what is awaited, for the failure message.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitForNil(t, d, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// errNotYet is WaitFor's reason for polling again; it is not reported.
var errNotYet = errors.New("not yet")

// WaitForNil is WaitFor for a try that says why it failed: it polls try
// every 10ms until it returns nil, and fails t with the last error if that
// does not happen within d.
func WaitForNil(t testing.TB, d time.Duration, what string, try func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			if errors.Is(err, errNotYet) {
				t.Fatalf("%s: not within %v", what, d)
			}
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CheckGoroutines fails t if, after a store's Close, more goroutines run
// than before the store was made (before, from runtime.NumGoroutine), with
// a small tolerance for the runtime's own. It waits up to 5 s for them to
// exit, and on failure prints every goroutine's stack. Tests that call it
// must not run in parallel.
func CheckGoroutines(t testing.TB, before int) {
	t.Helper()
	const tolerance = 2
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+tolerance {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before the store, %d after Close\n%s", before, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
