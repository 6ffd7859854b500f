package stats

import (
	"math"
	"runtime"
	"sync"
	"time"
)

// memStatsMaxAge is how long one reading of the Go runtime's memory
// statistics serves: runtime.ReadMemStats stops the world briefly, and an
// export reads a dozen of them at once.
const memStatsMaxAge = time.Second

// GoRuntime registers the Go runtime's statistics under prefix with
// gostats's names and kinds, as the anchor registers them under
// "ratelimit.go": the gauges alloc, sys, heapAlloc, heapSys, heapIdle,
// heapInuse, heapReleased, heapObjects, nextGC, lastGC, gcCPUPercent and
// numGoroutine, and the counters totalAlloc, mallocs, frees, pauseTotalNs
// and numGC. (gostats also declares a "lookups" counter it never sets, and
// never sets "sys", which it therefore sends as 0; here sys is the real
// figure.)
func (r *Registry) GoRuntime(prefix string) {
	var (
		mu   sync.Mutex
		ms   runtime.MemStats
		read time.Time
	)
	// get returns one field of a reading at most memStatsMaxAge old.
	get := func(f func(*runtime.MemStats) uint64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(read) >= memStatsMaxAge {
			runtime.ReadMemStats(&ms)
			read = now
		}
		return f(&ms)
	}
	gauge := func(name string, f func(*runtime.MemStats) uint64) {
		r.GaugeFunc(prefix+"."+name, func() int64 { return clampInt64(get(f)) })
	}
	counter := func(name string, f func(*runtime.MemStats) uint64) {
		r.CounterFunc(prefix+"."+name, func() uint64 { return get(f) })
	}
	gauge("alloc", func(m *runtime.MemStats) uint64 { return m.Alloc })
	counter("totalAlloc", func(m *runtime.MemStats) uint64 { return m.TotalAlloc })
	gauge("sys", func(m *runtime.MemStats) uint64 { return m.Sys })
	counter("mallocs", func(m *runtime.MemStats) uint64 { return m.Mallocs })
	counter("frees", func(m *runtime.MemStats) uint64 { return m.Frees })
	gauge("heapAlloc", func(m *runtime.MemStats) uint64 { return m.HeapAlloc })
	gauge("heapSys", func(m *runtime.MemStats) uint64 { return m.HeapSys })
	gauge("heapIdle", func(m *runtime.MemStats) uint64 { return m.HeapIdle })
	gauge("heapInuse", func(m *runtime.MemStats) uint64 { return m.HeapInuse })
	gauge("heapReleased", func(m *runtime.MemStats) uint64 { return m.HeapReleased })
	gauge("heapObjects", func(m *runtime.MemStats) uint64 { return m.HeapObjects })
	gauge("nextGC", func(m *runtime.MemStats) uint64 { return m.NextGC })
	gauge("lastGC", func(m *runtime.MemStats) uint64 { return m.LastGC })
	counter("pauseTotalNs", func(m *runtime.MemStats) uint64 { return m.PauseTotalNs })
	counter("numGC", func(m *runtime.MemStats) uint64 { return uint64(m.NumGC) })
	gauge("gcCPUPercent", func(m *runtime.MemStats) uint64 { return uint64(m.GCCPUFraction * 100) })
	r.GaugeFunc(prefix+".numGoroutine", func() int64 { return int64(runtime.NumGoroutine()) })
}

// clampInt64 is v, or the largest int64 when v is larger.
func clampInt64(v uint64) int64 { return int64(min(v, math.MaxInt64)) }
