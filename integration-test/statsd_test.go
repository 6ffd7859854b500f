package integration

import (
	"bufio"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// statsdUDP is a statsd server on a loopback UDP port: every line of every
// datagram it receives goes to lines.
func statsdUDP(t *testing.T) (port int, lines <-chan string) {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadBuffer(4 << 20)
	ch := make(chan string, 1<<16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			if n > 1432 {
				t.Errorf("datagram of %d bytes, over 1432", n)
			}
			gram := string(buf[:n])
			if !strings.HasSuffix(gram, "\n") {
				t.Errorf("datagram %q does not end a line", gram)
			}
			for _, l := range strings.Split(strings.TrimSuffix(gram, "\n"), "\n") {
				ch <- l
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return conn.LocalAddr().(*net.UDPAddr).Port, ch
}

// statsdTCP is a statsd server on a loopback TCP port, as statsd_exporter
// listens: every line of every connection goes to lines.
func statsdTCP(t *testing.T) (port int, lines <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 1<<16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					ch <- sc.Text()
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port, ch
}

// statsdLine is a well-formed statsd or DogStatsD line: one name, one
// value, one type, an optional sample rate and optional tags.
var statsdLine = regexp.MustCompile(`^([^:|,#\n\r]+):([0-9.]+)\|(c|g|ms|h)(?:\|@([0-9.]+))?(?:\|#([^|\n\r]+))?$`)

// statsdTotals sums what statsd would make of the lines: counter deltas,
// and timer and histogram observations weighted by 1/rate as
// statsd_exporter repeats them. Every line must be well formed.
type statsdTotals struct {
	counters map[string]uint64
	timings  map[string]int
	gauges   map[string]int    // gauge lines seen
	values   map[string]string // each gauge's last value
}

func newStatsdTotals() *statsdTotals {
	return &statsdTotals{counters: map[string]uint64{}, timings: map[string]int{}, gauges: map[string]int{}, values: map[string]string{}}
}

func (s *statsdTotals) add(t *testing.T, line string) {
	t.Helper()
	m := statsdLine.FindStringSubmatch(line)
	if m == nil {
		t.Errorf("malformed statsd line %q", line)
		return
	}
	name := m[1]
	if m[5] != "" {
		name += "|#" + m[5]
	}
	switch m[3] {
	case "c":
		v, err := strconv.ParseUint(m[2], 10, 64)
		if err != nil {
			t.Errorf("line %q: %v", line, err)
		}
		s.counters[name] += v
	case "g":
		s.gauges[name]++
		s.values[name] = m[2]
	case "ms", "h":
		n := 1
		if m[4] != "" {
			r, err := strconv.ParseFloat(m[4], 64)
			if err != nil {
				t.Errorf("line %q: %v", line, err)
			}
			n = int(1 / r)
		}
		s.timings[name] += n
	}
}

// until reads lines into s until cond holds, failing after a deadline.
func (s *statsdTotals) until(t *testing.T, lines <-chan string, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case l := <-lines:
			s.add(t, l)
		case <-deadline:
			t.Fatalf("statsd: %s not seen within 30s; counters %v, timings %v", what, s.counters, s.timings)
		}
	}
}

// flushes reads lines until the gauge name has been sent n more times:
// gauges go out at every flush, so this waits for n flushes.
func (s *statsdTotals) flushes(t *testing.T, lines <-chan string, gauge string, n int) {
	t.Helper()
	want := s.gauges[gauge] + n
	s.until(t, lines, fmt.Sprintf("%d more flushes", n), func() bool { return s.gauges[gauge] >= want })
}

const statsdRules = `domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// TestStatsdOverTheWire: the built binary sends what it counted to a
// statsd server on a real UDP socket, under the anchor's names and as
// deltas: 10 requests of which 7 over the limit add up, across flushes,
// to total_hits 10, over_limit 7 and within_limit 3, and a request value
// made to look like statsd lines stays inside one name.
func TestStatsdOverTheWire(t *testing.T) {
	port, lines := statsdUDP(t)
	p := start(t, map[string]string{"web.yaml": statsdRules},
		"USE_STATSD=true", "STATSD_HOST=127.0.0.1", fmt.Sprintf("STATSD_PORT=%d", port),
		"STATSD_PROTOCOL=udp", "STATS_FLUSH_INTERVAL=100ms")
	c := p.client(t)
	call := func(n int, kv ...string) {
		t.Helper()
		for range n {
			if _, err := c.ShouldRateLimit(callCtx(t), request("web", kv...)); err != nil {
				t.Fatal(err)
			}
		}
	}
	const stat = "ratelimit.service.rate_limit.web.user."
	got := newStatsdTotals()

	// Four now, six after they were sent: the deltas of several flushes
	// must add up.
	call(4, "user", "alice")
	got.until(t, lines, "the first 4 hits", func() bool { return got.counters[stat+"total_hits"] >= 4 })
	call(6, "user", "alice")
	call(1, "path", "a:1|c\nb")
	got.until(t, lines, "the hostile value's hit", func() bool { return got.counters[stat+"total_hits"] >= 10 })
	// Two more flushes: nothing more may come.
	got.flushes(t, lines, "ratelimit.go.numGoroutine", 2)

	for name, want := range map[string]uint64{
		stat + "total_hits":   10,
		stat + "over_limit":   7,
		stat + "within_limit": 3,
		stat + "near_limit":   1,
		"ratelimit.service.rate_limit.web.path_a_1_c_b.total_hits": 1,
		"ratelimit_server.ShouldRateLimit.total_requests":          11,
		"ratelimit.service.config_load_success":                    1,
	} {
		if got.counters[name] != want {
			t.Errorf("%s summed to %d over the flushes, want %d", name, got.counters[name], want)
		}
	}
	// Decisions 1 and 9 were timed, each standing for eight.
	if n := got.timings["ratelimit_server.ShouldRateLimit.response_time"]; n != 16 {
		t.Errorf("response_time stands for %d requests, want 16 (2 timed of 11, eight each)", n)
	}
	for name := range got.counters {
		if strings.HasPrefix(name, "b.") || name == "b" || strings.Contains(name, "\n") {
			t.Errorf("a request value made a metric of its own: %q", name)
		}
	}
}

// TestDogStatsdOverTheWire: with USE_DOG_STATSD, EXTRA_TAGS and a
// mogrifier, the per-rule statistics arrive under the mogrified name with
// the tags, in DogStatsD's form.
func TestDogStatsdOverTheWire(t *testing.T) {
	port, lines := statsdUDP(t)
	p := start(t, map[string]string{"web.yaml": statsdRules},
		"USE_DOG_STATSD=true", "STATSD_HOST=127.0.0.1", fmt.Sprintf("STATSD_PORT=%d", port),
		"STATS_FLUSH_INTERVAL=100ms", "EXTRA_TAGS=env:test,version:1.2.3",
		"USE_DOG_STATSD_MOGRIFIERS=TAG",
		`DOG_STATSD_MOGRIFIER_TAG_PATTERN=^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`,
		"DOG_STATSD_MOGRIFIER_TAG_NAME=ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_TAG_TAGS=domain:$1,descriptor:$2")
	c := p.client(t)
	for range 5 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "bob")); err != nil {
			t.Fatal(err)
		}
	}
	const tags = "|#env:test,version:1_2_3,descriptor:user,domain:web"
	got := newStatsdTotals()
	got.until(t, lines, "the 5 hits", func() bool { return got.counters["ratelimit.service.rate_limit.total_hits"+tags] >= 5 })
	got.flushes(t, lines, "ratelimit.go.numGoroutine|#env:test,version:1_2_3", 2)
	for name, want := range map[string]uint64{
		"ratelimit.service.rate_limit.total_hits" + tags:                          5,
		"ratelimit.service.rate_limit.over_limit" + tags:                          2,
		"ratelimit.service.rate_limit.within_limit" + tags:                        3,
		"ratelimit_server.ShouldRateLimit.total_requests|#env:test,version:1_2_3": 5,
	} {
		if got.counters[name] != want {
			t.Errorf("%s summed to %d, want %d", name, got.counters[name], want)
		}
	}
}

// TestStatsdStoreStatistics: on Redis and on Memcached, the statistics the
// anchor has for its store reach statsd under its names: the connections
// of redis_pool, and the memcache commands by their code tag.
func TestStatsdStoreStatistics(t *testing.T) {
	tests := []struct {
		name     string
		env      func(t *testing.T) []string
		counters []string // each must sum to at least 1
		gauge    string
	}{
		{
			name: "redis",
			env: func(t *testing.T) []string {
				return redisEnv(harness.StartRedis(t, harness.RedisOptions{}))
			},
			counters: []string{"ratelimit.redis_pool.cx_total", "ratelimit.redis.round_trips"},
			gauge:    "ratelimit.redis_pool.cx_active",
		},
		{
			name: "memcache",
			env: func(t *testing.T) []string {
				return memcacheEnv(harness.StartMemcached(t))
			},
			counters: []string{"ratelimit.memcache.add.__code=success", "ratelimit.memcache.increment.__code=success"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			port, lines := statsdUDP(t)
			env := append(tt.env(t), "USE_STATSD=true", "STATSD_HOST=127.0.0.1", fmt.Sprintf("STATSD_PORT=%d", port),
				"STATSD_PROTOCOL=udp", "STATS_FLUSH_INTERVAL=100ms")
			p := start(t, map[string]string{"web.yaml": statsdRules}, env...)
			c := p.client(t)
			for range 3 {
				if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "carol")); err != nil {
					t.Fatal(err)
				}
			}
			got := newStatsdTotals()
			got.until(t, lines, "the store's statistics", func() bool {
				for _, name := range tt.counters {
					if got.counters[name] < 1 {
						return false
					}
				}
				return tt.gauge == "" || got.gauges[tt.gauge] > 0
			})
		})
	}
}
