package redis

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/storetest"
)

// TestTwemproxy runs the store through a real nutcracker, the anchor's
// default deployment (REDIS_URL defaults to its socket).
func TestTwemproxy(t *testing.T) {
	t.Parallel()

	t.Run("suite", func(t *testing.T) {
		t.Parallel()
		proxy := harness.StartTwemproxy(t, harness.StartRedis(t, harness.RedisOptions{}))
		storetest.Run(t, func(t *testing.T) limiter.Store {
			return newStore(t, Config{URL: proxy.Addr})
		}, storetest.Options{Clock: serverClock, GroupsOneByOne: true})
	})

	// Two Redis servers behind the proxy: keys are spread over both, and
	// every algorithm counts each key exactly (one key per command; the
	// scripts reach Redis with EVAL after NOSCRIPT, as twemproxy has no
	// SCRIPT LOAD).
	t.Run("sharded", func(t *testing.T) {
		t.Parallel()
		backends := []*harness.RedisServer{
			harness.StartRedis(t, harness.RedisOptions{}),
			harness.StartRedis(t, harness.RedisOptions{}),
		}
		proxy := harness.StartTwemproxy(t, backends...)
		s := newStore(t, Config{URL: proxy.Addr})
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !s.Healthy() {
			t.Error("store through twemproxy is not healthy")
		}
		if s.main.oneServer.Load() {
			t.Error("twemproxy taken for one Redis server: all-or-nothing batches would run one script on the first key's server")
		}
		now := time.Now()
		for _, a := range rules.Algorithms {
			for i := range 40 {
				op := limiter.Op{Key: fmt.Sprintf("tw_%s_%d", a, i), Algorithm: a, Limit: 2, Window: time.Hour, Hits: 1}
				for hit := range 3 {
					b := &limiter.Batch{Now: now, Ops: []limiter.Op{op}}
					if err := s.Do(t.Context(), b); err != nil {
						t.Fatalf("%s hit %d: %v", op.Key, hit+1, err)
					}
					if allowed, want := b.Results[0].Allowed, hit < 2; allowed != want {
						t.Fatalf("%s hit %d: allowed = %v, want %v", op.Key, hit+1, allowed, want)
					}
				}
			}
		}

		// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT across servers: every key
		// of an all-or-nothing batch is counted on its own server, and a
		// batch with a key over its limit records nothing anywhere.
		k0, k1 := keysOnTwoServers(t, s, backends) // on servers 0 and 1, at 1 each
		counts := func() [2][2]string {
			var c [2][2]string
			for i, key := range []string{k0, k1} {
				for j, srv := range backends {
					v, err := srv.Do(t.Context(), "GET", key)
					if err != nil {
						t.Fatal(err)
					}
					c[i][j] = fmt.Sprint(v)
				}
			}
			return c
		}
		op := func(key string, limit uint64) limiter.Op {
			return limiter.Op{Key: key, Limit: limit, Window: time.Hour, Hits: 1}
		}
		b := &limiter.Batch{Now: now, AllOrNothing: true, Ops: []limiter.Op{op(k0, 2), op(k1, 100)}}
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		if !b.Results[0].Allowed || !b.Results[1].Allowed {
			t.Errorf("fitting all-or-nothing batch: allowed %v and %v, want both", b.Results[0].Allowed, b.Results[1].Allowed)
		}
		if got, want := counts(), [2][2]string{{"2", "<nil>"}, {"<nil>", "2"}}; got != want {
			t.Errorf("after a fitting batch, GET per key and server = %v, want %v (each key on its own server)", got, want)
		}
		b = &limiter.Batch{Now: now, AllOrNothing: true, Ops: []limiter.Op{op(k0, 2), op(k1, 100)}}
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		// Per the Batch contract the op under its limit stays Allowed (its
		// own evaluation) but is not recorded.
		if b.Results[0].Allowed || !b.Results[1].Allowed {
			t.Errorf("batch over k0's limit: allowed %v and %v, want false and true", b.Results[0].Allowed, b.Results[1].Allowed)
		}
		if got, want := counts(), [2][2]string{{"2", "<nil>"}, {"<nil>", "2"}}; got != want {
			t.Errorf("after a refused batch, GET per key and server = %v, want %v (nothing recorded)", got, want)
		}

		for i, b := range backends {
			n, err := b.Do(t.Context(), "DBSIZE")
			if err != nil {
				t.Fatal(err)
			}
			if n.(int64) == 0 {
				t.Errorf("Redis %d behind the proxy holds no key: keys were not spread", i)
			}
		}
	})
}

// TestNoHelloConn checks that the opening HELLO is answered locally with
// an old Redis's error and never reaches the server, and that everything
// else, a later HELLO included, passes through.
func TestNoHelloConn(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	c := newNoHelloConn(client, nil)
	defer c.Close()

	hello := []byte("*4\r\n$5\r\nhello\r\n$1\r\n2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n")
	if n, err := c.Write(hello); err != nil || n != len(hello) {
		t.Fatalf("Write(HELLO) = %d, %v", n, err)
	}
	got := make([]byte, 100)
	n, err := c.Read(got)
	if err != nil || string(got[:n]) != helloReply {
		t.Fatalf("reply to HELLO = %q, %v; want %q", got[:n], err, helloReply)
	}

	// The next commands reach the server, byte for byte.
	ping := []byte("*1\r\n$4\r\nPING\r\n")
	go func() {
		_, _ = c.Write(ping)
		_, _ = c.Write(hello)
	}()
	want := append(append([]byte{}, ping...), hello...)
	seen := make([]byte, len(want))
	if _, err := io.ReadFull(server, seen); err != nil || !bytes.Equal(seen, want) {
		t.Fatalf("server read %q, %v; want %q", seen, err, want)
	}
}

func TestIsHello(t *testing.T) {
	tests := []struct {
		name string
		give string
		want bool
	}{
		{"hello_2", "*2\r\n$5\r\nhello\r\n$1\r\n2\r\n", true},
		{"upper_case_with_auth", "*5\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n", true},
		{"alone", "*1\r\n$5\r\nHello\r\n", true},
		{"ping", "*1\r\n$4\r\nPING\r\n", false},
		{"partial", "*2\r\n$5\r\nhello\r\n$1\r\n", false},
		{"followed_by_more", "*1\r\n$5\r\nhello\r\n*1\r\n$4\r\nPING\r\n", false},
		{"hello_as_argument", "*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n", false},
		{"bad_length", "*1\r\n$9\r\nhello\r\n", false},
		{"inline", "HELLO 2\r\n", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isHello([]byte(tt.give)); got != tt.want {
				t.Errorf("isHello(%q) = %v, want %v", tt.give, got, tt.want)
			}
		})
	}
}

// keysOnTwoServers returns two fixed-window keys that twemproxy put on
// different servers, each hit once through s.
func keysOnTwoServers(t *testing.T, s *Store, backends []*harness.RedisServer) (string, string) {
	t.Helper()
	where := map[int]string{}
	for i := 0; len(where) < 2; i++ {
		if i == 200 {
			t.Fatal("no two keys on different servers in 200 tries")
		}
		key := fmt.Sprintf("tw_aon_%d", i)
		b := &limiter.Batch{Ops: []limiter.Op{{Key: key, Limit: 100, Window: time.Hour, Hits: 1}}}
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		for j, srv := range backends {
			if n, err := srv.Do(t.Context(), "EXISTS", key); err == nil && n.(int64) == 1 {
				if _, ok := where[j]; !ok {
					where[j] = key
				}
			}
		}
	}
	return where[0], where[1]
}
