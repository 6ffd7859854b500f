package harness

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and
// ends the goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

// fails runs wait with a recorder and returns what it failed with.
func fails(t *testing.T, wait func(tb testing.TB)) (msg string) {
	t.Helper()
	r := &fatalRecorder{TB: t}
	defer func() {
		if p := recover(); p != r {
			t.Fatalf("the wait ended with %v, want a failure", p)
		}
		msg = r.msg
	}()
	wait(r)
	return ""
}

// TestWaitForNilReportsTheLastError: the failure says what was awaited
// and, for WaitForNil, the try's last error; WaitFor adds no error.
func TestWaitForNilReportsTheLastError(t *testing.T) {
	msg := fails(t, func(tb testing.TB) {
		WaitForNil(tb, 0, "the answer", func() error { return errors.New("the server is busy") })
	})
	if want := "the answer: not within 0s: the server is busy"; msg != want {
		t.Errorf("WaitForNil failed with %q, want %q", msg, want)
	}
	msg = fails(t, func(tb testing.TB) {
		WaitFor(tb, 0, "the answer", func() bool { return false })
	})
	if want := "the answer: not within 0s"; msg != want {
		t.Errorf("WaitFor failed with %q, want %q", msg, want)
	}
	start := 0
	WaitForNil(t, time.Minute, "the third try", func() error {
		if start++; start < 3 {
			return errors.New("early")
		}
		return nil
	})
	if start != 3 {
		t.Errorf("WaitForNil returned after %d tries, want 3", start)
	}
}
