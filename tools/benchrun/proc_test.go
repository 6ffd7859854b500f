package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
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

// TestStartStores starts the real store servers as benchrun does.
func TestStartStores(t *testing.T) {
	be, err := startRedis(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.proc.stop)
	if !slices.Contains(be.env, "BACKEND_TYPE=redis") || be.rtStat != redisRoundTrips {
		t.Errorf("redis backend = %v, %q", be.env, be.rtStat)
	}

	path, err := exec.LookPath("memcached")
	if err != nil {
		t.Fatal("memcached not found in PATH; install it (Debian/Ubuntu: apt-get install memcached)")
	}
	mc, err := startMemcached(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mc.proc.stop)
	if !slices.Contains(mc.env, "BACKEND_TYPE=memcache") {
		t.Errorf("memcache backend = %v", mc.env)
	}
	mc.proc.stop()
	if mc.proc.running() {
		t.Error("memcached still running after stop")
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
