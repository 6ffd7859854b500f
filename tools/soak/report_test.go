package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// TestAnalyse feeds the report calls whose verdicts are known: the soak's
// checks must catch an over-admitting window and an error outside the
// faults, and leave out what they cannot judge.
func TestAnalyse(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0) // on a second
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(ms int, over bool) call { return call{began: at(ms), ended: at(ms + 2), over: over} }
	fail := func(ms int, code codes.Code) call { return call{began: at(ms), ended: at(ms + 2), code: code} }

	r := &report{
		cfg:     defaultConfig(),
		streams: []stream{{name: "hot", limit: 2}, {name: "background"}},
		began:   t0,
		ended:   at(20_000),
		// One fault from 4.5 s to 6 s: errors count as its own until 8 s.
		faults: []fault{{kind: faultKill, injected: at(4_500), fixed: at(6_000)}},
		senders: []*sender{
			{stream: 0, calls: []call{
				ok(100, false), ok(200, false), ok(300, true), // second 0: exact
				ok(1100, false), ok(1200, false), ok(1300, false), // second 1: one too many
				ok(2100, false),                                   // second 2: under the limit, exact
				{began: at(3990), ended: at(4010)},                // across seconds 3 and 4 (4 is in the fault)
				ok(5100, false), ok(5200, false), ok(5300, false), // in the fault: left out
				fail(5500, codes.Unavailable),
				fail(5600, codes.DeadlineExceeded), // 1.1 s into the fault: waited for its budget
				fail(6100, codes.Unavailable),      // after the fix: second 6 left out
				ok(6300, false),
				ok(7100, false), ok(7200, false), ok(7300, true), // second 7: exact
			}},
			{stream: 1, calls: []call{
				ok(100, false),
				fail(5400, codes.Unavailable),
				ok(6500, false),                      // decides again 502 ms after the fix
				fail(12_000, codes.DeadlineExceeded), // outside any fault
				ok(12_100, false),
			}},
		},
	}
	r.analyse()

	if r.calls != 23 || r.decisions != 18 || r.over != 2 {
		t.Errorf("calls %d, decisions %d, over %d; want 23, 18, 2", r.calls, r.decisions, r.over)
	}
	if len(r.outside) != 1 || !strings.HasPrefix(r.outside[0], "DeadlineExceeded at 12s after 2ms") {
		t.Errorf("errors outside the faults = %q, want the one at 12 s", r.outside)
	}
	a := r.accuracy[0]
	if a.checked != 4 || a.exact != 3 || a.inFault != 2 || a.failed != 1 || a.ambiguous != 1 || len(a.mismatches) != 1 {
		t.Errorf("accuracy = %+v; want 4 windows checked, 3 exact, 2 in the fault, 1 with errors, 1 ambiguous, 1 mismatch", a)
	}
	if len(a.mismatches) == 1 && !strings.Contains(a.mismatches[0], "3 admitted of 3 sent, limit 2") {
		t.Errorf("mismatch = %q, want second 1's", a.mismatches[0])
	}
	ff := r.perFault[0]
	if ff.errors != 4 || ff.waited != 1 || ff.firstDecision != 302*time.Millisecond || ff.everySender != 502*time.Millisecond {
		t.Errorf("fault figures = %+v; want 4 errors, 1 waiting for its budget, first decision 302ms, every sender 502ms", ff)
	}
	problems := strings.Join(r.problems(), "\n")
	for _, want := range []string{"limit 2", "1 errors outside the faults", "waited for their budget"} {
		if !strings.Contains(problems, want) {
			t.Errorf("problems() = %q, want one with %q", problems, want)
		}
	}
}
