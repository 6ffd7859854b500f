package stats

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

// LatencyBuckets are the Prometheus bucket bounds of the timers, in
// seconds: Prometheus's default buckets (which statsd_exporter, and so
// envoyproxy/ratelimit, give ratelimit_service_response_time_seconds),
// and five more below 5 ms, where a rate limiter's decisions are, so that
// percentiles can be read from them.
var LatencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// PrometheusConfig says how a registry is written for Prometheus. The zero
// value writes the names of envoyproxy/ratelimit's default mapping.
type PrometheusConfig struct {
	// Mapper, when not nil, names every series as statsd_exporter names
	// what it receives with this mapping (PROMETHEUS_MAPPER_YAML), as
	// envoyproxy/ratelimit does: see Handler.
	Mapper *Mapper
	// ResponseTimeMillis makes ratelimit_service_response_time_seconds
	// count milliseconds, as envoyproxy/ratelimit did before it fixed the
	// unit (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS). Only without Mapper,
	// as in the anchor.
	ResponseTimeMillis bool
	// Now is the clock of the summaries' windows and of ScrapeReuse; nil
	// means time.Now.
	Now func() time.Time
	// ScrapeReuse is how long a gathered exposition is served again
	// (scrape.go); 0 means the default ScrapeReuse, a negative value
	// gathers at every scrape (tests).
	ScrapeReuse time.Duration
}

// Mapper is a statsd_exporter mapping, loaded from a file.
type Mapper struct {
	m    *mapper.MetricMapper
	path string
}

// LoadMapper reads a statsd_exporter mapping file (its format, as
// PROMETHEUS_MAPPER_YAML is read by envoyproxy/ratelimit). The error
// names the file. Log, when not nil, receives the mapper's warnings (a
// deprecated key); nil discards them.
func LoadMapper(path string, log *slog.Logger) (*Mapper, error) {
	m := &mapper.MetricMapper{Logger: cmp.Or(log, slog.New(slog.DiscardHandler))}
	if err := m.InitFromFile(path); err != nil {
		return nil, fmt.Errorf("stats: statsd_exporter mapping %s: %w", path, err)
	}
	return &Mapper{m: m, path: path}, nil
}

// Handler serves the registry in the Prometheus exposition format with
// the zero PrometheusConfig.
func (r *Registry) Handler() http.Handler { return r.PrometheusHandler(PrometheusConfig{}) }

// PrometheusHandler serves the registry in the Prometheus exposition
// format. Without a mapper, names are those of envoyproxy/ratelimit's
// default statsd-exporter mapping, so dashboards built on the anchor keep
// working:
//
//	per rule (RuleCounter)                     -> ratelimit_service_rate_limit_<stat>{domain=D,key1=K1[,key2=K2...]}
//	ratelimit.service.call.should_rate_limit.E -> ratelimit_service_should_rate_limit_error{err_type=E}
//	ratelimit_server.M.total_requests          -> ratelimit_service_total_requests{grpc_method=M}
//	ratelimit_server.M.response_time (timer)   -> ratelimit_service_response_time_seconds{grpc_method=M} (histogram)
//
// Any other name has the characters a metric name cannot hold replaced by
// underscores (and a timer's gets "_seconds"); the tags of a tagged
// counter (see CounterFunc) are labels. Timers and histograms are
// Prometheus histograms (LatencyBuckets for timers), their buckets
// regrouped from the Histogram's: a value is counted under the first bound
// that its whole fine bucket fits under, so a value up to 6.25 % below a
// bound (a fine bucket's width) may be counted under the next one; never
// under a bound it exceeds.
//
// With cfg.Mapper, every statistic is looked up in the mapping under its
// statsd name (tags apart, which become labels), as statsd_exporter does
// with the anchor's statistics: a match gives the name, labels, help,
// scale, drop action and, for a timer or histogram, the observer type
// (histogram or summary) and its buckets or quantiles; no match keeps the
// statsd name with the characters a metric name cannot hold replaced.
// Timers are in milliseconds, the statsd unit, times the mapping's scale.
// Series that the mapping makes equal are added together, as
// statsd_exporter adds what it receives under one name; a summary's
// quantiles cover the last max_age (10 minutes by default), in steps of
// max_age/age_buckets, and its count and sum all time, as client_golang's
// summaries do.
//
// One bad series never fails the scrape: series are built from the
// registered structure, label values are made valid UTF-8, a series that
// would repeat another (or, with a mapping, one of another kind) is
// dropped, and the handler serves every metric it could gather instead of
// answering 500. Scrapes gather one at a time, at most once per
// ScrapeReuse, and share what they gathered (see scrape.go).
func (r *Registry) PrometheusHandler(cfg PrometheusConfig) http.Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{r: r, cfg: cfg, mapped: map[*metric]*mapping{}, windows: map[string]*window{}, start: cfg.Now()})
	return &scrapeCache{g: reg, now: cfg.Now, reuse: cmp.Or(cfg.ScrapeReuse, ScrapeReuse)}
}

type collector struct {
	r     *Registry
	cfg   PrometheusConfig
	start time.Time

	// mu serialises scrapes and guards the fields below.
	mu sync.Mutex
	// mapped caches cfg.Mapper's answer for each metric; the answers of
	// metrics the registry forgot are dropped when its count of removals
	// (forgotten) moves.
	mapped    map[*metric]*mapping
	forgotten uint64
	// windows are the summaries' sliding windows, by series.
	windows map[string]*window
}

// Describe sends nothing: the metric set changes as rules do, which makes
// this an "unchecked" collector.
func (*collector) Describe(chan<- *prometheus.Desc) {}

// seriesKind is what a series is written as.
type seriesKind uint8

const (
	kindCounter seriesKind = iota
	kindGauge
	kindHistogram
	kindSummary
)

// series is one Prometheus series being gathered.
type series struct {
	name   string
	help   string
	labels []Label
	kind   seriesKind
	value  float64
	// A histogram's or summary's fine buckets, sum (in the histogram's
	// own unit) and factor from that unit to the exported one.
	buckets *[timerBuckets]uint64
	sum     float64
	factor  float64
	bounds  []float64
	// quantiles and the window of a summary.
	quantiles []mapper.MetricObjective
	maxAge    time.Duration
	steps     uint32
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.r.forgotten.Load(); f != c.forgotten {
		c.forgotten = f
		prune(c.mapped, c.r)
	}
	var (
		all   = map[string]*series{}
		order []string
		id    strings.Builder
	)
	c.r.metrics.Range(func(_, v any) bool {
		m := v.(*metric)
		s, ok := c.series(m)
		if !ok {
			return true
		}
		id.Reset()
		id.WriteString(s.name)
		for i := range s.labels {
			s.labels[i].Value = strings.ToValidUTF8(s.labels[i].Value, "\uFFFD")
			id.WriteByte(0)
			id.WriteString(s.labels[i].Name)
			id.WriteByte(0)
			id.WriteString(s.labels[i].Value)
		}
		key := id.String()
		prev, dup := all[key]
		switch {
		case !dup:
			all[key] = s
			order = append(order, key)
		case c.cfg.Mapper != nil:
			prev.merge(s)
		}
		return true
	})
	for _, key := range order {
		if pm := c.metric(key, all[key]); pm != nil {
			ch <- pm
		}
	}
}

// merge adds s to a series of the same name and labels, as statsd_exporter
// adds events of one series: counters and histograms add up; a gauge keeps
// its first value; a series of another kind or unit is dropped.
func (p *series) merge(s *series) {
	if p.kind != s.kind || (p.kind >= kindHistogram && p.factor != s.factor) {
		return
	}
	switch p.kind {
	case kindCounter:
		p.value += s.value
	case kindHistogram, kindSummary:
		for i := range p.buckets {
			p.buckets[i] += s.buckets[i]
		}
		p.sum += s.sum
	}
}

// metric turns a gathered series into a Prometheus metric; nil when it is
// not valid.
func (c *collector) metric(key string, s *series) prometheus.Metric {
	keys := make([]string, len(s.labels))
	vals := make([]string, len(s.labels))
	for i, l := range s.labels {
		keys[i], vals[i] = l.Name, l.Value
	}
	desc := prometheus.NewDesc(s.name, s.help, keys, nil)
	var (
		pm  prometheus.Metric
		err error
	)
	switch s.kind {
	case kindCounter:
		pm, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, s.value, vals...)
	case kindGauge:
		pm, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, s.value, vals...)
	case kindHistogram:
		count, cum := regroup(s.buckets, s.factor, s.bounds)
		pm, err = prometheus.NewConstHistogram(desc, count, s.sum*s.factor, cum, vals...)
	case kindSummary:
		count, q := c.quantiles(key, s)
		pm, err = prometheus.NewConstSummary(desc, count, s.sum*s.factor, q, vals...)
	}
	if err != nil {
		return nil
	}
	return pm
}

// regroup returns the count of fine buckets b and the cumulative counts
// under each bound (in the unit that factor converts to): a fine bucket
// counts under the first bound that its largest value fits under.
func regroup(b *[timerBuckets]uint64, factor float64, bounds []float64) (uint64, map[float64]uint64) {
	cum := make(map[float64]uint64, len(bounds))
	var count uint64
	j := 0
	for i := range b {
		// The last fine bucket also holds every larger value: only +Inf.
		for j < len(bounds) && (i == timerBuckets-1 || !fits(bucketHigh(i), factor, bounds[j])) {
			cum[bounds[j]] = count
			j++
		}
		count += b[i]
	}
	for ; j < len(bounds); j++ {
		cum[bounds[j]] = count
	}
	return count, cum
}

// fits reports whether the value v, times factor, is at most bound, with
// a margin for the rounding of the product (5 ms is 5e6 ns times 1e-9).
func fits(v uint64, factor, bound float64) bool { return float64(v)*factor <= bound*(1+1e-9) }

// quantiles returns a summary's count (all time) and its quantiles over
// its window.
func (c *collector) quantiles(key string, s *series) (uint64, map[float64]float64) {
	now := c.cfg.Now()
	w := c.windows[key]
	if w == nil {
		// Until a first scrape, the window starts with the process.
		w = &window{snaps: []snapshot{{at: c.start, buckets: new([timerBuckets]uint64)}}}
		c.windows[key] = w
	}
	base := w.advance(now, s.buckets, s.maxAge, s.steps)
	var count, inWindow uint64
	for i := range s.buckets {
		count += s.buckets[i]
		inWindow += s.buckets[i] - min(base[i], s.buckets[i])
	}
	q := make(map[float64]float64, len(s.quantiles))
	for _, o := range s.quantiles {
		q[o.Quantile] = math.NaN()
		if inWindow == 0 {
			continue
		}
		rank := uint64(math.Ceil(o.Quantile * float64(inWindow)))
		var seen uint64
		for i := range s.buckets {
			seen += s.buckets[i] - min(base[i], s.buckets[i])
			if seen >= max(rank, 1) {
				q[o.Quantile] = float64(bucketMid(i)) * s.factor
				break
			}
		}
	}
	return count, q
}

// window is a summary's sliding window: snapshots of its cumulative
// buckets, the oldest no older than maxAge, one per maxAge/steps at most.
type window struct {
	snaps []snapshot
}

type snapshot struct {
	at      time.Time
	buckets *[timerBuckets]uint64
}

// advance drops the snapshots older than maxAge, returns the oldest one
// left (the window's start) and keeps cur as a snapshot if the newest is
// older than a step. With none left (no scrape within maxAge), the window
// starts now and is empty.
func (w *window) advance(now time.Time, cur *[timerBuckets]uint64, maxAge time.Duration, steps uint32) *[timerBuckets]uint64 {
	if maxAge <= 0 {
		maxAge = prometheus.DefMaxAge
	}
	steps = cmp.Or(steps, prometheus.DefAgeBuckets)
	i := 0
	for i < len(w.snaps) && now.Sub(w.snaps[i].at) > maxAge {
		i++
	}
	w.snaps = slices.Delete(w.snaps, 0, i)
	base := cur
	if len(w.snaps) > 0 {
		base = w.snaps[0].buckets
	}
	if len(w.snaps) == 0 || now.Sub(w.snaps[len(w.snaps)-1].at) >= maxAge/time.Duration(steps) {
		b := *cur
		w.snaps = append(w.snaps, snapshot{at: now, buckets: &b})
	}
	return base
}

// series returns the series of m; false when m is not exported (dropped
// by the mapping).
func (c *collector) series(m *metric) (*series, bool) {
	if c.cfg.Mapper != nil {
		return c.mappedSeries(m)
	}
	s := &series{name: m.promName, labels: slices.Clone(m.labels)}
	if m.labels == nil {
		s.name, s.labels = promName(m.name)
		if len(m.tags) > 0 {
			s.labels = append(slices.Clip(s.labels), m.tags...)
		}
	}
	if m.timer != nil || m.hist != nil {
		h, durations := m.histogram()
		s.kind, s.buckets, s.factor, s.bounds = kindHistogram, new([timerBuckets]uint64), 1, m.bounds
		h.snapshot(s.buckets)
		s.sum = float64(h.Sum())
		if durations {
			s.factor, s.bounds = 1e-9, LatencyBuckets
			if n, l, ok := responseTime(m.name); ok {
				s.name, s.labels = n, l
				if c.cfg.ResponseTimeMillis {
					s.factor = 1e-6
				}
			} else if !strings.HasSuffix(s.name, "_seconds") {
				s.name += "_seconds"
			}
		}
		return s, true
	}
	s.kind, s.value = m.sample()
	return s, true
}

// sample returns a counter's or gauge's kind and value.
func (m *metric) sample() (seriesKind, float64) {
	switch {
	case m.counter != nil:
		return kindCounter, float64(m.counter.Value())
	case m.fn != nil:
		return kindCounter, float64(m.fn())
	case m.gauge != nil:
		return kindGauge, float64(m.gauge.Value())
	default:
		return kindGauge, float64(m.gaugeFn())
	}
}

// mapping is what a Mapper makes of one statistic.
type mapping struct {
	drop   bool
	name   string
	help   string
	labels []Label
	scale  float64
	// observer is histogram or summary for a timer or histogram.
	observer  mapper.ObserverType
	bounds    []float64
	quantiles []mapper.MetricObjective
	maxAge    time.Duration
	steps     uint32
}

// mappedSeries is m's series under cfg.Mapper.
func (c *collector) mappedSeries(m *metric) (*series, bool) {
	mp := c.mapped[m]
	if mp == nil {
		mp = c.cfg.Mapper.lookup(m)
		c.mapped[m] = mp
	}
	if mp.drop {
		return nil, false
	}
	s := &series{name: mp.name, help: mp.help, labels: slices.Clone(mp.labels), factor: mp.scale}
	if m.timer == nil && m.hist == nil {
		s.kind, s.value = m.sample()
		s.value *= mp.scale
		if s.kind == kindCounter && s.value < 0 {
			return nil, false // a negative scale: statsd_exporter drops these too
		}
		return s, true
	}
	h, durations := m.histogram()
	if durations {
		s.factor *= 1e-6 // nanoseconds to the milliseconds statsd carries
	}
	s.buckets = new([timerBuckets]uint64)
	h.snapshot(s.buckets)
	s.sum = float64(h.Sum())
	s.kind, s.bounds = kindHistogram, mp.bounds
	if mp.observer != mapper.ObserverTypeHistogram {
		s.kind, s.quantiles, s.maxAge, s.steps = kindSummary, mp.quantiles, mp.maxAge, mp.steps
	}
	return s, true
}

// lookup maps one statistic as statsd_exporter's exporter maps an event:
// the statsd name (as the anchor writes it) is looked up for the metric's
// type; the mapping's labels override the statistic's tags unless it
// honours them; no match keeps the escaped statsd name.
func (mp *Mapper) lookup(m *metric) *mapping {
	typ := mapper.MetricTypeCounter
	switch {
	case m.gauge != nil || m.gaugeFn != nil:
		typ = mapper.MetricTypeGauge
	case m.timer != nil || m.hist != nil:
		typ = mapper.MetricTypeObserver
	}
	name := anchorName(m.name)
	mm, labels, present := mp.m.GetMapping(name, typ)
	mm = cmp.Or(mm, &mapper.MetricMapping{})
	out := &mapping{scale: 1, help: mm.HelpText, drop: mm.Action == mapper.ActionTypeDrop}
	if mm.Scale.Set {
		out.scale = mm.Scale.Val
	}
	out.name = escapeName(name)
	ls := map[string]string{}
	for _, t := range m.tags {
		ls[t.Name] = t.Value
	}
	if present {
		out.name = escapeName(mm.Name)
		for k, v := range labels {
			if _, ok := ls[k]; ok && mm.HonorLabels {
				continue
			}
			ls[k] = v
		}
	}
	if out.name == "" {
		out.drop = true
	}
	for k, v := range ls {
		out.labels = append(out.labels, Label{k, v})
	}
	slices.SortFunc(out.labels, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })

	def := mp.m.Defaults
	out.observer = cmp.Or(mm.ObserverType, def.ObserverType)
	out.bounds = def.HistogramOptions.Buckets
	if o := mm.HistogramOptions; o != nil && len(o.Buckets) > 0 {
		out.bounds = o.Buckets
	}
	if len(out.bounds) == 0 {
		out.bounds = prometheus.DefBuckets
	}
	out.bounds = slices.Sorted(slices.Values(out.bounds))
	out.quantiles, out.maxAge, out.steps = def.SummaryOptions.Quantiles, def.SummaryOptions.MaxAge, def.SummaryOptions.AgeBuckets
	if o := mm.SummaryOptions; o != nil {
		if len(o.Quantiles) > 0 {
			out.quantiles = o.Quantiles
		}
		if o.MaxAge > 0 {
			out.maxAge = o.MaxAge
		}
		if o.AgeBuckets > 0 {
			out.steps = o.AgeBuckets
		}
	}
	return out
}

// escapeName is statsd_exporter's escaping of a metric name, on valid
// UTF-8 only: on a byte that is not, its EscapeMetricName slices past the
// rune it skips and panics (v0.30.0), and a request's value can put such
// a byte in a statistic's name.
func escapeName(s string) string {
	return mapper.EscapeMetricName(strings.ToValidUTF8(s, "\uFFFD"))
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

// promSafe replaces the characters a metric name cannot hold.
func promSafe(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

var ruleStats = map[string]bool{
	"total_hits": true, "over_limit": true, "near_limit": true, "within_limit": true,
	"shadow_mode": true, "over_limit_with_local_cache": true, "shadow_over_limit": true,
	"total_negative_hits": true,
}

// promName maps a statsd-style name chosen by the code to a Prometheus name
// and labels. Per-rule statistics are registered with their structure
// instead (RuleCounter); the rule shape is still recognised here for names
// registered with Counter.
func promName(name string) (string, []Label) {
	parts := strings.Split(name, ".")
	switch {
	case len(parts) == 6 || len(parts) == 7:
		if parts[0] == "ratelimit" && parts[1] == "service" && parts[2] == "rate_limit" && ruleStats[parts[len(parts)-1]] {
			labels := []Label{{"domain", parts[3]}, {"key1", parts[4]}}
			if len(parts) == 7 {
				labels = append(labels, Label{"key2", parts[5]})
			}
			return "ratelimit_service_rate_limit_" + parts[len(parts)-1], labels
		}
	case len(parts) == 5 && strings.HasPrefix(name, "ratelimit.service.call.should_rate_limit."):
		return "ratelimit_service_should_rate_limit_error", []Label{{"err_type", parts[4]}}
	case len(parts) == 3 && parts[0] == "ratelimit_server" && parts[2] == "total_requests":
		return "ratelimit_service_total_requests", []Label{{"grpc_method", parts[1]}}
	}
	return promSafe(name), nil
}

// responseTime maps the response-time timer ratelimit_server.M.response_time
// as the anchor's default mapping does.
func responseTime(name string) (string, []Label, bool) {
	parts := strings.Split(name, ".")
	if len(parts) != 3 || parts[0] != "ratelimit_server" || parts[2] != "response_time" {
		return "", nil, false
	}
	return "ratelimit_service_response_time_seconds", []Label{{"grpc_method", parts[1]}}, true
}
