package main

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFreePorts(t *testing.T) {
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || p > 65535 || seen[p] {
			t.Fatalf("freePorts(5) = %v: want 5 distinct valid ports", ports)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}

func TestParseStatTicks(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    uint64
		wantErr bool
	}{
		{
			name: "plain",
			give: "1234 (ratelimit) S 1 1234 1234 0 -1 4194560 2000 0 0 0 150 37 0 0 20 0 9 0 100 1000000 500 18446744073709551615",
			want: 187,
		},
		{
			name: "name_with_space_and_paren",
			give: "42 (a b) c)) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 100 10",
			want: 10,
		},
		{name: "truncated", give: "42 (x) R 1 2 3", wantErr: true},
		{name: "no_name", give: "42 x R", wantErr: true},
		{name: "not_a_number", give: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 3 0 0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatTicks(tt.give)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseStatTicks(%q) = %d, %v; want %d, error %v", tt.give, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tratelimit\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n"
	if got, err := parseVmRSS(status); err != nil || got != 12345*1024 {
		t.Fatalf("parseVmRSS = %d, %v; want %d", got, err, 12345*1024)
	}
	if _, err := parseVmRSS("Name:\tx\n"); err == nil {
		t.Fatal("parseVmRSS without VmRSS: want an error")
	}
	if _, err := parseVmRSS("VmRSS:\t12 MB\n"); err == nil {
		t.Fatal("parseVmRSS in MB: want an error")
	}
}

// TestProcSelf reads this test process's own /proc entries.
func TestProcSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	if _, err := cpuTicks(os.Getpid()); err != nil {
		t.Errorf("cpuTicks(self): %v", err)
	}
	if rss, err := rssBytes(os.Getpid()); err != nil || rss == 0 {
		t.Errorf("rssBytes(self) = %d, %v; want a positive size", rss, err)
	}
	if hz := clockTicks(); hz <= 0 {
		t.Errorf("clockTicks() = %d, want positive", hz)
	}
}

func TestParseStats(t *testing.T) {
	in := "ratelimit.redis.round_trips: 1500\nratelimit.service.rate_limit.bench.user_id.total_hits: 3\n" +
		"# a comment\nbroken line\nname: not-a-number\n  spaced.name :  2.5  \n"
	got := parseStats(strings.NewReader(in))
	want := map[string]float64{
		"ratelimit.redis.round_trips":                           1500,
		"ratelimit.service.rate_limit.bench.user_id.total_hits": 3,
		"spaced.name": 2.5,
	}
	if len(got) != len(want) {
		t.Fatalf("parseStats = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("parseStats[%q] = %v, want %v", k, got[k], v)
		}
	}
}

func TestTCPProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 6)
			c.Read(buf)
			c.Write([]byte("+PONG\r\n"))
			c.Close()
		}
	}()
	if err := tcpProbe(l.Addr().String(), "PING\r\n", "+PONG"); err != nil {
		t.Errorf("tcpProbe(PONG) = %v, want nil", err)
	}
	if err := tcpProbe(l.Addr().String(), "version\r\n", "VERSION"); err == nil {
		t.Error("tcpProbe with the wrong reply: want an error")
	}
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 8}
	fmt.Fprint(b, "0123456789")
	fmt.Fprint(b, "ab")
	if got := b.tail(100); got != "456789ab" {
		t.Errorf("tail = %q, want %q", got, "456789ab")
	}
	if got := b.tail(3); got != "9ab" {
		t.Errorf("tail(3) = %q, want %q", got, "9ab")
	}
	if got := lastLine("first\nsecond line\n"); got != "second line" {
		t.Errorf("lastLine = %q", got)
	}
}

// TestStartStores starts the real store servers as benchrun does and reads
// Redis's usage counters.
func TestStartStores(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		be, err := startRedis(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(be.stop)
		if !slices.Contains(be.env, "BACKEND_TYPE=redis") || !slices.Contains(be.env, "REDIS_TYPE=SINGLE") ||
			be.rtStat != redisRoundTrips || len(be.redis) != 1 {
			t.Errorf("redis backend = %v, %q, %d servers", be.env, be.rtStat, len(be.redis))
		}
		u0, err := readRedisUsage(t.Context(), be.redis)
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if _, err := be.redis[0].Do(t.Context(), "INCRBY", "k", "1"); err != nil {
				t.Fatal(err)
			}
		}
		u1, err := readRedisUsage(t.Context(), be.redis)
		if err != nil {
			t.Fatal(err)
		}
		// The 10 INCRBY and the first INFO.
		if got := u1.commands - u0.commands; got != 11 {
			t.Errorf("commands grew by %v, want 11", got)
		}
		if u1.cpu < u0.cpu || u1.cpu <= 0 {
			t.Errorf("CPU %v s then %v s, want a positive, growing figure", u0.cpu, u1.cpu)
		}
	})
	t.Run("redis-cluster", func(t *testing.T) {
		t.Parallel()
		be, err := startRedisCluster(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(be.stop)
		if !slices.Contains(be.env, "REDIS_TYPE=CLUSTER") || !slices.Contains(be.env, "REDIS_SOCKET_TYPE=tcp") || len(be.redis) != 3 {
			t.Errorf("cluster backend = %v, %d servers", be.env, len(be.redis))
		}
		if _, err := readRedisUsage(t.Context(), be.redis); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("memcached", func(t *testing.T) {
		t.Parallel()
		path, err := exec.LookPath("memcached")
		if err != nil {
			t.Fatal("memcached not found in PATH; install it (Debian/Ubuntu: apt-get install memcached)")
		}
		mc, err := startMemcached(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(mc.stop)
		if !slices.Contains(mc.env, "BACKEND_TYPE=memcache") {
			t.Errorf("memcache backend = %v", mc.env)
		}
		addr, _ := strings.CutPrefix(mc.env[1], "MEMCACHE_HOST_PORT=")
		mc.stop()
		if err := tcpProbe(addr, "version\r\n", "VERSION"); err == nil {
			t.Error("memcached still answers after stop")
		}
	})
}

func TestParseRedisUsage(t *testing.T) {
	info := "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:1234\r\n\r\n# CPU\r\nused_cpu_sys:0.500000\r\nused_cpu_user:1.250000\r\nused_cpu_sys_children:9.000000\r\n"
	u, err := parseRedisUsage(info)
	if err != nil || u.cpu != 1.75 || u.commands != 1234 {
		t.Fatalf("parseRedisUsage = %+v, %v; want CPU 1.75 s, 1234 commands", u, err)
	}
	if _, err := parseRedisUsage("# CPU\r\nused_cpu_sys:0.5\r\n"); err == nil {
		t.Error("parseRedisUsage without the counters: want an error")
	}
}

func TestParseBenchmarkCSV(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		wantRPS float64
		wantP50 time.Duration
		wantErr bool
	}{
		{
			name:    "redis7",
			give:    "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"INCRBY rl:__rand_int__ 1\",\"270270.28\",\"2.597\",\"0.248\",\"2.383\",\"5.735\",\"8.471\",\"8.727\"\n",
			wantRPS: 270270.28,
			wantP50: 2383 * time.Microsecond,
		},
		{name: "redis6", give: "\"INCRBY rl:__rand_int__ 1\",\"81234.50\"\n", wantRPS: 81234.5},
		{name: "empty", give: "", wantErr: true},
		{name: "not_a_number", give: "\"INCRBY\",\"fast\"\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rps, p50, err := parseBenchmarkCSV(tt.give)
			if (err != nil) != tt.wantErr || rps != tt.wantRPS || p50.Round(time.Microsecond) != tt.wantP50 {
				t.Fatalf("parseBenchmarkCSV = %v, %v, %v; want %v, %v, error %v", rps, p50, err, tt.wantRPS, tt.wantP50, tt.wantErr)
			}
		})
	}
}

// TestMeasureCapacity runs redis-benchmark for real, briefly.
func TestMeasureCapacity(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		t.Fatal("redis-benchmark not found in PATH; install it (Debian/Ubuntu: apt-get install redis-tools)")
	}
	got, err := measureCapacity(t.Context(), t.TempDir(), 2000, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("measureCapacity gave %d tests, want 3", len(got))
	}
	for _, c := range got {
		if c.rps <= 0 || math.IsNaN(c.cpuUS) || c.cpuUS <= 0 {
			t.Errorf("%s: %v ops/s, %v µs/request: want both measured", c.load, c.rps, c.cpuUS)
		}
	}
	if !strings.HasPrefix(got[2].command, "EVALSHA <token bucket>") {
		t.Errorf("script command = %q", got[2].command)
	}
}

func TestFetchStat(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ratelimit.redis.round-trips: 42\nratelimit.a_b: 7\n")
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		give   string
		want   float64
		wantOK bool
	}{
		{give: "ratelimit.redis.round_trips", want: 42, wantOK: true},
		{give: "ratelimit.a_b", want: 7, wantOK: true},
		{give: "ratelimit.missing", wantOK: false},
	}
	for _, tt := range tests {
		if got, ok := fetchStat(srv.URL, tt.give); got != tt.want || ok != tt.wantOK {
			t.Errorf("fetchStat(%q) = %v, %v; want %v, %v", tt.give, got, ok, tt.want, tt.wantOK)
		}
	}
	if _, ok := fetchStat("http://127.0.0.1:1/stats", "x"); ok {
		t.Error("fetchStat on a closed port reports a value")
	}
}

// TestStartOnFreePortsRetriesATakenPort: a process that failed because a
// port picked for it was taken first is started again on new ports; one
// that failed for another reason is not.
func TestStartOnFreePortsRetriesATakenPort(t *testing.T) {
	for _, tc := range []struct {
		name, failure string
		starts        int
		ok            bool
	}{
		{"port taken", "listen tcp 127.0.0.1:1: bind: address already in use", 2, true},
		{"other failure", "cannot start: no rules", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			starts := 0
			var seen [][]int
			p, ports, err := startOnFreePorts(t.Context(), 2, 10*time.Second, "running", func(ports []int) (*process, error) {
				starts++
				seen = append(seen, ports)
				if starts == 1 {
					return startProcess("fails", exec.Command("sh", "-c", "echo '"+tc.failure+"' >&2; exit 1"))
				}
				return startProcess("serves", exec.Command("sleep", "30"))
			}, func([]int) func() error {
				n := starts
				return func() error {
					if n == 1 {
						return fmt.Errorf("not yet")
					}
					return nil
				}
			})
			if p != nil {
				defer p.stop()
			}
			if starts != tc.starts || (err == nil) != tc.ok {
				t.Fatalf("started %d times, err %v; want %d, ok %v", starts, err, tc.starts, tc.ok)
			}
			if tc.ok && !slices.Equal(ports, seen[1]) {
				t.Errorf("ports %v, want the second start's %v", ports, seen[1])
			}
		})
	}
}
