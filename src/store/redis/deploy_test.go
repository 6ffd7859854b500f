package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/storetest"
)

func TestCluster(t *testing.T) {
	t.Parallel()
	c := harness.StartRedisCluster(t, harness.RedisOptions{Password: "cluster-secret"})
	cfg := Config{Type: "cluster", URL: c.URL, Auth: "cluster-secret", scriptClock: true}

	t.Run("suite", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) limiter.Store { return newStore(t, cfg) }, storetest.Options{})
	})

	t.Run("key_slots_match_the_cluster", func(t *testing.T) {
		t.Parallel()
		for i := range 50 {
			key := fmt.Sprintf("slot_%d_{tag%d}_%d", i, i%7, i*i)
			got, err := c.Masters[0].Do(t.Context(), "CLUSTER", "KEYSLOT", key)
			if err != nil {
				t.Fatal(err)
			}
			if int64(keySlot(key)) != got {
				t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT says %v", key, keySlot(key), got)
			}
		}
	})

	t.Run("keys_on_every_master", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, cfg)
		// Two keys per master, found by asking the cluster where they live.
		byMaster := map[*harness.RedisServer][]string{}
		for i := 0; len(byMaster) < len(c.Masters) || !allHave(byMaster, 2); i++ {
			if i > 1000 {
				t.Fatal("could not place keys on every master")
			}
			key := "spread_" + strconv.Itoa(i)
			m, err := c.MasterFor(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			if len(byMaster[m]) < 2 {
				byMaster[m] = append(byMaster[m], key)
			}
		}
		var ops []limiter.Op
		for _, keys := range byMaster {
			for _, k := range keys {
				ops = append(ops, limiter.Op{Key: k, Limit: 100, Window: time.Hour, Hits: 1})
			}
		}
		before, _ := s.Counters()
		for range 7 {
			if err := s.Do(t.Context(), &limiter.Batch{Now: time.Now(), Ops: ops}); err != nil {
				t.Fatal(err)
			}
		}
		after, _ := s.Counters()
		if got := after - before; got != 7*uint64(len(c.Masters)) {
			t.Errorf("7 requests over %d masters took %d round trips, want one per master per request", len(c.Masters), got)
		}
		for m, keys := range byMaster {
			for _, k := range keys {
				v, err := m.Do(t.Context(), "GET", k)
				if err != nil || v != "7" {
					t.Errorf("GET %s on its master %s = %v, %v; want 7", k, m.Addr, v, err)
				}
			}
		}
	})

	t.Run("all_or_nothing_within_a_slot", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, cfg)
		// Hash tags put the keys in one slot: one atomic script.
		ops := []limiter.Op{
			{Key: "{user1}_a", Limit: 5, Window: time.Hour, Hits: 1},
			{Key: "{user1}_b", Algorithm: rules.TokenBucket, Limit: 1, Window: time.Hour, Hits: 1},
		}
		b := &limiter.Batch{Now: time.Now(), Ops: ops, AllOrNothing: true}
		for range 2 {
			if err := s.Do(t.Context(), b); err != nil {
				t.Fatal(err)
			}
		}
		if !b.Results[0].Allowed || b.Results[1].Allowed || b.Results[0].Before != 1 {
			t.Errorf("second batch: %+v, want a within its limit at 1, b refused", b.Results)
		}
		m, err := c.MasterFor(t.Context(), "{user1}_a")
		if err != nil {
			t.Fatal(err)
		}
		if v, err := m.Do(t.Context(), "GET", "{user1}_a"); err != nil || v != "1" {
			t.Errorf("GET {user1}_a = %v, %v; want 1 (the refused batch recorded nothing)", v, err)
		}
	})

	t.Run("all_or_nothing_across_slots", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, cfg)
		// Keys in different slots run as one script per slot; the slot whose
		// ops fit records them, and a second round trip takes them back.
		ops := []limiter.Op{
			{Key: "across_a", Limit: 5, Window: time.Hour, Hits: 1},
			{Key: "across_b", Algorithm: rules.SlidingLog, Limit: 1, Window: time.Hour, Hits: 1},
			{Key: "across_c", Algorithm: rules.TokenBucket, Limit: 5, Window: time.Hour, Hits: 1},
		}
		if keySlot(ops[0].Key) == keySlot(ops[1].Key) || keySlot(ops[0].Key) == keySlot(ops[2].Key) {
			t.Fatal("test keys share a slot")
		}
		b := &limiter.Batch{Now: time.Now(), Ops: ops, AllOrNothing: true}
		for range 3 {
			if err := s.Do(t.Context(), b); err != nil {
				t.Fatal(err)
			}
		}
		want := []limiter.Result{
			{Before: 1, After: 2, Allowed: true, Remaining: 4},
			{Before: 1, After: 2},
			{Before: 1, After: 2, Allowed: true, Remaining: 4},
		}
		for i, r := range b.Results {
			r.ResetAfter = 0
			if r != want[i] {
				t.Errorf("%s: %+v, want %+v (ResetAfter aside)", ops[i].Key, r, want[i])
			}
		}
		m, err := c.MasterFor(t.Context(), "across_a")
		if err != nil {
			t.Fatal(err)
		}
		if v, err := m.Do(t.Context(), "GET", "across_a"); err != nil || v != "1" {
			t.Errorf("GET across_a = %v, %v; want 1: taken back after the refusals", v, err)
		}
	})
}

func TestClusterAllOrNothingExact(t *testing.T) {
	t.Parallel()
	c := harness.StartRedisCluster(t, harness.RedisOptions{})
	s := newStore(t, Config{Type: "cluster", URL: c.URL})
	// Two keys on different slots, hit together by 32 clients: never more
	// than the budget admitted, and (traffic continuing) exactly the budget.
	ops := []limiter.Op{
		{Key: "exact_aon_a", Limit: 100, Window: 24 * time.Hour, Hits: 1},
		{Key: "exact_aon_b", Algorithm: rules.SlidingWindow, Limit: 100, Window: 24 * time.Hour, Hits: 1},
	}
	if keySlot(ops[0].Key) == keySlot(ops[1].Key) {
		t.Fatal("test keys share a slot")
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			b := &limiter.Batch{Now: time.Now(), Ops: append([]limiter.Op(nil), ops...), AllOrNothing: true}
			for range 200 {
				if err := s.Do(context.Background(), b); err != nil {
					t.Error(err)
					return
				}
				if b.Results[0].Allowed && b.Results[1].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 100 {
		t.Errorf("32 × 200 all-or-nothing requests across two slots admitted %d, want exactly 100", got)
	}
	b := &limiter.Batch{Now: time.Now(), Ops: append([]limiter.Op(nil), ops...)}
	b.Ops[0].Hits, b.Ops[1].Hits = 0, 0
	if err := s.Do(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if b.Results[0].Before != 100 || b.Results[1].Before != 100 {
		t.Errorf("counts after the test: %d, %d; want 100, 100", b.Results[0].Before, b.Results[1].Before)
	}
}

func allHave(m map[*harness.RedisServer][]string, n int) bool {
	for _, keys := range m {
		if len(keys) < n {
			return false
		}
	}
	return true
}

// TestSentinel follows a failover: the master dies, Sentinel promotes the
// replica, and the same Store keeps working without a restart.
// TestSentinelLists runs the cases of lists of limits, shadow limits
// among them, through a Sentinel-discovered master: every limit of a
// descriptor in one script there too.
func TestSentinelLists(t *testing.T) {
	t.Parallel()
	g := harness.StartRedisSentinel(t, harness.RedisSentinelOptions{})
	storetest.RunLists(t, func(t *testing.T) limiter.Store {
		return newStore(t, Config{Type: "sentinel", URL: g.URL, scriptClock: true})
	}, storetest.Options{})
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	g := harness.StartRedisSentinel(t, harness.RedisSentinelOptions{
		Data:             harness.RedisOptions{Password: "data-secret"},
		SentinelPassword: "sentinel-secret",
	})
	s := newStore(t, Config{
		Type: "sentinel", URL: g.URL, Auth: "data-secret", SentinelAuth: "sentinel-secret",
		Timeout: 500 * time.Millisecond,
	})
	for _, a := range rules.Algorithms {
		if err := hitOnce(t.Context(), s, "sentinel_"+a.String(), a); err != nil {
			t.Fatalf("%s before the failover: %v", a, err)
		}
	}
	if v, err := g.Master.Do(t.Context(), "GET", "sentinel_fixed_window"); err != nil || v != "1" {
		t.Fatalf("GET on the master = %v, %v; want 1", v, err)
	}
	if err := g.Failover(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Errors are allowed until the store has learnt the new master.
	harness.WaitForNil(t, 10*time.Second, "served after the failover", func() error {
		err := hitOnce(t.Context(), s, "sentinel_after", rules.FixedWindow)
		if err != nil && !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("during the failover: %v, want ErrUnavailable", err)
		}
		return err
	})
	for i := range 20 {
		a := rules.Algorithms[i%len(rules.Algorithms)]
		if err := hitOnce(t.Context(), s, "sentinel_"+a.String(), a); err != nil {
			t.Fatalf("request %d after the failover: %v", i, err)
		}
	}
	if v, err := g.Master.Do(t.Context(), "GET", "sentinel_after"); err != nil || v != "1" {
		t.Errorf("GET on the new master = %v, %v; want 1", v, err)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts harness.RedisOptions
		auth string
		ok   bool
	}{
		{"password", harness.RedisOptions{Password: "s3cret"}, "s3cret", true},
		{"acl_user", harness.RedisOptions{User: "ratelimit", Password: "s3cret"}, "ratelimit:s3cret", true},
		{"wrong_password", harness.RedisOptions{Password: "s3cret"}, "guess", false},
		{"missing_password", harness.RedisOptions{Password: "s3cret"}, "", false},
		{"acl_user_without_user", harness.RedisOptions{User: "ratelimit", Password: "s3cret"}, "s3cret", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := harness.StartRedis(t, tt.opts)
			s := newStore(t, Config{URL: srv.Addr, Auth: tt.auth, Timeout: time.Second})
			err := hitOnce(t.Context(), s, "auth", rules.TokenBucket)
			if tt.ok && err != nil {
				t.Fatalf("Do = %v", err)
			}
			if !tt.ok {
				if !errors.Is(err, limiter.ErrUnavailable) {
					t.Errorf("Do = %v, want ErrUnavailable", err)
				}
				if s.Healthy() {
					t.Error("Healthy() = true though Redis refuses our credentials")
				}
			}
		})
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{TLS: true, Password: "tls-secret"})
	files := TLSFiles{ClientCert: srv.TLS.ClientCertFile, ClientKey: srv.TLS.ClientKeyFile, CACert: srv.TLS.CAFile}
	tests := []struct {
		name       string
		files      TLSFiles
		serverName string // overrides the name checked in the certificate
		ok         bool
	}{
		{"verified", files, "", true},
		{"wrong_name", files, "redis.example.com", false},
		{"wrong_name_skip_hostname_verification", withSkip(files), "redis.example.com", true},
		{"no_client_certificate", TLSFiles{CACert: files.CACert}, "", false},
		{"untrusted_server", TLSFiles{ClientCert: files.ClientCert, ClientKey: files.ClientKey}, "", false},
		{"untrusted_server_skip_hostname_verification", withSkip(TLSFiles{ClientCert: files.ClientCert, ClientKey: files.ClientKey}), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conf, err := TLSConfig(tt.files)
			if err != nil {
				t.Fatal(err)
			}
			conf.ServerName = tt.serverName
			s := newStore(t, Config{URL: srv.Addr, Auth: "tls-secret", TLS: conf, Timeout: time.Second})
			err = hitOnce(t.Context(), s, "tls", rules.SlidingWindow)
			if tt.ok && err != nil {
				t.Fatalf("Do = %v", err)
			}
			if !tt.ok && !errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("Do = %v, want ErrUnavailable", err)
			}
		})
	}
}

func withSkip(f TLSFiles) TLSFiles {
	f.SkipHostnameVerification = true
	return f
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name  string
		files TLSFiles
	}{
		{"cert_without_key", TLSFiles{ClientCert: dir + "/c.crt"}},
		{"missing_ca", TLSFiles{CACert: dir + "/none.crt"}},
		{"missing_cert", TLSFiles{ClientCert: dir + "/c.crt", ClientKey: dir + "/c.key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := TLSConfig(tt.files); err == nil {
				t.Errorf("TLSConfig(%+v) = nil error", tt.files)
			}
		})
	}
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		typ, url string
		want     Endpoints
		wantErr  bool
	}{
		{"SINGLE", "127.0.0.1:6379", Endpoints{Addrs: []string{"127.0.0.1:6379"}}, false},
		{"single", "/var/run/redis.sock", Endpoints{Addrs: []string{"/var/run/redis.sock"}}, false},
		{"SINGLE", "a:1,b:2", Endpoints{}, true},
		{"SENTINEL", "mymaster,s1:26379, s2:26379", Endpoints{MasterName: "mymaster", Addrs: []string{"s1:26379", "s2:26379"}}, false},
		{"SENTINEL", "mymaster", Endpoints{}, true},
		{"CLUSTER", "n1:7000,n2:7000,n3:7000", Endpoints{Addrs: []string{"n1:7000", "n2:7000", "n3:7000"}}, false},
		{"CLUSTER", " , ", Endpoints{}, true},
		{"RING", "a:1", Endpoints{}, true},
	}
	for _, tt := range tests {
		got, err := ParseURL(tt.typ, tt.url)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseURL(%q, %q) error = %v, want error %v", tt.typ, tt.url, err, tt.wantErr)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("ParseURL(%q, %q) = %+v, want %+v", tt.typ, tt.url, got, tt.want)
		}
	}
}

func TestParseAuth(t *testing.T) {
	tests := []struct{ give, user, password string }{
		{"", "", ""},
		{"secret", "", "secret"},
		{"alice:secret", "alice", "secret"},
		{"alice:se:cret", "alice", "se:cret"},
	}
	for _, tt := range tests {
		if u, p := ParseAuth(tt.give); u != tt.user || p != tt.password {
			t.Errorf("ParseAuth(%q) = %q, %q; want %q, %q", tt.give, u, p, tt.user, tt.password)
		}
	}
}

func TestNewBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"unknown_type", Config{Type: "ring", URL: "127.0.0.1:1"}},
		{"unknown_socket", Config{SocketType: "udp", URL: "127.0.0.1:1"}},
		{"sentinel_without_sentinels", Config{Type: "sentinel", URL: "mymaster"}},
		{"empty_url", Config{}},
		{"bad_persecond", Config{URL: "127.0.0.1:1", PerSecond: &Config{Type: "ring", URL: "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s, err := New(context.Background(), tt.cfg); err == nil {
				_ = s.Close()
				t.Errorf("New(%+v) = nil error", tt.cfg)
			}
		})
	}
}

func TestKeySlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	tests := []struct {
		key  string
		want int
	}{
		{"123456789", 12739},
		{"foo", 12182},
		{"{user1000}.following", keySlot("user1000")},
		{"foo{}{bar}", keySlot("foo{}{bar}")},
		{"foo{{bar}}zap", keySlot("{bar")},
		{"", 0},
	}
	for _, tt := range tests {
		if got := keySlot(tt.key); got != tt.want {
			t.Errorf("keySlot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

func TestUnixSocket(t *testing.T) {
	t.Parallel()
	sock := t.TempDir() + "/redis.sock"
	harness.StartRedis(t, harness.RedisOptions{Config: []string{"unixsocket " + sock, "unixsocketperm 700"}})
	s := newStore(t, Config{SocketType: "unix", URL: sock})
	for _, a := range rules.Algorithms {
		if err := hitOnce(t.Context(), s, "unix_"+a.String(), a); err != nil {
			t.Fatalf("%s over %s: %v", a, sock, err)
		}
	}
}
