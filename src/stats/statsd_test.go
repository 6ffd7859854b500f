package stats

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// udpSink is a statsd server for tests: a real UDP socket on loopback that
// hands over each datagram it receives.
type udpSink struct {
	conn  *net.UDPConn
	grams chan string
}

func newUDPSink(t testing.TB) *udpSink {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadBuffer(4 << 20)
	u := &udpSink{conn: conn, grams: make(chan string, 1<<14)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			u.grams <- string(buf[:n])
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return u
}

func (u *udpSink) addr() string { return u.conn.LocalAddr().String() }

// datagram returns the next datagram, failing the test after a deadline.
func (u *udpSink) datagram(t testing.TB) string {
	t.Helper()
	select {
	case g := <-u.grams:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("no datagram within 10s")
		return ""
	}
}

// lines returns the lines of datagrams until n lines have come.
func (u *udpSink) lines(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		out = append(out, splitLines(t, u.datagram(t))...)
	}
	return out
}

// splitLines splits a datagram into its lines; each must end with '\n'.
func splitLines(t *testing.T, gram string) []string {
	t.Helper()
	if !strings.HasSuffix(gram, "\n") {
		t.Errorf("datagram %q does not end a line", gram)
	}
	return strings.Split(strings.TrimSuffix(gram, "\n"), "\n")
}

func flush(t *testing.T, s *Statsd) {
	t.Helper()
	if err := s.Flush(t.Context()); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func TestStatsdCountersAreDeltas(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	r.Counter("a").Add(5)
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"a:5|c"}) {
		t.Errorf("first flush = %q, want [a:5|c]", got)
	}
	r.Counter("a").Add(3)
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"a:3|c"}) {
		t.Errorf("second flush = %q, want [a:3|c]", got)
	}
	// Nothing moved: nothing is sent, so the next datagram is b's.
	flush(t, s)
	r.Counter("b").Inc()
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"b:1|c"}) {
		t.Errorf("after an idle flush = %q, want [b:1|c]", got)
	}
}

func TestStatsdGauges(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	r.Gauge("g").Set(7)
	r.GaugeFunc("neg", func() int64 { return -3 })
	r.CounterFunc("f", func() uint64 { return 4 })
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	flush(t, s)
	got := u.lines(t, 3)
	slices.Sort(got)
	// A negative gauge would read as a decrement: it is sent as 0.
	if want := []string{"f:4|c", "g:7|g", "neg:0|g"}; !slices.Equal(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
	// Gauges are sent at every flush, as gostats does; f did not move.
	flush(t, s)
	got = u.lines(t, 2)
	slices.Sort(got)
	if want := []string{"g:7|g", "neg:0|g"}; !slices.Equal(got, want) {
		t.Errorf("second flush = %q, want %q", got, want)
	}
}

// timerLine is one timer line as statsd_exporter reads it.
var timerLine = regexp.MustCompile(`^(.+):([0-9.]+)\|ms(?:\|@([0-9.]+))?$`)

// observations returns what statsd_exporter makes of timer lines: the
// value of each line repeated int(1/rate) times (pkg/line's multiplyEvents).
func observations(t *testing.T, lines []string) map[float64]int {
	t.Helper()
	out := map[float64]int{}
	for _, l := range lines {
		m := timerLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q is not a timer line", l)
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		n := 1
		if m[3] != "" {
			rate, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				t.Fatal(err)
			}
			n = int(1 / rate)
		}
		out[v] += n
	}
	return out
}

func TestStatsdTimer(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	tm := r.Timer("ratelimit_server.ShouldRateLimit.response_time")
	for range 1000 {
		tm.Record(250 * time.Microsecond)
	}
	for range 7 {
		tm.Record(3 * time.Millisecond)
	}
	tm.Record(40 * time.Millisecond)
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	flush(t, s)
	lines := u.lines(t, 3)
	for _, l := range lines {
		if !strings.HasPrefix(l, "ratelimit_server.ShouldRateLimit.response_time:") {
			t.Errorf("line %q has another name", l)
		}
	}
	obs := observations(t, lines)
	total := 0
	for v, n := range obs {
		total += n
		var want float64
		switch n {
		case 1000:
			want = 0.25
		case 7:
			want = 3
		case 1:
			want = 40
		default:
			t.Errorf("%d observations of %vms, want 1000, 7 or 1", n, v)
			continue
		}
		if math.Abs(v-want)/want > 1.0/32 {
			t.Errorf("%d observations of %vms, want within 1/32 of %vms", n, v, want)
		}
	}
	if total != 1008 {
		t.Errorf("%d observations in all, want 1008: %q", total, lines)
	}
	// The timer was drained: the next flush sends nothing of it.
	flush(t, s)
	r.Counter("marker").Inc()
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"marker:1|c"}) {
		t.Errorf("after the timer was sent: %q, want [marker:1|c]", got)
	}
}

func TestTimerBuckets(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<41; v = v*9/8 + 1 {
		i := bucketOf(v)
		if i < prev || i >= timerBuckets {
			t.Fatalf("bucketOf(%d) = %d after %d (of %d)", v, i, prev, timerBuckets)
		}
		prev = i
		if v >= 1<<timerMaxBits {
			continue
		}
		mid := float64(bucketMid(i))
		if err := math.Abs(mid-float64(v)) / math.Max(float64(v), 1); err > 1.0/32 {
			t.Errorf("bucketMid(bucketOf(%d)) = %v: %.3f off", v, mid, err)
		}
	}
	if got := bucketOf(math.MaxUint64); got != timerBuckets-1 {
		t.Errorf("bucketOf(max) = %d, want %d", got, timerBuckets-1)
	}
}

func TestAppendRateRoundTrips(t *testing.T) {
	check := func(count uint64) {
		t.Helper()
		s := string(appendRate(nil, count))
		r, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("rate %q: %v", s, err)
		}
		if got := uint64(1 / r); got != count {
			t.Errorf("rate %q for %d stands for %d", s, count, got)
		}
		if strings.ContainsAny(s, "eE") {
			t.Errorf("rate %q for %d has an exponent", s, count)
		}
	}
	for c := uint64(2); c < 200000; c++ {
		check(c)
	}
	for c := uint64(200000); c < 1<<40; c = c*3 + 1 {
		check(c)
	}
}

func TestAppendMillis(t *testing.T) {
	tests := []struct {
		give uint64
		want string
	}{
		{0, "0"}, {1, "0.000001"}, {250_000, "0.25"}, {1_000_000, "1"}, {3_141_592, "3.141592"}, {40_000_010, "40.00001"},
	}
	for _, tt := range tests {
		if got := string(appendMillis(nil, tt.give)); got != tt.want {
			t.Errorf("appendMillis(%d) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

func TestStatsdPacketsAtMostMTU(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	const n = 3000
	want := map[string]bool{}
	for i := range n {
		name := RuleName("web", []string{"path_/api/v1/items/" + strconv.Itoa(i)}, "total_hits")
		r.RuleCounter("web", []string{"path_/api/v1/items/" + strconv.Itoa(i)}, "total_hits").Inc()
		want[name+":1|c"] = true
	}
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	flush(t, s)
	got := 0
	for got < n {
		g := u.datagram(t)
		// 1432: an Ethernet MTU (1500) less the IP and UDP headers.
		if len(g) > 1432 {
			t.Errorf("datagram of %d bytes, over 1432", len(g))
		}
		for _, l := range splitLines(t, g) {
			if !want[l] {
				t.Errorf("unexpected or repeated line %q", l)
			}
			delete(want, l)
			got++
		}
	}
}

// TestStatsdHostileNames: a request value in a statistics key (a
// detailed_metric rule) cannot end the line, add a metric, or open a tag
// section, and a name that is not UTF-8 still makes one valid line.
func TestStatsdHostileNames(t *testing.T) {
	tests := []struct {
		name   string
		dog    bool
		levels []string
		want   string
	}{
		{
			name:   "statsd_line_injection",
			levels: []string{"user_a:1|c\nb"},
			want:   "ratelimit.service.rate_limit.web.user_a_1_c_b.total_hits:1|c",
		},
		{
			name:   "statsd_tag_sections",
			levels: []string{"k_x,evil=1#lib[sfx]"},
			want:   "ratelimit.service.rate_limit.web.k_x_evil=1_lib_sfx_.total_hits:1|c",
		},
		{
			name:   "dogstatsd_injection",
			dog:    true,
			levels: []string{"v|#admin:true\r\nz:9|c"},
			want:   "ratelimit.service.rate_limit.web.v__admin_true__z_9_c.total_hits:1|c",
		},
		{
			name:   "invalid_utf8",
			levels: []string{"k_\xff\xfeé"},
			want:   "ratelimit.service.rate_limit.web.k___é.total_hits:1|c",
		},
		{
			name:   "ipv4_is_one_level",
			levels: []string{"remote_address_10.0.0.1"},
			want:   "ratelimit.service.rate_limit.web.remote_address_10_0_0_1.total_hits:1|c",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUDPSink(t)
			r := NewRegistry()
			r.RuleCounter("web", tt.levels, "total_hits").Inc()
			s := NewStatsd(r, StatsdConfig{Addr: u.addr(), DogStatsD: tt.dog})
			flush(t, s)
			if got := splitLines(t, u.datagram(t)); !slices.Equal(got, []string{tt.want}) {
				t.Errorf("datagram lines = %q, want [%q]", got, tt.want)
			}
		})
	}
}

// TestStatsdOversizedLine: one statistic too long to send is dropped, and
// the others are still sent.
func TestStatsdOversizedLine(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	r.RuleCounter("web", []string{"k_" + strings.Repeat("x", maxLineBytes)}, "total_hits").Inc()
	r.RuleCounter("web", []string{"k_" + strings.Repeat("y", 3000)}, "total_hits").Inc()
	for i := range 50 {
		r.Counter("c" + strconv.Itoa(i)).Inc()
	}
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	if err := s.Flush(t.Context()); err == nil || !strings.Contains(err.Error(), "dropped") {
		t.Errorf("Flush = %v, want an error saying a line was dropped", err)
	}
	lines := u.lines(t, 51)
	if len(lines) != 51 {
		t.Fatalf("%d lines, want 51", len(lines))
	}
	long := 0
	for _, l := range lines {
		if strings.Contains(l, "xxxx") {
			t.Errorf("the oversized line was sent")
		}
		if strings.Contains(l, "yyyy") {
			long++
		}
	}
	if long != 1 {
		t.Errorf("the 3 KB line was sent %d times, want once (in a packet of its own)", long)
	}
}

func TestStatsdTags(t *testing.T) {
	mog := []Mogrifier{
		{
			Pattern: regexp.MustCompile(`^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$`),
			Name:    "custom.foo",
		},
		{
			Pattern: regexp.MustCompile(`^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`),
			Name:    "ratelimit.service.rate_limit.$3",
			Tags:    []Label{{"descriptor", "$2"}, {"domain", "$1"}, {"missing", "$5"}},
		},
	}
	extra := []Label{{"version", "1.2.3"}, {"commit", "abc"}}
	tests := []struct {
		name string
		cfg  StatsdConfig
		want []string
	}{
		{
			name: "statsd",
			cfg:  StatsdConfig{Tags: extra},
			want: []string{
				"ratelimit.memcache.increment.__code=success.__commit=abc.__version=1_2_3:2|c",
				"ratelimit.service.rate_limit.mongo_cps.database_users.total_hits.__commit=abc.__version=1_2_3:3|c",
				"ratelimit.service.rate_limit.mongo_cps.user_a_b.total_hits.__commit=abc.__version=1_2_3:1|c",
			},
		},
		{
			name: "dogstatsd",
			cfg:  StatsdConfig{Tags: extra, DogStatsD: true},
			want: []string{
				"ratelimit.memcache.increment:2|c|#code:success,commit:abc,version:1_2_3",
				"ratelimit.service.rate_limit.mongo_cps.database_users.total_hits:3|c|#commit:abc,version:1_2_3",
				"ratelimit.service.rate_limit.mongo_cps.user_a_b.total_hits:1|c|#commit:abc,version:1_2_3",
			},
		},
		{
			name: "dogstatsd_mogrifiers",
			cfg:  StatsdConfig{Tags: extra, DogStatsD: true, Mogrifiers: mog},
			want: []string{
				"ratelimit.memcache.increment:2|c|#code:success,commit:abc,version:1_2_3",
				"ratelimit.service.rate_limit.total_hits:1|c|#commit:abc,version:1_2_3,descriptor:user_a_b,domain:mongo_cps,missing:$5",
				"ratelimit.service.rate_limit.total_hits:3|c|#commit:abc,version:1_2_3,descriptor:database_users,domain:mongo_cps,missing:$5",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUDPSink(t)
			r := NewRegistry()
			r.RuleCounter("mongo_cps", []string{"database_users"}, "total_hits").Add(3)
			r.RuleCounter("mongo_cps", []string{"user_a,b"}, "total_hits").Add(1)
			r.CounterFunc("ratelimit.memcache.increment", func() uint64 { return 2 }, Label{"code", "success"})
			tt.cfg.Addr = u.addr()
			s := NewStatsd(r, tt.cfg)
			flush(t, s)
			got := u.lines(t, len(tt.want))
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestMogrifierFirstMatchWins(t *testing.T) {
	mog := []Mogrifier{
		{Pattern: regexp.MustCompile(`^a\.(.*)\.foo$`), Name: "custom.foo", Tags: []Label{{"k", "$1"}}},
		{Pattern: regexp.MustCompile(`^a\.(.*)\.(.*)$`), Name: "a.$2"},
	}
	tests := []struct{ give, wantName, wantTags string }{
		{"a.x.foo", "custom.foo", "[{k x}]"},
		{"a.x.bar", "a.bar", "[]"},
		{"b.x.y", "b.x.y", "[]"},
	}
	for _, tt := range tests {
		name, tags := tt.give, []Label{}
		for i := range mog {
			if n, tg, ok := mog[i].apply(tt.give); ok {
				name, tags = n, tg
				break
			}
		}
		if name != tt.wantName || fmtLabels(tags) != tt.wantTags {
			t.Errorf("mogrify(%q) = %q %s, want %q %s", tt.give, name, fmtLabels(tags), tt.wantName, tt.wantTags)
		}
	}
}

func fmtLabels(ls []Label) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = "{" + l.Name + " " + l.Value + "}"
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// TestStatsdTCP: over TCP (tcp, or tcp4 as STATSD_PROTOCOL allows) the
// lines arrive on one connection, and after the server drops it a later
// flush connects again.
func TestStatsdTCP(t *testing.T) {
	for _, network := range []string{"tcp", "tcp4"} {
		t.Run(network, func(t *testing.T) { testStatsdTCP(t, network) })
	}
}

func testStatsdTCP(t *testing.T, network string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	accept := func() net.Conn {
		t.Helper()
		select {
		case c := <-conns:
			t.Cleanup(func() { c.Close() })
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no connection within 10s")
			return nil
		}
	}
	r := NewRegistry()
	s := NewStatsd(r, StatsdConfig{Addr: ln.Addr().String(), Network: network})
	t.Cleanup(func() { s.Close() })
	r.Counter("a").Add(2)
	flush(t, s)
	c1 := accept()
	_ = c1.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c1)
	if l, err := br.ReadString('\n'); err != nil || l != "a:2|c\n" {
		t.Fatalf("first line = %q, %v; want a:2|c", l, err)
	}
	r.Counter("a").Inc()
	flush(t, s)
	if l, err := br.ReadString('\n'); err != nil || l != "a:1|c\n" {
		t.Fatalf("second line = %q, %v; want a:1|c on the same connection", l, err)
	}

	// The server goes away: a write fails sooner or later (the first may
	// still be accepted by the kernel), and a flush after that connects
	// again. Bounded: a TCP reset takes one round trip on loopback.
	c1.Close()
	var c2 net.Conn
	for i := 0; i < 100 && c2 == nil; i++ {
		r.Counter("a").Inc()
		_ = s.Flush(t.Context())
		select {
		case c := <-conns:
			c2 = c
			t.Cleanup(func() { c.Close() })
		case <-time.After(50 * time.Millisecond):
		}
	}
	if c2 == nil {
		t.Fatal("no new connection after the server closed the first")
	}
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if l, err := bufio.NewReader(c2).ReadString('\n'); err != nil || !strings.HasPrefix(l, "a:") {
		t.Errorf("line on the new connection = %q, %v", l, err)
	}
}

// TestStatsdUnreachable: a flush with no server fails, and what it could
// not send is not sent again later (gostats's behaviour): the next flush
// carries only what followed.
func TestStatsdUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := NewRegistry()
	s := NewStatsd(r, StatsdConfig{Addr: addr, Network: "tcp"})
	r.Counter("a").Add(5)
	err = s.Flush(t.Context())
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("Flush = %v, want a dial error", err)
	}

	u := newUDPSink(t)
	s.cfg.Addr, s.cfg.Network = u.addr(), "udp"
	r.Counter("a").Inc()
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"a:1|c"}) {
		t.Errorf("after a failed flush = %q, want [a:1|c]", got)
	}
}

// TestStatsdRun: Run flushes at each interval on its own, also when a
// flush outlasts the interval (a microsecond here, so every flush does; in
// production a process starved of CPU past a 100 ms interval): a flush's
// deadline is the write timeout, not the interval, so its datagrams go out.
func TestStatsdRun(t *testing.T) {
	for _, interval := range []time.Duration{20 * time.Millisecond, time.Microsecond} {
		t.Run(interval.String(), func(t *testing.T) {
			u := newUDPSink(t)
			r := NewRegistry()
			r.Counter("a").Inc()
			s := NewStatsd(r, StatsdConfig{Addr: u.addr(), Interval: interval})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.Run(ctx)
			}()
			if got := u.lines(t, 1); !slices.Equal(got, []string{"a:1|c"}) {
				t.Errorf("lines = %q, want [a:1|c]", got)
			}
			r.Counter("a").Add(2)
			if got := u.lines(t, 1); !slices.Equal(got, []string{"a:2|c"}) {
				t.Errorf("lines = %q, want [a:2|c]", got)
			}
			cancel()
			<-done
		})
	}
}

// TestStatsdLogsFailuresRarely: a service with no statsd fails every
// flush; it says so once, not at each flush.
func TestStatsdLogsFailuresRarely(t *testing.T) {
	var b strings.Builder
	s := NewStatsd(NewRegistry(), StatsdConfig{Addr: "127.0.0.1:1", Log: slog.New(slog.NewTextHandler(&b, nil))})
	for range 5 {
		s.report(errors.New("connection refused"))
	}
	s.report(nil)
	if n := strings.Count(b.String(), "statistics not sent"); n != 1 {
		t.Errorf("%d log lines for 5 failed flushes, want 1:\n%s", n, b.String())
	}
}

// A statsd nobody asked for (the default) that does not answer is logged
// below the default level; one asked for is a warning.
func TestStatsdQuietFailures(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		var b strings.Builder
		s := NewStatsd(NewRegistry(), StatsdConfig{Addr: "127.0.0.1:1", Quiet: quiet, Log: slog.New(slog.NewTextHandler(&b, nil))})
		s.report(errors.New("connection refused"))
		want := "level=WARN"
		if quiet {
			want = "level=INFO"
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("Quiet %v: logged %q, want %s", quiet, b.String(), want)
		}
	}
}

// A histogram of values is sent as statsd histogram lines (|h), not
// timings: statsd_exporter would scale a |ms line to seconds. Like a
// timer, it sends only what moved since the last flush.
func TestStatsdHistogram(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	h := r.Histogram("ratelimit.redis.pipeline_commands", []float64{1, 10})
	h.ObserveN(3, 5)
	h.Observe(40)
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	flush(t, s)
	got := u.lines(t, 2)
	slices.Sort(got)
	// 40 is in the bucket of 40 and 41, sent as its midpoint.
	if want := []string{"ratelimit.redis.pipeline_commands:3|h|@0.2", "ratelimit.redis.pipeline_commands:41|h"}; !slices.Equal(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
	h.Observe(3)
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"ratelimit.redis.pipeline_commands:3|h"}) {
		t.Errorf("second flush = %q, want only the new value", got)
	}
}

// A tagged counter is the same counter at each call, and its tags are
// gostats's name suffixes in statsd.
func TestStatsdTaggedCounter(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	c := r.TaggedCounter("ratelimit.service.decisions", Label{"domain", "web"}, Label{"code", "OK"})
	if r.TaggedCounter("ratelimit.service.decisions", Label{"code", "OK"}, Label{"domain", "web"}) != c {
		t.Error("the same name and tags in another order made another counter")
	}
	c.Add(2)
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"ratelimit.service.decisions.__code=OK.__domain=web:2|c"}) {
		t.Errorf("lines = %q", got)
	}
}

// TestForgetLeavesEveryExport: a forgotten statistic leaves /stats,
// Prometheus and the statsd sink's state; the same name registered again
// starts from zero.
func TestForgetLeavesEveryExport(t *testing.T) {
	u := newUDPSink(t)
	r := NewRegistry()
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	h := r.PrometheusHandler(PrometheusConfig{ScrapeReuse: -1})
	r.RuleCounter("gone", []string{"user"}, "total_hits").Add(5)
	r.TaggedCounter("x.decisions", Label{"domain", "gone"}).Inc()
	flush(t, s)
	u.lines(t, 2)
	gather(t, h)
	if len(s.last) != 2 {
		t.Fatalf("statsd keeps %d statistics, want 2", len(s.last))
	}

	r.Forget(RuleName("gone", []string{"user"}, "total_hits"))
	r.ForgetTagged("x.decisions", Label{"domain", "gone"})
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "gone") {
		t.Errorf("/stats after Forget:\n%s", text.String())
	}
	if mfs := gather(t, h); len(mfs) != 0 {
		t.Errorf("Prometheus after Forget: %v", mfs)
	}
	flush(t, s)
	if len(s.last)+len(s.names) != 0 {
		t.Errorf("statsd keeps the state of %d forgotten statistics", len(s.last))
	}
	r.RuleCounter("gone", []string{"user"}, "total_hits").Inc()
	flush(t, s)
	if got := u.lines(t, 1); !slices.Equal(got, []string{"ratelimit.service.rate_limit.gone.user.total_hits:1|c"}) {
		t.Errorf("after registering again: %q, want a count from zero", got)
	}
}
