package stats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Packet sizes. 1432 bytes of UDP payload fit an Ethernet MTU of 1500 with
// the IP and UDP headers, so that no datagram is fragmented (gostats and
// datadog-go use the same figure); over TCP, writes of up to 64 KiB, as
// gostats buffers them.
const (
	udpPacketBytes = 1432
	tcpPacketBytes = 64 << 10
	// maxLineBytes bounds one line: a longer one (a statistic named after
	// a huge request value) is dropped rather than sent; a line between
	// the packet size and this goes in a packet of its own.
	maxLineBytes = 16 << 10
)

// Network timeouts of a flush; a flush also stops at its context's end.
const (
	statsdDialTimeout  = 1500 * time.Millisecond
	statsdWriteTimeout = time.Second
)

// statsdLogEvery is the least time between two log lines about failed
// flushes; the ones in between are counted in the next line. USE_STATSD
// is on by default, as in the anchor, so a service run with no statsd
// fails every flush: one line at the first, then one every ten minutes,
// rather than the anchor's line every three seconds.
const statsdLogEvery = 10 * time.Minute

// StatsdConfig says where a Statsd sends the statistics, how often and in
// which dialect.
type StatsdConfig struct {
	// Addr is the statsd server, host:port. The host is resolved again at
	// each connection, so a server that moves is followed.
	Addr string
	// Network is udp, tcp, or either with 4 or 6 (STATSD_PROTOCOL); empty means udp.
	Network string
	// Interval is the time between two flushes; 0 means 10 s.
	Interval time.Duration
	// DogStatsD writes tags as DogStatsD tags (name:1|c|#key:value)
	// instead of gostats's name suffixes (name.__key=value:1|c), and
	// applies Mogrifiers.
	DogStatsD bool
	// Tags go on every statistic (EXTRA_TAGS). Values have '.', ':' and
	// '|' replaced by '_', as gostats does.
	Tags []Label
	// Mogrifiers rewrite names into a name and tags, with DogStatsD only;
	// the first that matches a name applies.
	Mogrifiers []Mogrifier
	// Log receives flush failures: the first, then at most one line
	// every ten minutes; nil discards them.
	Log *slog.Logger
	// Quiet logs those failures at info level instead of warn: for a
	// statsd nobody asked for (statistics go to statsd by default, as in
	// the anchor), so that a service run with no statsd around is not
	// noisy at the default level.
	Quiet bool
}

// Statsd sends a Registry's statistics to a statsd server at each interval,
// as gostats does for the anchor: counters as the increase since the last
// flush (counters that did not move are not sent), gauges as their value,
// timers and histograms as one line per bucket that moved since the last
// flush, with a sample rate that stands for its count (see Histogram).
// Lines are batched into packets of at most 1432 bytes over UDP.
//
// Nothing here runs on the request path: requests only add to counters;
// Run reads them on its own goroutine, and a slow or missing statsd server
// delays only the flush. The work and memory of a flush are bounded by the
// number of statistics, which the registry bounds (STATS_MAX_DYNAMIC_KEYS):
// one packet buffer, and for each statistic its encoded name and its last
// value.
//
// A flush that fails is lost, as with gostats: the next one sends what
// changed after it. Methods are safe for concurrent use.
type Statsd struct {
	reg    *Registry
	cfg    StatsdConfig
	packet int
	log    *slog.Logger

	// mu serialises flushes and guards the fields below.
	mu sync.Mutex
	// conn is the TCP connection kept between flushes; nil when none.
	conn net.Conn
	last map[*metric]uint64
	// hists holds, per timer or histogram, the bucket counts sent last.
	hists map[*metric]*[timerBuckets]uint64
	names map[*metric]encodedName
	// forgotten is the registry's count of removals at the last flush:
	// when it moved, the state of removed statistics is dropped.
	forgotten uint64
	buf       []byte
	// failed counts failed flushes since the last log line at logged.
	failed int
	logged time.Time
}

// encodedName is a statistic's name as written on the wire: the part
// before the value, and the DogStatsD tag section after the type.
type encodedName struct {
	head, tail string
}

// NewStatsd returns a Statsd that sends reg to cfg.Addr. It does not
// connect yet; Run flushes at each interval, and Flush once.
func NewStatsd(reg *Registry, cfg StatsdConfig) *Statsd {
	cfg.Network = cmp.Or(cfg.Network, "udp")
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	cfg.Tags = sortedTags(cfg.Tags)
	s := &Statsd{
		reg:    reg,
		cfg:    cfg,
		packet: udpPacketBytes,
		log:    cmp.Or(cfg.Log, slog.New(slog.DiscardHandler)),
		last:   map[*metric]uint64{},
		hists:  map[*metric]*[timerBuckets]uint64{},
		names:  map[*metric]encodedName{},
	}
	if s.tcp() {
		s.packet = tcpPacketBytes
	}
	s.buf = make([]byte, 0, s.packet)
	return s
}

// tcp reports whether the statsd server is reached over TCP (tcp, tcp4
// or tcp6): one connection kept, packets of tcpPacketBytes.
func (s *Statsd) tcp() bool { return strings.HasPrefix(s.cfg.Network, "tcp") }

// Run flushes at each interval until ctx is done. It does not flush at the
// end: the server calls Flush once the requests in flight have finished.
func (s *Statsd) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A flush may take the write timeout even when the interval
			// is shorter: a process starved of CPU for longer than a
			// 100 ms interval would otherwise drop every datagram of the
			// flush to an expired deadline. The ticker drops the ticks a
			// long flush covers.
			fctx, cancel := context.WithTimeout(ctx, max(s.cfg.Interval, statsdWriteTimeout))
			s.report(s.Flush(fctx))
			cancel()
		}
	}
}

// report logs a failed flush, at most once per statsdLogEvery.
func (s *Statsd) report(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	s.failed++
	now := time.Now()
	if now.Sub(s.logged) < statsdLogEvery {
		s.mu.Unlock()
		return
	}
	n := s.failed
	s.failed, s.logged = 0, now
	s.mu.Unlock()
	level := slog.LevelWarn
	if s.cfg.Quiet {
		level = slog.LevelInfo
	}
	s.log.Log(context.Background(), level, "statistics not sent to statsd; set USE_STATSD=false if no statsd is meant to run",
		"addr", s.cfg.Addr, "protocol", s.cfg.Network, "err", err, "failed_flushes", n)
}

// Flush sends what changed since the last flush now. It returns the first
// error met; a packet that could not be sent does not stop the others
// over UDP, while over TCP the rest of the flush is dropped with the
// connection.
func (s *Statsd) Flush(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	conn, err := s.connect(ctx)
	if err != nil {
		// Counters still move their baseline, so that the next flush
		// sends only what follows, as gostats does.
		s.collect(func([]byte) {})
		return err
	}
	if !s.tcp() {
		defer conn.Close()
	}
	var errs []error
	w := &packetWriter{s: s, ctx: ctx, conn: conn, errs: &errs}
	s.collect(w.line)
	w.send()
	if len(errs) > 0 && s.tcp() {
		s.closeConn()
	}
	return errors.Join(errs...)
}

// Close closes the connection to the statsd server, if one is open.
func (s *Statsd) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeConn()
	return nil
}

func (s *Statsd) closeConn() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
}

// connect returns the connection to write to: over TCP the one kept, or a
// new one; over UDP a new socket for each flush, so that the host name is
// resolved again and an ICMP error left by an earlier datagram does not
// fail this one.
func (s *Statsd) connect(ctx context.Context) (net.Conn, error) {
	if s.conn != nil {
		return s.conn, nil
	}
	dctx, cancel := context.WithTimeout(ctx, statsdDialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, s.cfg.Network, s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("stats: statsd: %w", err)
	}
	if s.tcp() {
		s.conn = conn
	}
	return conn, nil
}

// packetWriter batches lines into packets of at most s.packet bytes.
type packetWriter struct {
	s    *Statsd
	ctx  context.Context
	conn net.Conn
	errs *[]error
	// dead is set once a TCP write failed: the stream is lost.
	dead bool
}

func (w *packetWriter) line(l []byte) {
	s := w.s
	switch {
	case len(l) > maxLineBytes:
		*w.errs = append(*w.errs, fmt.Errorf("stats: statsd: a line of %d bytes dropped (over %d)", len(l), maxLineBytes))
		return
	case len(s.buf)+len(l) > s.packet:
		w.send()
	}
	if len(l) > s.packet {
		w.write(l)
		return
	}
	s.buf = append(s.buf, l...)
}

// send writes the packet buffered, if any.
func (w *packetWriter) send() {
	if len(w.s.buf) > 0 {
		w.write(w.s.buf)
		w.s.buf = w.s.buf[:0]
	}
}

func (w *packetWriter) write(p []byte) {
	if w.dead {
		return
	}
	deadline := time.Now().Add(statsdWriteTimeout)
	if d, ok := w.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = w.conn.SetWriteDeadline(deadline)
	if _, err := w.conn.Write(p); err != nil {
		*w.errs = append(*w.errs, fmt.Errorf("stats: statsd: %w", err))
		w.dead = w.s.tcp()
	}
}

// prune drops the state of statistics no longer registered.
func prune[V any](state map[*metric]V, reg *Registry) {
	for m := range state {
		if !reg.current(m) {
			delete(state, m)
		}
	}
}

// collect calls emit with each line to send. The slice is reused.
func (s *Statsd) collect(emit func([]byte)) {
	if f := s.reg.forgotten.Load(); f != s.forgotten {
		s.forgotten = f
		prune(s.last, s.reg)
		prune(s.hists, s.reg)
		prune(s.names, s.reg)
	}
	var line []byte
	s.reg.metrics.Range(func(_, v any) bool {
		m := v.(*metric)
		switch {
		case m.counter != nil || m.fn != nil:
			cur := m.value()
			prev := s.last[m]
			s.last[m] = cur
			if cur == prev {
				return true
			}
			delta := cur - prev
			if cur < prev {
				// Kept elsewhere and started again (a store that was
				// replaced): count from zero.
				delta = cur
			}
			n := s.name(m)
			line = append(append(line[:0], n.head...), ':')
			line = strconv.AppendUint(line, delta, 10)
			line = append(append(append(line, "|c"...), n.tail...), '\n')
			emit(line)
		case m.gauge != nil || m.gaugeFn != nil:
			g := m.gaugeValue()
			if g < 0 {
				// A signed gauge is a relative change in statsd: a gauge
				// below zero is sent as zero.
				g = 0
			}
			n := s.name(m)
			line = append(append(line[:0], n.head...), ':')
			line = strconv.AppendInt(line, g, 10)
			line = append(append(append(line, "|g"...), n.tail...), '\n')
			emit(line)
		case m.timer != nil || m.hist != nil:
			s.collectHistogram(m, &line, emit)
		}
		return true
	})
}

// collectHistogram emits a line for each bucket of a timer or histogram
// that counted something since the last flush: the bucket's midpoint, in
// milliseconds for a timer (|ms) and as is for other values (|h), with
// the sample rate that makes the line stand for its count.
func (s *Statsd) collectHistogram(m *metric, line *[]byte, emit func([]byte)) {
	h, durations := m.histogram()
	last := s.hists[m]
	if last == nil {
		last = new([timerBuckets]uint64)
		s.hists[m] = last
	}
	var n encodedName
	for i := range h.buckets {
		cur := h.buckets[i].Load()
		if cur == last[i] {
			continue
		}
		count := cur - last[i]
		last[i] = cur
		if n.head == "" {
			n = s.name(m)
		}
		l := append(append((*line)[:0], n.head...), ':')
		if durations {
			l = appendMillis(l, bucketMid(i))
			l = append(l, "|ms"...)
		} else {
			l = strconv.AppendUint(l, bucketMid(i), 10)
			l = append(l, "|h"...)
		}
		if count > 1 {
			l = append(l, "|@"...)
			l = appendRate(l, count)
		}
		l = append(append(l, n.tail...), '\n')
		*line = l
		emit(l)
	}
}

// histogram returns a timer's or a histogram's buckets, and whether they
// count durations in nanoseconds.
func (m *metric) histogram() (h *Histogram, durations bool) {
	if m.timer != nil {
		return &m.timer.h, true
	}
	return m.hist, false
}

// value is a counter's value.
func (m *metric) value() uint64 {
	if m.counter != nil {
		return m.counter.Value()
	}
	return m.fn()
}

// gaugeValue is a gauge's value.
func (m *metric) gaugeValue() int64 {
	if m.gauge != nil {
		return m.gauge.Value()
	}
	return m.gaugeFn()
}

// appendMillis appends a duration of ns nanoseconds in milliseconds, the
// unit of statsd timers, with up to six decimals and no trailing zeros.
func appendMillis(b []byte, ns uint64) []byte {
	b = strconv.AppendUint(b, ns/1e6, 10)
	frac := ns % 1e6
	if frac == 0 {
		return b
	}
	digits := 6
	for frac%10 == 0 {
		frac /= 10
		digits--
	}
	b = append(b, '.')
	s := strconv.FormatUint(frac, 10)
	for range digits - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// appendRate appends the sample rate that makes one line stand for count
// durations: 1/count, as a decimal that a receiver turns back into count.
// statsd_exporter repeats a timing int(1/rate) times, Datadog and statsd
// weigh it by 1/rate; the float nearest to 1/count can make 1/rate a hair
// below count, which int() would turn into count-1, so the rate is lowered
// by the least step that keeps 1/rate at or above count.
func appendRate(b []byte, count uint64) []byte {
	c := float64(count)
	r := 1 / c
	for 1/r < c {
		r = math.Nextafter(r, 0)
	}
	return strconv.AppendFloat(b, r, 'f', -1, 64)
}

// name returns m's name as written on the wire, encoding it on first use.
func (s *Statsd) name(m *metric) encodedName {
	if n, ok := s.names[m]; ok {
		return n
	}
	n := s.encode(m)
	s.names[m] = n
	return n
}

// encode writes m's name for the wire. The name is first made the anchor's
// (see anchorName); then, with DogStatsD, the first mogrifier that matches
// rewrites it into a name and tags. Last, every character that a statsd
// or DogStatsD parser would read as syntax is replaced (see wireName,
// wireTag), so that no value in a name can end a line, start a metric or a
// tag, or be read as a tag section by a receiver such as statsd_exporter.
func (s *Statsd) encode(m *metric) encodedName {
	name := anchorName(m.name)
	tags := mergeTags(s.cfg.Tags, m.tags)
	if !s.cfg.DogStatsD {
		var b strings.Builder
		b.WriteString(wireName(name))
		for _, t := range tags {
			b.WriteString(".__")
			b.WriteString(wireName(t.Name))
			b.WriteByte('=')
			b.WriteString(wireName(gostatsTagValue(t.Value)))
		}
		return encodedName{head: b.String()}
	}
	for i := range tags {
		tags[i].Value = gostatsTagValue(tags[i].Value)
	}
	for i := range s.cfg.Mogrifiers {
		if n, mt, ok := s.cfg.Mogrifiers[i].apply(name); ok {
			name = n
			tags = append(tags, mt...)
			break
		}
	}
	if len(tags) == 0 {
		return encodedName{head: wireName(name)}
	}
	var b strings.Builder
	b.WriteString("|#")
	for i, t := range tags {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(wireTag(t.Name, true))
		b.WriteByte(':')
		b.WriteString(wireTag(t.Value, false))
	}
	return encodedName{head: wireName(name), tail: b.String()}
}

// mergeTags returns the extra tags and a statistic's own tags sorted by
// name, the statistic's winning on the same name, as gostats merges a
// scope's tags with a counter's. Tags with an empty name or value are
// dropped, as gostats drops them.
func mergeTags(extra, own []Label) []Label {
	if len(own) == 0 && len(extra) == 0 {
		return nil
	}
	out := make([]Label, 0, len(extra)+len(own))
	for _, t := range extra {
		if !slices.ContainsFunc(own, func(o Label) bool { return o.Name == t.Name }) {
			out = append(out, t)
		}
	}
	out = append(out, own...)
	out = slices.DeleteFunc(out, func(t Label) bool { return t.Name == "" || t.Value == "" })
	slices.SortStableFunc(out, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// gostatsTagValue replaces '.', ':' and '|' by '_', as gostats does to
// every tag value (so "1.2.3" is sent as "1_2_3", by the anchor too).
func gostatsTagValue(v string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', ':', '|':
			return '_'
		}
		return r
	}, v)
}

// wireName replaces by '_' each byte of a name that a receiver would read
// as syntax: ':' (the value follows), '|' (the type follows), line breaks
// and other control characters (a new line), ',' '#' '[' ']' (the InfluxDB,
// Librato and SignalFx tag sections that statsd_exporter parses by default),
// and each byte of invalid UTF-8 (statsd_exporter drops such a line).
func wireName(s string) string { return wireClean(s, ":|,#[]") }

// wireTag replaces what would break a DogStatsD tag: ',' and '|' and
// control characters in any part, and ':' in a tag's name.
func wireTag(s string, name bool) string {
	if name {
		return wireClean(s, ":|,#")
	}
	return wireClean(s, "|,#")
}

func wireClean(s, bad string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c >= utf8.RuneSelf || strings.IndexByte(bad, c) >= 0 {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, '_')
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
			continue
		}
		if c < 0x20 || c == 0x7f || strings.IndexByte(bad, c) >= 0 {
			c = '_'
		}
		b = append(b, c)
		i++
	}
	return string(b)
}

// Mogrifier rewrites a statistic's name into another name and tags for
// DogStatsD, as the anchor's USE_DOG_STATSD_MOGRIFIERS do: when Pattern
// matches the name, the statistic is sent as Name with Tags, where $0 is
// the whole match and $1, $2... its groups. A $n beyond the groups is left
// as written, as in the anchor.
type Mogrifier struct {
	Pattern *regexp.Regexp
	Name    string
	Tags    []Label
}

// dollar matches a reference to a group.
var dollar = regexp.MustCompile(`\$\d+`)

func (m *Mogrifier) apply(name string) (string, []Label, bool) {
	if m.Pattern == nil {
		return "", nil, false
	}
	groups := m.Pattern.FindStringSubmatch(name)
	if groups == nil {
		return "", nil, false
	}
	expand := func(tmpl string) string {
		return dollar.ReplaceAllStringFunc(tmpl, func(ref string) string {
			i, err := strconv.Atoi(ref[1:])
			if err != nil || i >= len(groups) {
				return ref
			}
			return groups[i]
		})
	}
	tags := make([]Label, len(m.Tags))
	for i, t := range m.Tags {
		tags[i] = Label{Name: t.Name, Value: expand(t.Value)}
	}
	return expand(m.Name), tags, true
}
