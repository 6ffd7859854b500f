// Package gctune raises the garbage collector's GC percent while the live heap
// is small, so that a process with a few MiB of live data does not collect
// many times per second. After every GC it sets the percent so that the next
// heap goal leaves at least a fixed headroom above the live heap, and never
// goes below the percent that was in effect when tuning started. A memory
// limit (GOMEMLIMIT or debug.SetMemoryLimit) still applies on top.
//
// The package knows nothing about the service: it reads runtime/metrics and,
// as the one exception to "only settings reads the environment", GOGC, so that
// an operator's explicit choice always wins.
package gctune

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

const (
	// maxPercent caps the GC percent. With a 4 MiB floor (see minHeap) it is
	// reached only for a headroom of 400 MiB or more.
	maxPercent = 10000

	// minHeap is the runtime's minimum heap goal at GC percent 100
	// (defaultHeapMinimum). The runtime scales it by percent/100, so without
	// this floor a tiny live heap would get a goal far above live+headroom:
	// at percent 10000 the goal is never below 400 MiB.
	minHeap = 4 << 20
)

var (
	// mu guards active, samples and every SetGCPercent call made here.
	mu     sync.Mutex
	active *tuner
	// samples is read once per GC; reusing it keeps tuning allocation-free
	// apart from the next sentinel.
	samples = []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
		{Name: "/gc/gogc:percent"},
	}

	// tunes counts tuning passes run after a GC; tests watch it.
	tunes atomic.Int64
)

type tuner struct {
	headroom uint64
	base     int // percent in effect at Start, restored by stop
	last     int // percent last set, for hysteresis
}

// sentinel is collected by the next GC, which runs its cleanup. Its pointer
// field keeps it out of the tiny allocator, whose batched objects may never
// have their cleanups run.
type sentinel struct{ _ *byte }

// Start begins tuning the GC percent after every GC so that the next heap goal
// is at least the live heap plus headroom bytes; see Percent for the rule.
// It returns a stop function that ends tuning and restores the GC percent that
// was in effect when Start was called; stop is idempotent and safe to call
// from any goroutine.
//
// Start does nothing and returns a no-op stop if headroom is 0, if the GOGC
// environment variable is set (the operator chose the percent), or if the GC
// is off (percent < 0). Only one tuner runs per process: calling Start while
// another tuner is running first stops that tuner, as its stop would, and
// makes its stop a no-op.
func Start(headroom uint64) (stop func()) {
	noop := func() {}
	if headroom == 0 || os.Getenv("GOGC") != "" {
		return noop
	}
	mu.Lock()
	defer mu.Unlock()
	if active != nil {
		active.stopLocked()
	}
	metrics.Read(samples)
	base := int(int64(samples[3].Value.Uint64())) // -1 means off
	if base < 0 {
		return noop
	}
	t := &tuner{headroom: headroom, base: base, last: base}
	active = t
	t.tuneLocked()
	arm(t)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if active == t {
			t.stopLocked()
		}
	}
}

// Percent returns the GC percent for live bytes of live memory, where live is
// what the runtime's GC percent applies to: the live heap plus scannable
// stacks and globals. The result is headroom*100/max(live, 4 MiB), capped at
// 10000, and never below base. The 4 MiB floor matches the runtime's minimum
// heap goal, which also grows with the percent.
func Percent(live, headroom uint64, base int) int {
	p := min(float64(headroom)*100/float64(max(live, minHeap)), maxPercent)
	return max(base, int(p))
}

// arm allocates a sentinel whose cleanup tunes after the next GC.
func arm(t *tuner) { runtime.AddCleanup(&sentinel{}, onGC, t) }

func onGC(t *tuner) {
	mu.Lock()
	defer mu.Unlock()
	if active != t {
		return // stopped: let the chain end
	}
	tunes.Add(1)
	t.tuneLocked()
	arm(t)
}

func (t *tuner) tuneLocked() {
	metrics.Read(samples)
	live := samples[0].Value.Uint64() + samples[1].Value.Uint64() + samples[2].Value.Uint64()
	p := Percent(live, t.headroom, t.base)
	// Skip changes under 5% to avoid churn.
	if math.Abs(float64(p-t.last))*20 > float64(t.last) {
		debug.SetGCPercent(p)
		t.last = p
	}
}

func (t *tuner) stopLocked() {
	active = nil
	debug.SetGCPercent(t.base)
}
