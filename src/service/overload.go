package service

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Overload: past what the process can answer in time, a call that would
// wait behind the calls in flight for longer than its budget (its caller's
// deadline less the margin) cannot be answered in time: it is refused at
// once (ResourceExhausted, counted as load_shed), before its message is
// read, rather than admitted to fail at its deadline after costing what an
// answer costs. The wait is told by Little's law: the calls in flight
// divided by the calls finished per second. Under a steady overload the
// calls admitted settle at about their budget, and the others are refused
// in microseconds; a call whose deadline leaves time for the wait is
// never refused, however many are in flight (up to
// MAX_CONCURRENT_REQUESTS). Calls without a deadline are never refused so
// (MAX_CONCURRENT_REQUESTS and the store budget bound them).
const (
	// loadWindow is the span over which the calls finished per second are
	// counted.
	loadWindow = 100 * time.Millisecond
	// loadMinFinished is the fewest calls a window must finish for its
	// rate to be used: fewer say too little.
	loadMinFinished = 16
	// loadStale is how long a rate is used without a new window closing
	// (no call finished since): past it the rate is unknown, and no call
	// is refused on it.
	loadStale = time.Second
	// loadMinInFlight is the fewest calls in flight at which a call may be
	// refused for the wait: below it the process is not overloaded, and
	// Little's law over a few calls says nothing.
	loadMinInFlight = 64
)

// loadMeter counts the calls finished per second, over windows of
// loadWindow. It is safe for concurrent use; the zero value knows no rate.
type loadMeter struct {
	start atomic.Int64 // the window's start, Unix nanoseconds; 0 before the first
	n     atomic.Int64 // calls finished in it
	rate  atomic.Int64 // per second, in the last window that finished loadMinFinished; 0: unknown
}

// finished counts a call that finished at now.
func (m *loadMeter) finished(now time.Time) {
	m.n.Add(1)
	start, t := m.start.Load(), now.UnixNano()
	if start == 0 {
		m.start.CompareAndSwap(0, t)
		return
	}
	if el := t - start; el >= int64(loadWindow) && m.start.CompareAndSwap(start, t) {
		n := m.n.Swap(0)
		if n < loadMinFinished {
			m.rate.Store(0)
			return
		}
		// The mean with the last window's: one window slowed by a
		// pause (a garbage collection, another process) must not
		// shed calls that a generous deadline lets wait.
		rate := n * int64(time.Second) / el
		if old := m.rate.Load(); old > 0 {
			rate = (rate + old) / 2
		}
		m.rate.Store(rate)
	}
}

// wait returns how long a call arriving at now would wait behind inFlight
// calls at the last rate, and false when the rate is unknown.
func (m *loadMeter) wait(inFlight int64, now time.Time) (time.Duration, bool) {
	rate := m.rate.Load()
	if rate <= 0 || now.UnixNano()-m.start.Load() > int64(loadStale) {
		return 0, false
	}
	return time.Duration(inFlight * int64(time.Second) / rate), true
}

// overloaded returns the error of a call to refuse at admission, with
// inFlight calls in flight (itself included), or nil: see the overload
// comment above.
func (s *Service) overloaded(ctx context.Context, inFlight int64, now time.Time) error {
	if inFlight < loadMinInFlight {
		return nil
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	wait, ok := s.load.wait(inFlight, now)
	if !ok {
		return nil
	}
	left := dl.Sub(now)
	if wait <= left-deadlineMargin(left) {
		return nil
	}
	s.loadShed.Inc()
	s.cfg.Log.Debug("request shed", "reason", "its deadline is shorter than the wait behind the calls in flight",
		"in_flight", inFlight, "wait", wait, "deadline", left)
	return status.Error(codes.ResourceExhausted, fmt.Sprintf(
		"service: %d calls in flight, about %v of work ahead, more than the call's deadline leaves (%v)",
		inFlight, wait.Round(time.Microsecond), left.Round(time.Microsecond)))
}
