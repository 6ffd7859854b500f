package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/harness"
)

func memcacheEnv(m *harness.MemcachedServer, extra ...string) []string {
	return append([]string{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + m.Addr}, extra...)
}

// TestInstancesShareCountsThroughMemcached: two service processes on one
// memcached admit exactly the limit, for every algorithm.
func TestInstancesShareCountsThroughMemcached(t *testing.T) {
	m := harness.StartMemcached(t)
	testInstancesShareCounts(t, memcacheEnv(m))
}

func TestMemcachedOutageFailsFastAndRecovers(t *testing.T) {
	slow(t)
	m := harness.StartMemcached(t)
	testOutageFailsFastAndRecovers(t, m.Stop, m.Start, memcacheEnv(m))
}

func TestMemcachedDownAtStartupThenUp(t *testing.T) {
	m := harness.StartMemcached(t)
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
	m := harness.StartMemcached(t)
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

// TestMemcachedRequestBudget is issue 24's case 6 over the wire: on
// Memcached the service gave a request no REQUEST_TIMEOUT (a frozen
// memcached held each one for its own 500 ms timeout, and answered
// Unavailable), and the store's incr-then-add loop had no bound (a
// memcached answering NOT_FOUND then NOT_STORED held a /json request
// without a deadline for ever). Now a frozen memcached gives
// DeadlineExceeded, the budget's code, on gRPC and on /json; and with no
// budget at all (REQUEST_TIMEOUT=0, a /json client without a deadline)
// the loop ends after its bounded attempts with ResourceExhausted.
func TestMemcachedRequestBudget(t *testing.T) {
	t.Run("frozen_memcached", func(t *testing.T) {
		t.Parallel()
		m := harness.StartMemcached(t)
		// A budget well below memcached's own 500 ms: which bound ends
		// the request shows in its code.
		p := start(t, map[string]string{"shared.yaml": sharedRules},
			memcacheEnv(m, "REQUEST_TIMEOUT=100ms", "STORE_BREAKER_FAILURES=0")...)
		c := p.client(t)
		if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "alice")); err != nil {
			t.Fatal(err)
		}
		if err := m.Freeze(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Thaw() })
		_, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "alice"))
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("gRPC with memcached frozen: %v, want DeadlineExceeded (REQUEST_TIMEOUT)", err)
		}
		code, body := p.postJSON(t, `{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "deadline exceeded") {
			t.Errorf("/json with memcached frozen: %d %q, want 503 after the request's budget", code, body)
		}
	})
	t.Run("incr_misses_what_add_finds", func(t *testing.T) {
		t.Parallel()
		f := harness.StartFakeMemcached(t)
		f.Answer("incr", "NOT_FOUND\r\n")
		f.Answer("add", "NOT_STORED\r\n")
		p := start(t, map[string]string{"shared.yaml": sharedRules},
			"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT="+f.Addr, "REQUEST_TIMEOUT=0")
		// No deadline but the test's own, far beyond the loop's bound.
		hc := &http.Client{Timeout: time.Minute}
		for i := range 2 {
			before := f.Commands()
			resp, err := hc.Post("http://"+p.http+"/json", "application/json",
				strings.NewReader(`{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`))
			if err != nil {
				t.Fatalf("/json %d: %v", i, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "incr missed") {
				t.Errorf("/json %d: %d %q, want 503: the loop ran out of attempts", i, resp.StatusCode, body)
			}
			if n := f.Commands() - before; n > 64 {
				t.Errorf("/json %d: %d commands to memcached, want at most 64 (32 incr and add)", i, n)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // as good as none
		defer cancel()
		_, err := p.client(t).ShouldRateLimit(ctx, request("shared", "user", "carol"))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("gRPC without a deadline: %v, want ResourceExhausted", err)
		}
	})
}

// TestMemcachedTLSHasItsOwnSettings: with MEMCACHE_TLS the service counts
// on a memcached that accepts only TLS, from the MEMCACHE_TLS_* files; a
// certificate without its key, or a CA file without a certificate, stops
// the start with a message naming the MEMCACHE_ setting at fault, never a
// REDIS_ one (issue 24, case 10: memcached's TLS was built by the Redis
// helper, whose errors named REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY).
func TestMemcachedTLSHasItsOwnSettings(t *testing.T) {
	m := harness.StartMemcachedTLS(t)
	files := []string{"MEMCACHE_TLS=true", "MEMCACHE_TLS_CLIENT_CERT=" + m.TLS.ClientCertFile,
		"MEMCACHE_TLS_CLIENT_KEY=" + m.TLS.ClientKeyFile, "MEMCACHE_TLS_CACERT=" + m.TLS.CAFile}
	p := start(t, map[string]string{"shared.yaml": sharedRules}, memcacheEnv(m, files...)...)
	c := p.client(t)
	for i := range 3 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "tls")); err != nil {
			t.Fatalf("request %d over TLS to memcached: %v", i, err)
		}
	}

	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		env  []string
		want string
	}{
		{"cert_without_key", []string{"MEMCACHE_TLS=true", "MEMCACHE_TLS_CLIENT_CERT=" + m.TLS.ClientCertFile}, "MEMCACHE_TLS_CLIENT_KEY"},
		{"ca_without_certificate", []string{"MEMCACHE_TLS=true", "MEMCACHE_TLS_CACERT=" + notPEM}, "MEMCACHE_TLS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bad := launch(t, map[string]string{"shared.yaml": sharedRules}, memcacheEnv(m, tt.env...)...)
			if code := bad.wait(t, 30*time.Second); code == 0 {
				t.Fatalf("started with %v; want it to stop", tt.env)
			}
			logs := bad.logs()
			if !strings.Contains(logs, tt.want) || strings.Contains(logs, "REDIS_") || strings.Contains(logs, "redis:") {
				t.Errorf("the error with %v should name %q and no REDIS_ setting; it says:\n%s", tt.env, tt.want, logs)
			}
		})
	}
}
