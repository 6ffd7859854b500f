package gctune

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

const mib = 1 << 20

func TestPercent(t *testing.T) {
	tests := []struct {
		name     string
		live     uint64
		headroom uint64
		base     int
		want     int
	}{
		{name: "tiny_heap_uses_4MiB_floor", live: 100 << 10, headroom: 64 * mib, base: 100, want: 1600},
		{name: "tiny_heap_capped", live: 1 * mib, headroom: 1 << 30, base: 100, want: maxPercent},
		{name: "small_heap", live: 8 * mib, headroom: 64 * mib, base: 100, want: 800},
		{name: "large_heap_gets_base", live: 170 * mib, headroom: 64 * mib, base: 100, want: 100},
		{name: "boundary_equals_base", live: 64 * mib, headroom: 64 * mib, base: 100, want: 100},
		{name: "just_below_boundary", live: 64*mib - 1, headroom: 64 * mib, base: 100, want: 100},
		{name: "live_zero", live: 0, headroom: 64 * mib, base: 100, want: 1600},
		{name: "live_zero_capped", live: 0, headroom: 1 << 40, base: 100, want: maxPercent},
		{name: "base_above_computed", live: 16 * mib, headroom: 64 * mib, base: 500, want: 500},
		{name: "base_above_cap", live: 0, headroom: 1 << 40, base: 20000, want: 20000},
		{name: "huge_headroom_no_overflow", live: 1, headroom: math.MaxUint64, base: 100, want: maxPercent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percent(tt.live, tt.headroom, tt.base); got != tt.want {
				t.Errorf("Percent(%d, %d, %d) = %d, want %d", tt.live, tt.headroom, tt.base, got, tt.want)
			}
		})
	}
}

// gcPercent reads the GC percent without changing it.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(int64(s[0].Value.Uint64()))
}

// setBase sets the GC percent for one test and restores it afterwards.
func setBase(t *testing.T, p int) {
	t.Helper()
	old := debug.SetGCPercent(p)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// waitTunes runs GCs until n more tuning passes have run, or fails after a
// bounded deadline.
func waitTunes(t *testing.T, n int64) {
	t.Helper()
	want := tunes.Load() + n
	// Between GCs, WaitFor's pause lets the cleanup goroutine run.
	harness.WaitFor(t, 5*time.Second, fmt.Sprintf("tunes reaching %d", want), func() bool {
		if tunes.Load() >= want {
			return true
		}
		runtime.GC()
		return false
	})
}

func TestStartTunesAndStopRestores(t *testing.T) {
	t.Setenv("GOGC", "")
	setBase(t, 120)

	stop := Start(64 * mib)
	t.Cleanup(stop)
	waitTunes(t, 3) // the sentinel chain re-arms after every GC
	if got := gcPercent(); got <= 120 {
		t.Fatalf("GC percent = %d while tuning a small heap, want > 120", got)
	}

	stop()
	if got := debug.SetGCPercent(120); got != 120 {
		t.Fatalf("GC percent after stop = %d, want 120", got)
	}
	runtime.GC() // a cleanup still in flight must not re-tune
	runtime.GC()
	if got := gcPercent(); got != 120 {
		t.Fatalf("GC percent after stop and GC = %d, want 120", got)
	}

	debug.SetGCPercent(130)
	stop() // idempotent: must not restore again
	if got := gcPercent(); got != 130 {
		t.Fatalf("GC percent after second stop = %d, want 130", got)
	}
}

func TestStartTwiceStopsEarlier(t *testing.T) {
	t.Setenv("GOGC", "")
	setBase(t, 120)

	stop1 := Start(64 * mib)
	t.Cleanup(stop1)
	stop2 := Start(64 * mib)
	t.Cleanup(stop2)
	stop1() // no-op: the second Start already stopped the first tuner
	if got := gcPercent(); got <= 120 {
		t.Fatalf("GC percent after stopping the replaced tuner = %d, want > 120", got)
	}
	stop2()
	if got := gcPercent(); got != 120 {
		t.Fatalf("GC percent after stop = %d, want 120", got)
	}
}

func TestStartNoop(t *testing.T) {
	tests := []struct {
		name     string
		gogc     string
		base     int
		headroom uint64
	}{
		{name: "gogc_set", gogc: "100", base: 120, headroom: 64 * mib},
		{name: "zero_headroom", base: 120, headroom: 0},
		{name: "gc_off", base: -1, headroom: 64 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GOGC", tt.gogc)
			setBase(t, tt.base)
			stop := Start(tt.headroom)
			t.Cleanup(stop)
			if got := gcPercent(); got != tt.base {
				t.Fatalf("GC percent after Start = %d, want %d", got, tt.base)
			}
			runtime.GC()
			stop()
			if got := gcPercent(); got != tt.base {
				t.Fatalf("GC percent after stop = %d, want %d", got, tt.base)
			}
		})
	}
}
