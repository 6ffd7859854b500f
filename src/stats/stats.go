// Package stats holds the service's counters under envoyproxy/ratelimit's
// statistic names and writes them as text (the debug port's /stats) and in
// the Prometheus exposition format. The registry is passed in, never global;
// the package knows nothing of requests, rules or stores.
//
// Names may carry what a client sent (a detailed_metric rule puts request
// values in its statistics), so nothing here trusts a name: per-rule
// counters are registered with their structure (domain and key levels),
// from which the Prometheus series is built without parsing, so that no two
// counters can become the same series; text output escapes control
// characters, so that a value cannot start a line of its own; and counters
// saturate instead of wrapping.
package stats

import (
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Counter is a monotonically increasing count that stops at the largest
// uint64 instead of wrapping. It is safe for concurrent use; the zero value
// is a counter at 0.
type Counter struct {
	v atomic.Uint64
}

// Add adds n to the counter, saturating at math.MaxUint64.
func (c *Counter) Add(n uint64) {
	if n == 0 {
		return
	}
	c.add(n)
}

// add adds n and returns the new value.
func (c *Counter) add(n uint64) uint64 {
	for {
		old := c.v.Load()
		v := old + n
		if v < old {
			v = math.MaxUint64
		}
		if v == old || c.v.CompareAndSwap(old, v) {
			return v
		}
	}
}

// Inc adds one.
func (c *Counter) Inc() { c.add(1) }

// IncValue adds one and returns the new value, for a caller that acts on
// every n-th event.
func (c *Counter) IncValue() uint64 { return c.add(1) }

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

// Label is a name and a value attached to a statistic: one Prometheus
// label of a series, or one statsd tag.
type Label struct{ Name, Value string }

// metric is one registered name: its value source and its Prometheus form.
type metric struct {
	counter *Counter
	gauge   *Gauge
	fn      func() uint64 // a counter kept elsewhere
	gaugeFn func() int64  // a gauge kept elsewhere
	timer   *Timer        // durations
	hist    *Histogram    // other values (Registry.Histogram)
	// bounds are the Prometheus buckets of hist; nil for a timer, which
	// has the latency buckets.
	bounds []float64

	// name is the statistic's name without its tags; tags are the fixed
	// tags the code gave it (see CounterFunc), sorted by name.
	name string
	tags []Label

	// promName and labels are the Prometheus series; labels nil means the
	// name is mapped by promName at export time (names chosen by the code).
	promName string
	labels   []Label

	// key is the name the registry holds it under (see Forget).
	key string
}

// Registry is a set of named counters, gauges and functions read at export
// time. Lookups of existing names take no lock. The zero value is not
// usable; call NewRegistry.
type Registry struct {
	metrics sync.Map // name -> *metric

	// mu serialises the creation and removal of metrics, so that a name
	// is registered once with one Prometheus form.
	mu sync.Mutex
	// forgotten counts Forget's removals, so that exporters that keep
	// state per metric know when to drop theirs.
	forgotten atomic.Uint64
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

// load returns the metric called name, creating it with mk on first use.
func (r *Registry) load(name string, mk func() *metric) *metric {
	if m, ok := r.metrics.Load(name); ok {
		return m.(*metric)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.metrics.Load(name); ok {
		return m.(*metric)
	}
	m := mk()
	m.key = name
	r.metrics.Store(name, m)
	return m
}

// Forget removes the statistic called name from the registry and from
// every export (/stats, statsd, Prometheus), so that statistics of rules,
// domains and request values that are gone do not pile up. Whoever still
// holds its counter counts into nothing; a later Counter or RuleCounter of
// the name starts a new one from zero (an exporter sees a counter reset).
func (r *Registry) Forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.metrics.LoadAndDelete(name); ok {
		r.forgotten.Add(1)
	}
}

// ForgetTagged is Forget for a TaggedCounter's name and tags.
func (r *Registry) ForgetTagged(name string, tags ...Label) {
	tags = sortedTags(tags)
	r.Forget(taggedName(name, tags))
}

// TaggedValue is the value of the counter of a TaggedCounter's name and
// tags, and false when none is registered; it registers none.
func (r *Registry) TaggedValue(name string, tags ...Label) (uint64, bool) {
	tags = sortedTags(tags)
	v, ok := r.metrics.Load(taggedName(name, tags))
	if !ok || v.(*metric).counter == nil {
		return 0, false
	}
	return v.(*metric).counter.Value(), true
}

// current reports whether m is still the statistic registered under its
// name.
func (r *Registry) current(m *metric) bool {
	v, ok := r.metrics.Load(m.key)
	return ok && v.(*metric) == m
}

// orNew returns p, or, when the name was registered as another kind of
// statistic (p is nil), a new one that is not exported.
func orNew[T any](p *T) *T {
	if p == nil {
		return new(T)
	}
	return p
}

// Counter returns the counter called name, creating it on first use. Use it
// for names the code chooses; names built from rules or requests go through
// RuleCounter. If name was registered as something else, Counter returns a
// counter that is not exported, so that a clash never breaks the export.
func (r *Registry) Counter(name string) *Counter {
	return orNew(r.load(name, func() *metric { return &metric{counter: new(Counter), name: name} }).counter)
}

// Gauge returns the gauge called name, creating it on first use.
func (r *Registry) Gauge(name string) *Gauge {
	return orNew(r.load(name, func() *metric { return &metric{gauge: new(Gauge), name: name} }).gauge)
}

// Timer returns the timer called name, creating it on first use. Timers
// go to statsd and Prometheus; /stats leaves them out.
func (r *Registry) Timer(name string) *Timer {
	return orNew(r.load(name, func() *metric { return &metric{timer: new(Timer), name: name} }).timer)
}

// Histogram returns the histogram of values (not durations: see Timer)
// called name, creating it on first use with bounds, the upper bounds of
// its Prometheus buckets in increasing order. Like timers, histograms go
// to statsd and Prometheus, not to /stats.
func (r *Registry) Histogram(name string, bounds []float64) *Histogram {
	return orNew(r.load(name, func() *metric { return &metric{hist: new(Histogram), bounds: slices.Clone(bounds), name: name} }).hist)
}

// sortedTags returns a copy of tags sorted by name, the order a tagged
// name lists them in.
func sortedTags(tags []Label) []Label {
	return slices.SortedFunc(slices.Values(tags), func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
}

// TaggedCounter returns the counter called name with tags, creating it on
// first use: named and exported as CounterFunc's (name.__tag=value in
// /stats and statsd, labels in Prometheus). The tags' values must come
// from a bounded set (the code's, or the rules'), never from a request.
func (r *Registry) TaggedCounter(name string, tags ...Label) *Counter {
	tags = sortedTags(tags)
	return orNew(r.load(taggedName(name, tags), func() *metric { return &metric{counter: new(Counter), name: name, tags: tags} }).counter)
}

// CounterFunc registers a counter whose value f returns at export time,
// for counts kept elsewhere (a store's round trips, say). Tags, if any,
// tell apart counters of one name, as the anchor's memcache statistics
// carry a "code" tag: the registered name is then gostats's form of a
// tagged name, name.__tag=value for each tag sorted by tag name, which is
// what /stats and plain statsd show; DogStatsD sends them as tags and
// Prometheus as labels. A second registration of the same name and tags
// is ignored.
func (r *Registry) CounterFunc(name string, f func() uint64, tags ...Label) {
	tags = sortedTags(tags)
	r.load(taggedName(name, tags), func() *metric { return &metric{fn: f, name: name, tags: tags} })
}

// GaugeFunc registers a gauge whose value f returns at export time (the keys
// a store holds, say). A second registration of the same name is ignored.
func (r *Registry) GaugeFunc(name string, f func() int64) {
	r.load(name, func() *metric { return &metric{gaugeFn: f, name: name} })
}

// taggedName is gostats's name of a statistic with tags: the name, then
// ".__tag=value" for each tag in order.
func taggedName(name string, tags []Label) string {
	if len(tags) == 0 {
		return name
	}
	var b strings.Builder
	b.WriteString(name)
	for _, t := range tags {
		b.WriteString(".__")
		b.WriteString(t.Name)
		b.WriteByte('=')
		b.WriteString(t.Value)
	}
	return b.String()
}

// RulePrefix starts the name of every per-rule statistic.
const RulePrefix = "ratelimit.service.rate_limit."

// RuleCounter returns the counter of one per-rule statistic (total_hits,
// over_limit, ...) of the rule at levels in domain, creating it on first use.
// Its text name is envoyproxy/ratelimit's,
//
//	ratelimit.service.rate_limit.<domain>.<level1>.<level2>....<stat>
//
// and its Prometheus series is ratelimit_service_rate_limit_<stat> with the
// labels domain, key1, key2, ... one per level, as the anchor's default
// statsd-exporter mapping names them for one and two levels. The series
// comes from the levels as given, never from parsing the name, so values
// holding dots or other characters cannot move a level or merge two series.
// Two calls whose text names are equal share one counter.
func (r *Registry) RuleCounter(domain string, levels []string, stat string) *Counter {
	name := RuleName(domain, levels, stat)
	return orNew(r.load(name, func() *metric {
		labels := make([]Label, 0, 1+len(levels))
		labels = append(labels, Label{"domain", domain})
		for i, l := range levels {
			labels = append(labels, Label{"key" + strconv.Itoa(i+1), l})
		}
		return &metric{counter: new(Counter), name: name, promName: "ratelimit_service_rate_limit_" + promSafe(stat), labels: labels}
	}).counter)
}

// RuleName is the text name of a per-rule statistic (see RuleCounter).
func RuleName(domain string, levels []string, stat string) string {
	n := len(RulePrefix) + len(domain) + len(stat) + 1
	for _, l := range levels {
		n += len(l) + 1
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(RulePrefix)
	b.WriteString(domain)
	for _, l := range levels {
		b.WriteByte('.')
		b.WriteString(l)
	}
	b.WriteByte('.')
	b.WriteString(stat)
	return b.String()
}

// Snapshot returns the current value of every counter (counter functions
// included) by name. Gauges are in Gauges.
func (r *Registry) Snapshot() map[string]uint64 {
	out := map[string]uint64{}
	r.metrics.Range(func(k, v any) bool {
		m := v.(*metric)
		switch {
		case m.counter != nil:
			out[k.(string)] = m.counter.Value()
		case m.fn != nil:
			out[k.(string)] = m.fn()
		}
		return true
	})
	return out
}

// Gauges returns the current value of every gauge by name.
func (r *Registry) Gauges() map[string]int64 {
	out := map[string]int64{}
	r.metrics.Range(func(k, v any) bool {
		m := v.(*metric)
		switch {
		case m.gauge != nil:
			out[k.(string)] = m.gauge.Value()
		case m.gaugeFn != nil:
			out[k.(string)] = m.gaugeFn()
		}
		return true
	})
	return out
}

// WriteText writes "name: value" lines sorted by name, the format of
// envoyproxy/ratelimit's /stats debug endpoint. Control characters,
// backslashes and invalid UTF-8 in a name are escaped as in a Go string
// literal (a newline becomes `\n`), so every statistic is exactly one line.
func (r *Registry) WriteText(w io.Writer) error {
	type line struct {
		name string
		text string
	}
	var lines []line
	for n, v := range r.Snapshot() {
		lines = append(lines, line{n, strconv.FormatUint(v, 10)})
	}
	for n, v := range r.Gauges() {
		lines = append(lines, line{n, strconv.FormatInt(v, 10)})
	}
	slices.SortFunc(lines, func(a, b line) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(EscapeText(l.name))
		b.WriteString(": ")
		b.WriteString(l.text)
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// EscapeText returns s with backslashes, control characters and invalid
// UTF-8 escaped as in a Go string literal (without the quotes); s is
// returned as is when it needs nothing, which is the common case.
func EscapeText(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c == '\\' || c >= utf8.RuneSelf {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	q := strconv.Quote(s)
	q = q[1 : len(q)-1]
	// Quote escapes the double quote too; names may hold it as is.
	return strings.ReplaceAll(q, `\"`, `"`)
}
