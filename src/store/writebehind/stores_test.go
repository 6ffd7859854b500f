package writebehind

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/memcached"
	"github.com/ratelimitd/ratelimit/src/store/redis"
)

// onRedis returns a Redis store on addr, as one instance has it.
func onRedis(t *testing.T, addr string) *redis.Store {
	return onRedisWith(t, redis.Config{SocketType: "tcp", URL: addr})
}

func onRedisWith(t *testing.T, cfg redis.Config) *redis.Store {
	r, err := redis.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// onMemcached returns a Memcached store on addr, as one instance has it.
func onMemcached(t *testing.T, addr string) *memcached.Store {
	m, err := memcached.New(t.Context(), memcached.Config{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// TestBoundOnRedis: three instances, each with its own connections to one
// redis-server, offered more than the limit, admit the limit and at most
// (instances − 1) × one interval's hits more.
func TestBoundOnRedis(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	checkBound(t, onRedis(t, srv.Addr), func() *Store { return newWB(t, onRedis(t, srv.Addr), Config{}) }, t.Name())
}

// TestBoundOnRedisCluster: the same on a Redis Cluster of three masters,
// each flush carrying keys of every master.
func TestBoundOnRedisCluster(t *testing.T) {
	t.Parallel()
	c := harness.StartRedisCluster(t, harness.RedisOptions{})
	cfg := redis.Config{Type: redis.TypeCluster, SocketType: "tcp", URL: c.URL}
	// Two keys on each master.
	var keys []string
	per := map[*harness.RedisServer]int{}
	for i := 0; len(keys) < 2*len(c.Masters) && i < 1000; i++ {
		k := fmt.Sprintf("%s_%d", t.Name(), i)
		m, err := c.MasterFor(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		if per[m] < 2 {
			per[m]++
			keys = append(keys, k)
		}
	}
	checkBound(t, onRedisWith(t, cfg), func() *Store { return newWB(t, onRedisWith(t, cfg), Config{}) }, keys...)
}

// TestRolloutMix: two instances writing behind beside one counting in
// Redis at once (write-behind off, or envoyproxy/ratelimit) admit the
// limit and at most 2 × one interval's hits more: the instance that counts
// at once does not see the last interval of either.
func TestRolloutMix(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	shared := onRedis(t, srv.Addr)
	wb := func() limiter.Store { return newWB(t, onRedis(t, srv.Addr), Config{}) }
	checkFleet(t, shared, []limiter.Store{wb(), onRedis(t, srv.Addr), wb()}, t.Name())
}

// TestBoundOnMemcached: the same on one memcached.
func TestBoundOnMemcached(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	checkBound(t, onMemcached(t, srv.Addr), func() *Store { return newWB(t, onMemcached(t, srv.Addr), Config{}) }, t.Name())
}

// TestOneKeysDataFailsNoOther: a key holding what the store cannot count
// in loses its hits (counted as dropped); the other keys of the same
// flush reach the store.
func TestOneKeysDataFailsNoOther(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, shared limiter.Store, spoil func(key string)) {
		s := newWB(t, shared, Config{})
		keys := []string{"a", "b", "c", "d"}
		for i := range keys {
			keys[i] = strings.ReplaceAll(t.Name(), "/", "_") + "_" + keys[i]
		}
		spoil(keys[1])
		for _, k := range keys {
			hit(t, s, fixed(k, 10))
			hit(t, s, fixed(k, 10))
		}
		s.Flush(t.Context())
		for _, k := range []string{keys[0], keys[2], keys[3]} {
			if got := count(t, shared, k); got != 2 {
				t.Errorf("count of %q = %d, want 2", k, got)
			}
		}
		if st := s.Stats(); st.Dropped != 2 {
			t.Errorf("Stats() = %+v, want the spoilt key's 2 hits dropped", st)
		}
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartRedis(t, harness.RedisOptions{})
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		defer c.Close()
		check(t, onRedis(t, srv.Addr), func(key string) {
			if err := c.RPush(t.Context(), key, "x").Err(); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("memcached", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartMemcached(t)
		check(t, onMemcached(t, srv.Addr), func(key string) {
			conn, err := net.Dial("tcp", srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte("set " + key + " 0 0 1\r\nx\r\n")); err != nil {
				t.Fatal(err)
			}
			if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "STORED\r\n" {
				t.Fatalf("set %s: %q, %v", key, line, err)
			}
		})
	})
}
