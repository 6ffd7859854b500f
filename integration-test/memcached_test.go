package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

func memcacheEnv(m *storetest.MemcachedServer, extra ...string) []string {
	return append([]string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + m.Addr}, extra...)
}

// TestInstancesShareCountsThroughMemcached: two service processes on one
// memcached admit exactly the limit, for every algorithm.
func TestInstancesShareCountsThroughMemcached(t *testing.T) {
	m := storetest.StartMemcached(t)
	testInstancesShareCounts(t, memcacheEnv(m))
}

func TestMemcachedOutageFailsFastAndRecovers(t *testing.T) {
	m := storetest.StartMemcached(t)
	testOutageFailsFastAndRecovers(t, m.Stop, m.Start, memcacheEnv(m))
}

func TestMemcachedDownAtStartupThenUp(t *testing.T) {
	m := storetest.StartMemcached(t)
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	p := launch(t, map[string]string{"shared.yaml": sharedRules}, memcacheEnv(m)...)
	p.waitHealth(t, 500) // ports open, unhealthy
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	p.waitHealth(t, 200)
	if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("shared", "user", "x")); err != nil {
		t.Errorf("after memcached came up: %v", err)
	}
}

// TestMemcachedKeysAreTheAnchors reads the fixed-window key back from
// memcached: envoyproxy/ratelimit's name and a plain decimal count.
func TestMemcachedKeysAreTheAnchors(t *testing.T) {
	m := storetest.StartMemcached(t)
	p := start(t, map[string]string{"shared.yaml": sharedRules}, memcacheEnv(m, "CACHE_KEY_PREFIX=pfx:")...)
	before := time.Now().Unix()
	if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("shared", "user", "alice")); err != nil {
		t.Fatal(err)
	}
	after := time.Now().Unix()
	found := false
	for ts := before / 3600 * 3600; ts <= after/3600*3600; ts += 3600 {
		if v := memcacheGet(t, m.Addr, fmt.Sprintf("pfx:shared_user_alice_%d", ts)); strings.TrimSpace(v) == "1" {
			found = true
		}
	}
	if !found {
		t.Errorf("no anchor-format key with count 1 in memcached")
	}
}

// memcacheGet reads one key with the text protocol; "" when missing.
func memcacheGet(t *testing.T, addr, key string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "get %s\r\n", key); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "END") {
		return ""
	}
	var k string
	var flags, n int
	if _, err := fmt.Sscanf(line, "VALUE %s %d %d", &k, &flags, &n); err != nil {
		t.Fatalf("memcached answered %q: %v", line, err)
	}
	val := make([]byte, n+2)
	if _, err := io.ReadFull(rd, val); err != nil {
		t.Fatal(err)
	}
	return string(val[:n])
}
