package redis

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/storetest"
)

// TestTwemproxy runs the store through a real nutcracker, the anchor's
// default deployment (REDIS_URL defaults to its socket).
func TestTwemproxy(t *testing.T) {
	t.Parallel()

	t.Run("suite", func(t *testing.T) {
		t.Parallel()
		proxy := storetest.StartTwemproxy(t, storetest.StartRedis(t, storetest.RedisOptions{}))
		storetest.Run(t, func(t *testing.T) limiter.Store {
			return newStore(t, Config{URL: proxy.Addr})
		}, storetest.Options{Clock: serverClock})
	})

	// Two Redis servers behind the proxy: keys are spread over both, and
	// every algorithm counts each key exactly (one key per command; the
	// scripts reach Redis with EVAL after NOSCRIPT, as twemproxy has no
	// SCRIPT LOAD).
	t.Run("sharded", func(t *testing.T) {
		t.Parallel()
		backends := []*storetest.RedisServer{
			storetest.StartRedis(t, storetest.RedisOptions{}),
			storetest.StartRedis(t, storetest.RedisOptions{}),
		}
		proxy := storetest.StartTwemproxy(t, backends...)
		s := newStore(t, Config{URL: proxy.Addr})
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !s.Healthy() {
			t.Error("store through twemproxy is not healthy")
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
	c := &noHelloConn{Conn: client}
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
