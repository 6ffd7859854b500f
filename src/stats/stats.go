// Package stats holds the service's counters under envoyproxy/ratelimit's
// statistic names and writes them as text (the debug port's /stats) and in
// the Prometheus exposition format. The registry is passed in, never global;
// the package knows nothing of requests, rules or stores.
package stats

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Counter is a monotonically increasing count. It is safe for concurrent use.
type Counter struct {
	v atomic.Uint64
}

// Add adds n to the counter.
func (c *Counter) Add(n uint64) {
	if n != 0 {
		c.v.Add(n)
	}
}

// Inc adds one.
func (c *Counter) Inc() { c.v.Add(1) }

// Value returns the current count.
func (c *Counter) Value() uint64 { return c.v.Load() }

// Gauge is a value that goes up and down. It is safe for concurrent use.
type Gauge struct {
	v atomic.Int64
}

// Set sets the gauge.
func (g *Gauge) Set(v int64) { g.v.Store(v) }

// Value returns the gauge's value.
func (g *Gauge) Value() int64 { return g.v.Load() }

// Registry is a set of named counters, gauges and functions read at export
// time. Lookups of existing names take no lock. The zero value is not
// usable; call NewRegistry.
type Registry struct {
	counters sync.Map // name -> *Counter
	gauges   sync.Map // name -> *Gauge

	// mu guards funcs.
	mu    sync.Mutex
	funcs map[string]func() uint64
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{funcs: map[string]func() uint64{}}
}

// Counter returns the counter called name, creating it on first use.
func (r *Registry) Counter(name string) *Counter {
	if c, ok := r.counters.Load(name); ok {
		return c.(*Counter)
	}
	c, _ := r.counters.LoadOrStore(name, new(Counter))
	return c.(*Counter)
}

// Gauge returns the gauge called name, creating it on first use.
func (r *Registry) Gauge(name string) *Gauge {
	if g, ok := r.gauges.Load(name); ok {
		return g.(*Gauge)
	}
	g, _ := r.gauges.LoadOrStore(name, new(Gauge))
	return g.(*Gauge)
}

// CounterFunc registers a counter whose value f returns at export time,
// for counts kept elsewhere (a store's round trips, say).
func (r *Registry) CounterFunc(name string, f func() uint64) {
	r.mu.Lock()
	r.funcs[name] = f
	r.mu.Unlock()
}

// Snapshot returns every metric's current value by name.
func (r *Registry) Snapshot() map[string]int64 {
	out := map[string]int64{}
	r.counters.Range(func(k, v any) bool {
		out[k.(string)] = int64(v.(*Counter).Value())
		return true
	})
	r.gauges.Range(func(k, v any) bool {
		out[k.(string)] = v.(*Gauge).Value()
		return true
	})
	r.mu.Lock()
	for k, f := range r.funcs {
		out[k] = int64(f())
	}
	r.mu.Unlock()
	return out
}

// WriteText writes "name: value" lines sorted by name, the format of
// envoyproxy/ratelimit's /stats debug endpoint.
func (r *Registry) WriteText(w io.Writer) error {
	snap := r.Snapshot()
	names := make([]string, 0, len(snap))
	for n := range snap {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s: %d\n", n, snap[n])
	}
	_, err := io.WriteString(w, b.String())
	return err
}
