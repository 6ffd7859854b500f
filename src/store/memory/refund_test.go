package memory

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestRefundMakesNoKey: a refund of a key the store does not hold has
// nothing to give back, and leaves no key behind.
func TestRefundMakesNoKey(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		s := newStore(t, Config{SweepInterval: -1})
		o := op(a, "never_hit_"+a.String(), 5, time.Minute, 3)
		o.Refund = true
		rs, err := do(t, s, base, o)
		if err != nil || !rs[0].Allowed || rs[0].After != 0 || rs[0].Remaining != 5 {
			t.Errorf("%s: refund of a key never hit = %+v, %v; want allowed, empty", a, rs[0], err)
		}
		if s.Len() != 0 || s.Bytes() != 0 {
			t.Errorf("%s: after a refund of a key never hit the store holds %d keys, %d bytes; want none", a, s.Len(), s.Bytes())
		}
		checkStore(t, s)
	}
}

// TestRefundReachesRecords: a key over its limit kept as a compact record
// (see Store) is given its refund, and is an entry again.
func TestRefundReachesRecords(t *testing.T) {
	t.Parallel()
	for _, a := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket} {
		s := newStore(t, Config{MaxBytes: -1, SweepInterval: -1})
		o := op(a, "spent_key_of_some_length_"+a.String(), 5, time.Hour, 5)
		do(t, s, base, o)
		compactAll(s)
		if s.Records() != 1 {
			t.Fatalf("%s: %d records, want the spent key compacted", a, s.Records())
		}
		o.Hits, o.Refund = 2, true
		if rs, err := do(t, s, base, o); err != nil || rs[0].After != 3 || rs[0].Remaining != 2 {
			t.Errorf("%s: refund of 2 of a record of 5 = %+v, %v; want 3 in use, 2 left", a, rs[0], err)
		}
		if s.Records() != 0 || s.Len() != 1 {
			t.Errorf("%s: %d records of %d keys after the refund, want the record an entry again", a, s.Records(), s.Len())
		}
		o.Hits, o.Refund = 0, false
		if rs, _ := do(t, s, base, o); rs[0].After != 3 {
			t.Errorf("%s: the refund was not kept: %+v", a, rs[0])
		}
		checkStore(t, s)
	}
}
