package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// Slack of the leak checks: goroutines of the runtime and of gRPC come and
// go, and the files and Redis connections are reopened as the load needs
// them; a leak grows with every fault, far past these.
const (
	goroutineSlack = 5
	fileSlack      = 5
)

// answerMargin is what an answer may take beyond the budget: the time to
// schedule, answer and read it on a loaded machine.
const answerMargin = 200 * time.Millisecond

// report is what a soak run measured.
type report struct {
	cfg           config
	streams       []stream
	senders       []*sender
	faults        []fault
	began, ended  time.Time
	before, after usage
	stderr        string
	// loadBefore and loadAfter are the machine's 1-minute load average:
	// stalls of a loaded machine show as slow answers.
	loadBefore, loadAfter string

	// Filled by analyse.
	calls, decisions, over int
	errs                   map[codes.Code]int
	outside                []string // errors outside the faults, described
	p50, p99, slowest      time.Duration
	cleanP50, cleanP99     time.Duration // outside the faults
	slowestCall            call
	perFault               []faultFigures
	accuracy               []streamAccuracy
}

// faultFigures is what clients saw of one fault.
type faultFigures struct {
	errors int
	// firstDecision is the time from the fix to the first decision;
	// everySender, to the first decision of the last sender to recover.
	firstDecision, everySender time.Duration
	// lastSender describes the sender that recovered last.
	lastSender string
	slowest    time.Duration
	// waited counts the requests sent from breakerGrace after the fault
	// began until its fix that still waited for their budget
	// (DeadlineExceeded): the breaker closed while Redis could not serve.
	waited int
}

// storeTimeout is the service's REDIS_TIMEOUT: the breaker opens on round
// trips past it (a request's own budget says nothing of Redis, issue 25),
// so it is kept short, as the README advises, for faults to open it.
const storeTimeout = 250 * time.Millisecond

// breakerGrace is how long a fault may take to open the breaker: five
// failures, round trips that passed storeTimeout, with the connections'
// round trips side by side (two timeouts, with REDIS_POOL_SIZE 10 one),
// and far less for a refused connection.
const breakerGrace = 4 * storeTimeout

// streamAccuracy is one checked stream's windows.
type streamAccuracy struct {
	name                            string
	checked, exact                  int
	inFault, failed, ambiguous      int
	partial                         int
	admittedInFault, limitedInFault int // admitted, and the sum of min(sent, limit), in fault windows
	mismatches                      []string
}

// during reports whether the window [from, to) overlaps a fault, from its
// start to its fix. A window is checked for accuracy from the fix on: whatever was
// sent during the fault counts in the keys of the fault's windows (a
// fixed-window key holds its window's start), even when Redis applies it
// later (thawed, or the delayed replies' commands); a window after the fix
// in which a request still failed is left out on its own.
func (r *report) during(from, to time.Time) bool {
	for _, f := range r.faults {
		if to.After(f.injected) && from.Before(f.fixed) {
			return true
		}
	}
	return false
}

// faulty reports whether a call overlaps a fault or the recovery after it.
func (r *report) faulty(from, to time.Time) bool {
	for _, f := range r.faults {
		if !to.Before(f.injected) && !from.After(f.fixed.Add(recoverBound)) {
			return true
		}
	}
	return false
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// analyse fills the figures from the calls.
func (r *report) analyse() {
	r.errs = map[codes.Code]int{}
	var all, clean []time.Duration
	for _, s := range r.senders {
		for _, c := range s.calls {
			r.calls++
			all = append(all, c.took())
			if c.took() > r.slowestCall.took() {
				r.slowestCall = c
			}
			faulty := r.faulty(c.began, c.ended)
			if !faulty {
				clean = append(clean, c.took())
			}
			if c.code != codes.OK {
				r.errs[c.code]++
				if !faulty {
					r.outside = append(r.outside, fmt.Sprintf("%v at %v after %v (%s)", c.code,
						c.began.Sub(r.began).Round(time.Millisecond), c.took().Round(time.Millisecond), r.streams[s.stream].name))
				}
				continue
			}
			r.decisions++
			if c.over {
				r.over++
			}
		}
	}
	slices.Sort(all)
	slices.Sort(clean)
	r.p50, r.p99, r.slowest = percentile(all, 0.5), percentile(all, 0.99), r.slowestCall.took()
	r.cleanP50, r.cleanP99 = percentile(clean, 0.5), percentile(clean, 0.99)

	for i, f := range r.faults {
		next := r.ended
		if i+1 < len(r.faults) {
			next = r.faults[i+1].injected
		}
		var ff faultFigures
		first := time.Time{}
		// The fault's calls: from its start to the end of the recovery
		// bound after its fix, as faulty tells.
		until := f.fixed.Add(recoverBound)
		for _, s := range r.senders {
			var lastErr call
			for _, c := range s.calls {
				if c.ended.Before(f.injected) || c.began.After(until) {
					continue
				}
				if c.began.Before(f.fixed) {
					ff.slowest = max(ff.slowest, c.took())
				}
				if c.code != codes.OK {
					ff.errors++
					lastErr = c
				}
				if c.code == codes.DeadlineExceeded && c.began.After(f.injected.Add(breakerGrace)) && c.ended.Before(f.fixed) {
					ff.waited++
				}
			}
			// Failing until the next fault or the end is as slow a
			// recovery as can be told.
			back := next.Sub(f.fixed)
			for _, c := range s.calls {
				if c.code == codes.OK && c.ended.After(f.fixed) && c.ended.After(lastErr.ended) && c.began.Before(next) {
					back = c.ended.Sub(f.fixed)
					break
				}
			}
			if (lastErr.code != codes.OK || back < next.Sub(f.fixed)) && back > ff.everySender {
				ff.everySender = back
				ff.lastSender = fmt.Sprintf("a sender of %s: its last error %v, sent %v after the fix and answered in %v",
					r.streams[s.stream].name, lastErr.code, lastErr.began.Sub(f.fixed).Round(time.Millisecond), lastErr.took().Round(time.Millisecond))
			}
			for _, c := range s.calls {
				if c.code == codes.OK && c.ended.After(f.fixed) {
					if first.IsZero() || c.ended.Before(first) {
						first = c.ended
					}
					break
				}
			}
		}
		if !first.IsZero() {
			ff.firstDecision = first.Sub(f.fixed)
		}
		r.perFault = append(r.perFault, ff)
	}

	for si, st := range r.streams {
		if st.limit == 0 {
			continue
		}
		type window struct{ sent, admitted, errors, ambiguous uint64 }
		windows := map[int64]*window{}
		at := func(sec int64) *window {
			w := windows[sec]
			if w == nil {
				w = &window{}
				windows[sec] = w
			}
			return w
		}
		for _, s := range r.senders {
			if s.stream != si {
				continue
			}
			for _, c := range s.calls {
				from, to := c.began.Unix(), c.ended.Unix()
				switch {
				case from != to:
					at(from).ambiguous++
					at(to).ambiguous++
				case c.code != codes.OK:
					at(from).errors++
				default:
					w := at(from)
					w.sent++
					if !c.over {
						w.admitted++
					}
				}
			}
		}
		acc := streamAccuracy{name: st.name}
		secs := make([]int64, 0, len(windows))
		for sec := range windows {
			secs = append(secs, sec)
		}
		slices.Sort(secs)
		for _, sec := range secs {
			w := windows[sec]
			start := time.Unix(sec, 0)
			want := min(w.sent, st.limit)
			switch {
			case start.Before(r.began):
				// Shared with the warm-up, whose hits are not counted here.
				acc.partial++
			case r.during(start, start.Add(time.Second)):
				acc.inFault++
				acc.admittedInFault += int(w.admitted)
				acc.limitedInFault += int(want)
			case w.errors > 0:
				// Still recovering: the breaker not closed yet.
				acc.failed++
			case w.ambiguous > 0:
				acc.ambiguous++
			default:
				acc.checked++
				if w.admitted == want {
					acc.exact++
				} else {
					acc.mismatches = append(acc.mismatches, fmt.Sprintf("window at %v: %d admitted of %d sent, limit %d",
						start.Sub(r.began).Round(time.Second), w.admitted, w.sent, st.limit))
				}
			}
		}
		r.accuracy = append(r.accuracy, acc)
	}
}

// problems lists what the run shows wrong; none means it passed.
func (r *report) problems() []string {
	var ps []string
	for _, marker := range []string{"panic:", "fatal error:", "DATA RACE"} {
		if strings.Contains(r.stderr, marker) {
			ps = append(ps, fmt.Sprintf("the service's stderr holds %q:\n%s", marker, r.stderr))
		}
	}
	for _, f := range r.faults {
		if f.err != nil {
			ps = append(ps, fmt.Sprintf("fault %v: %v", f.kind, f.err))
		}
	}
	if n := len(r.outside); n > 0 {
		ps = append(ps, fmt.Sprintf("%d errors outside the faults: %s", n, strings.Join(r.outside[:min(n, 5)], "; ")))
	}
	if r.slowest > r.cfg.budget+answerMargin {
		ps = append(ps, fmt.Sprintf("slowest answer %v (%v at %v), over the budget %v + %v", r.slowest, r.slowestCall.code,
			r.slowestCall.began.Sub(r.began).Round(time.Millisecond), r.cfg.budget, answerMargin))
	}
	for i, ff := range r.perFault {
		if ff.everySender > recoverBound {
			ps = append(ps, fmt.Sprintf("fault %d (%v): every sender decided again only %v after the fix (%s)", i+1, r.faults[i].kind, ff.everySender, ff.lastSender))
		}
		if ff.waited > 0 {
			ps = append(ps, fmt.Sprintf("fault %d (%v): %d requests sent after the breaker had opened waited for their budget", i+1, r.faults[i].kind, ff.waited))
		}
		if ff.errors == 0 {
			// Not a problem of the service, but of the run: the fault
			// did not reach it.
			ps = append(ps, fmt.Sprintf("fault %d (%v): no error; the fault did not reach the service", i+1, r.faults[i].kind))
		}
	}
	checked := 0
	for _, a := range r.accuracy {
		checked += a.checked
		for _, m := range a.mismatches {
			ps = append(ps, fmt.Sprintf("%s: %s", a.name, m))
		}
	}
	if checked == 0 {
		ps = append(ps, "no window checked for accuracy")
	}
	if r.after.goroutines > r.before.goroutines+goroutineSlack {
		ps = append(ps, fmt.Sprintf("goroutines %d at the start, %d at the end", r.before.goroutines, r.after.goroutines))
	}
	// Redis connections are files too, bounded on their own below: a
	// fault can leave more of them idle in the pool than the start had.
	if r.after.files-r.after.conns > r.before.files-r.before.conns+fileSlack {
		ps = append(ps, fmt.Sprintf("open files other than Redis connections %d at the start, %d at the end",
			r.before.files-r.before.conns, r.after.files-r.after.conns))
	}
	if r.after.conns > redisPoolSize+2 {
		ps = append(ps, fmt.Sprintf("Redis connections %d at the start, %d at the end (pool %d)", r.before.conns, r.after.conns, redisPoolSize))
	}
	return ps
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// format writes the report as text.
func (r *report) format() string {
	var b strings.Builder
	elapsed := r.ended.Sub(r.began)
	fmt.Fprintf(&b, "soak: %v on one Redis through a fault proxy, REQUEST_TIMEOUT %v, REDIS_TIMEOUT %v; %d faults (every %v, %v each); load average %s at the start, %s at the end\n",
		elapsed.Round(time.Second), r.cfg.budget, storeTimeout, len(r.faults), r.cfg.faultEvery, r.cfg.faultLength, r.loadBefore, r.loadAfter)
	fmt.Fprintf(&b, "requests     %d (%.0f/s): %d decisions (%d OVER_LIMIT), %d errors\n",
		r.calls, float64(r.calls)/elapsed.Seconds(), r.decisions, r.over, r.calls-r.decisions)
	var codeList []string
	for c, n := range r.errs {
		codeList = append(codeList, fmt.Sprintf("%v %d", c, n))
	}
	slices.Sort(codeList)
	fmt.Fprintf(&b, "errors       %s; outside the faults (and %v of recovery after each): %d\n",
		orNone(strings.Join(codeList, ", ")), recoverBound, len(r.outside))
	fmt.Fprintf(&b, "latency      p50 %s, p99 %s, slowest %s (%v); outside the faults p50 %s, p99 %s\n",
		ms(r.p50), ms(r.p99), ms(r.slowest), r.slowestCall.code, ms(r.cleanP50), ms(r.cleanP99))
	fmt.Fprintf(&b, "service      RSS %.1f MB -> %.1f MB, goroutines %d -> %d, open files %d -> %d, Redis connections %d -> %d\n",
		float64(r.before.rssBytes)/1e6, float64(r.after.rssBytes)/1e6, r.before.goroutines, r.after.goroutines,
		r.before.files, r.after.files, r.before.conns, r.after.conns)
	for i, f := range r.faults {
		ff := r.perFault[i]
		fmt.Fprintf(&b, "fault %d      %v at %v for %v: %d errors (%d waited for the budget %v in), slowest answer %s; first decision %s after the fix, every sender %s\n",
			i+1, f.kind, f.injected.Sub(r.began).Round(time.Second), f.fixed.Sub(f.injected).Round(10*time.Millisecond),
			ff.errors, ff.waited, breakerGrace, ms(ff.slowest), ms(ff.firstDecision), ms(ff.everySender))
	}
	for _, a := range r.accuracy {
		fmt.Fprintf(&b, "accuracy     %-28s %d windows checked, %d exact; left out: %d in faults (admitted %d, min(sent, limit) %d), %d with errors after a fix, %d with a request across two windows\n",
			a.name, a.checked, a.exact, a.inFault, a.admittedInFault, a.limitedInFault, a.failed, a.ambiguous)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
