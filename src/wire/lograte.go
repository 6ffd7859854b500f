package wire

import (
	"sync/atomic"
	"time"
)

// LogEvery lets one log line of a kind through per interval and counts
// the ones it holds back, so that an outage, or a client whose requests
// fail one by one, cannot flood the logs with a line per request: the
// counters (redis_error, service_error, the quota service's refusals)
// still count every one. Both fronts and the server's listener warnings
// use it, at one pace. It is safe for concurrent use; the zero value lets
// the first line through.
type LogEvery struct {
	next       atomic.Int64 // Unix ns before which lines are held back
	suppressed atomic.Uint64
}

// logInterval is how often a line of each kind may be logged.
const logInterval = time.Second

// Allow reports whether a line may be logged now, and how many were held
// back since the last one.
func (l *LogEvery) Allow(now time.Time) (ok bool, suppressed uint64) {
	t := now.UnixNano()
	n := l.next.Load()
	if t < n || !l.next.CompareAndSwap(n, t+int64(logInterval)) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}
