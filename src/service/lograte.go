package service

import (
	"sync/atomic"
	"time"
)

// logEvery lets one log line of a kind through per interval and counts
// the ones it holds back, so that an outage, or a client whose requests
// fail one by one, cannot flood the logs with a line per request: the
// counters (redis_error, service_error) still count every one. It is safe
// for concurrent use; the zero value lets the first line through.
type logEvery struct {
	next       atomic.Int64 // Unix ns before which lines are held back
	suppressed atomic.Uint64
}

// logInterval is how often a line of each kind may be logged.
const logInterval = time.Second

// allow reports whether a line may be logged now, and how many were held
// back since the last one.
func (l *logEvery) allow(now time.Time) (ok bool, suppressed uint64) {
	t := now.UnixNano()
	n := l.next.Load()
	if t < n || !l.next.CompareAndSwap(n, t+int64(logInterval)) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}

// LogEvery is logEvery for the server's own lines (the gRPC listener's
// warnings), so that every rate-limited line keeps the same pace. Its zero
// value lets the first line through; it is safe for concurrent use.
type LogEvery struct{ l logEvery }

// Allow reports whether a line may be logged at now, and how many were
// held back since the last one.
func (l *LogEvery) Allow(now time.Time) (ok bool, suppressed uint64) { return l.l.allow(now) }
