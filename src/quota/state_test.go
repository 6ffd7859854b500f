package quota

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestRestoreResumes drives a pool with random joins, reports (some
// received a little before the call), leaves, reconnects and ticks, and
// at random steps hands it over: a pool restored from its state must
// answer every later step exactly as the original does, and write the
// same state. A replica that takes a pool over therefore grants what the
// previous owner would have, every lease and held decrease included.
func TestRestoreResumes(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 3))
		l := Limit{Rate: 1 + rng.Float64()*200, Burst: 1 + rng.Float64()*100, Equal: seed%5 == 0}
		cfg := Config{Start: epoch.Add(-time.Hour)}
		if seed%2 == 0 {
			cfg.Start = epoch // in its learning period
		}
		orig := NewPool(l, cfg)
		var copy *Pool
		now := epoch
		next := uint64(1)
		var live []uint64
		handovers := 0
		for step := range 2000 {
			now = now.Add(time.Duration(rng.IntN(700)) * time.Millisecond)
			var op func(p *Pool) []Change
			switch k := rng.IntN(10); {
			case k == 0 || len(live) == 0:
				id := next
				next++
				live = append(live, id)
				op = func(p *Pool) []Change { return p.Report(now, id, Usage{Allowed: 1}) }
			case k == 1:
				i := rng.IntN(len(live))
				id := live[i]
				live = append(live[:i], live[i+1:]...)
				op = func(p *Pool) []Change { return p.Leave(now, id) }
			case k == 2:
				id := next
				next++
				live = append(live, id)
				u := Usage{Allowed: uint64(rng.IntN(1000)), Denied: uint64(rng.IntN(1000)), Elapsed: time.Duration(1+rng.IntN(6)) * time.Second}
				op = func(p *Pool) []Change { return p.Report(now, id, u) }
			case k == 3 && rng.IntN(4) == 0:
				// A replica dies: its subscribers go, and reconnects
				// (case 2) end their leases early.
				r := uint64(rng.IntN(3))
				op = func(p *Pool) []Change { return p.LeaveIf(now, func(id uint64) bool { return id%3 == r }) }
			case k < 6:
				op = func(p *Pool) []Change { return p.Tick(now) }
			default:
				id := live[rng.IntN(len(live))]
				u := Usage{Allowed: uint64(rng.IntN(500)), Denied: uint64(rng.IntN(500)), Elapsed: 5 * time.Second,
					At: now.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond)}
				op = func(p *Pool) []Change { return p.Report(now, id, u) }
			}
			if copy == nil || rng.IntN(50) == 0 {
				var err error
				copy, err = RestorePool(l, cfg, orig.AppendState(nil))
				if err != nil {
					t.Fatalf("seed %d step %d: RestorePool: %v", seed, step, err)
				}
				handovers++
			}
			want, got := op(orig), op(copy)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d: restored pool answered %+v, the original %+v", seed, step, got, want)
			}
			if a, b := orig.AppendState(nil), copy.AppendState(nil); !bytes.Equal(a, b) {
				t.Fatalf("seed %d step %d: the states differ after the same step", seed, step)
			}
		}
		if handovers < 20 {
			t.Fatalf("seed %d: only %d handovers", seed, handovers)
		}
	}
}

// TestRestoreKeepsLearning: the learning period is the pool's, not the
// reader's: a pool written in its learning period is still learning when
// another replica, started long before, reads it.
func TestRestoreKeepsLearning(t *testing.T) {
	t.Parallel()
	p := NewPool(Limit{Rate: 100, Burst: 100}, Config{Start: epoch})
	p.Report(epoch, 1, Usage{Allowed: 20, Elapsed: 4 * time.Second})
	r, err := RestorePool(Limit{Rate: 100, Burst: 100}, Config{Start: epoch.Add(-time.Hour)}, p.AppendState(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.Tick(epoch.Add(time.Second))
	for _, s := range r.Subscribers(epoch.Add(time.Second)) {
		if s.Rate > 4 {
			t.Errorf("restored pool granted %v/s while learning, above the 4/s seen", s.Rate)
		}
	}
}

func TestRestoreRefusesBadStates(t *testing.T) {
	t.Parallel()
	p := NewPool(Limit{Rate: 10, Burst: 5}, Config{Start: epoch})
	p.Report(epoch, 1, Usage{Allowed: 1})
	p.Report(epoch, 2, Usage{Allowed: 1})
	good := p.AppendState(nil)
	tests := []struct {
		name string
		give []byte
	}{
		{"empty", nil},
		{"other_version", append([]byte{2}, good[1:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing_bytes", append(append([]byte(nil), good...), 0)},
		{"too_many_subscribers", []byte{stateVersion, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"overlong_varint", []byte{stateVersion, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := RestorePool(Limit{Rate: 10, Burst: 5}, Config{}, tt.give); !errors.Is(err, ErrBadState) {
				t.Errorf("RestorePool(%x) = %v, want ErrBadState", tt.give, err)
			}
		})
	}
}

// FuzzRestorePool: no state panics the reader, and one it accepts is
// written back as it was read.
func FuzzRestorePool(f *testing.F) {
	p := NewPool(Limit{Rate: 10, Burst: 5}, Config{Start: epoch})
	f.Add(p.AppendState(nil))
	p.Report(epoch, 1, Usage{Allowed: 1})
	p.Report(epoch.Add(time.Second), 2, Usage{Allowed: 3, Elapsed: 2 * time.Second})
	p.Leave(epoch.Add(2*time.Second), 1)
	f.Add(p.AppendState(nil))
	f.Fuzz(func(t *testing.T, state []byte) {
		r, err := RestorePool(Limit{Rate: 10, Burst: 5}, Config{}, state)
		if err != nil {
			return
		}
		if again := r.AppendState(nil); !bytes.Equal(again, state) {
			// Times are written as nanoseconds: a state read back is
			// written the same, but for a varint that was not minimal.
			if r2, err := RestorePool(Limit{Rate: 10, Burst: 5}, Config{}, again); err != nil || !bytes.Equal(r2.AppendState(nil), again) {
				t.Fatalf("a state read back is written differently: %x, then %x", state, again)
			}
		}
		r.Tick(epoch.Add(time.Hour))
	})
}
