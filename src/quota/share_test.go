package quota

import (
	"errors"
	"testing"
	"time"
)

// TestHandoverMerge: reports handed over together tell the pool what they
// would have one by one: their counts, measured from the first one's
// predecessor to the last one's receipt; a new bucket's first report
// stays one; a leave is kept.
func TestHandoverMerge(t *testing.T) {
	t.Parallel()
	var h Handover
	h = h.Add(epoch, 10, 5, 5*time.Second)
	h = h.Add(epoch.Add(5*time.Second), 20, 0, 5*time.Second)
	want := Usage{Allowed: 30, Denied: 5, Elapsed: 10 * time.Second, At: epoch.Add(5 * time.Second)}
	if got := h.Usage(); got != want {
		t.Errorf("two reports = %+v, want %+v", got, want)
	}
	var j Handover
	j = j.Add(epoch, 1, 0, 0).Add(epoch.Add(time.Second), 4, 0, 0)
	if got := j.Usage(); got.Elapsed != 0 || got.Allowed != 5 {
		t.Errorf("a new bucket's reports = %+v, want time_elapsed 0 and 5 allowed", got)
	}
	left := Handover{}.Merge(Handover{Left: true})
	if left.Empty() || !h.Merge(left).Left || !left.Merge(h).Left {
		t.Errorf("a leave is lost in a merge: %+v, %+v", h.Merge(left), left.Merge(h))
	}
	got, err := ReadHandover(h.Merge(left).Append(nil))
	if err != nil || got != h.Merge(left) {
		t.Errorf("ReadHandover(Append) = %+v, %v; want %+v", got, err, h.Merge(left))
	}
	g := Issued{At: epoch, Expires: epoch.Add(16 * time.Second), Epoch: 3, Seq: 9,
		Grant: Grant{TokensPerFill: 600, FillInterval: time.Minute + time.Nanosecond, MaxTokens: 4}}
	if got, err := ReadIssued(g.Append(nil)); err != nil || got != g {
		t.Errorf("ReadIssued(Append) = %+v, %v; want %+v", got, err, g)
	}
	for _, bad := range [][]byte{nil, {stateVersion}, {stateVersion, 2}, append(g.Append(nil), 0)} {
		if _, err := ReadIssued(bad); !errors.Is(err, ErrBadState) {
			t.Errorf("ReadIssued(%x) = %v, want ErrBadState", bad, err)
		}
	}
}

// FuzzShareValues: no value read from a store panics its reader, and a
// grant read is one Envoy can use.
func FuzzShareValues(f *testing.F) {
	f.Add(Handover{Reports: 1, Allowed: 3, First: epoch, At: epoch}.Append(nil))
	f.Add(Issued{At: epoch, Grant: Grant{TokensPerFill: 1, FillInterval: time.Second, MaxTokens: 1}}.Append(nil))
	f.Add([]byte{stateVersion, 0, 1, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ReadHandover(b); err != nil && !errors.Is(err, ErrBadState) {
			t.Fatalf("ReadHandover: %v", err)
		}
		g, err := ReadIssued(b)
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("ReadIssued: %v", err)
			}
			return
		}
		if gr := g.Grant; !gr.Abandon && gr.TokensPerFill > 0 && (gr.FillInterval < time.Second || gr.MaxTokens == 0) {
			t.Fatalf("ReadIssued accepted %+v", gr)
		}
	})
}
