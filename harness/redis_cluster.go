package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisCluster is a Redis Cluster of three masters (no replicas) on free
// 127.0.0.1 ports, with the 16384 slots split evenly by the launcher.
type RedisCluster struct {
	// Masters[i] serves the i-th third of the slots.
	Masters []*RedisServer
	// URL is the REDIS_URL for REDIS_TYPE=CLUSTER: the comma list of nodes.
	URL string
}

// redisClusterSlots are the slot ranges of the three masters.
var redisClusterSlots = [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// StartRedisCluster starts a three-master cluster and stops it in t.Cleanup.
// opts applies to every node (auth only; TLS is not supported).
func StartRedisCluster(tb testing.TB, opts RedisOptions) *RedisCluster {
	tb.Helper()
	return startFor(tb, func(dir string) (*RedisCluster, error) { return LaunchRedisCluster(dir, opts) })
}

// LaunchRedisCluster starts three cluster-enabled nodes under dir, assigns
// their slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER MEET) and waits for
// cluster_state:ok on every node. The caller must call Close.
func LaunchRedisCluster(dir string, opts RedisOptions) (c *RedisCluster, err error) {
	if opts.TLS {
		return nil, errors.New("harness: TLS is not supported for Redis Cluster")
	}
	c = &RedisCluster{}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	for i := range redisClusterSlots {
		nodeDir := filepath.Join(dir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(nodeDir, 0o700); err != nil {
			return nil, err
		}
		o := opts
		o.Config = append(append([]string(nil), opts.Config...),
			"cluster-enabled yes",
			"cluster-config-file nodes.conf",
			"cluster-node-timeout 2000",
			"cluster-announce-ip 127.0.0.1",
			// The bus on the client port + 10000 (freePort keeps it
			// valid): LaunchRedis tries a new port, the bus's with it,
			// when either is taken before the node binds it.
		)
		o.Config = append(o.Config, redisReplicationAuth(opts)...)
		s, err := LaunchRedis(nodeDir, o)
		if err != nil {
			return nil, err
		}
		c.Masters = append(c.Masters, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var addrs []string
	for i, s := range c.Masters {
		r := redisClusterSlots[i]
		if _, err := s.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(r[0]), strconv.Itoa(r[1])); err != nil {
			return nil, fmt.Errorf("harness: cluster addslotsrange on %s: %w", s.Addr, err)
		}
		addrs = append(addrs, s.Addr)
	}
	for _, s := range c.Masters[1:] {
		if _, err := c.Masters[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.Port())); err != nil {
			return nil, fmt.Errorf("harness: cluster meet %s: %w", s.Addr, err)
		}
	}
	for _, s := range c.Masters {
		if err := waitClusterOK(ctx, s, len(c.Masters)); err != nil {
			return nil, err
		}
	}
	c.URL = strings.Join(addrs, ",")
	return c, nil
}

func waitClusterOK(ctx context.Context, s *RedisServer, nodes int) error {
	var last string
	for {
		info, err := s.Do(ctx, "CLUSTER", "INFO")
		if err == nil {
			last = fmt.Sprintf("cluster_state:%s known_nodes:%s slots_ok:%s",
				redisInfoField(info, "cluster_state"), redisInfoField(info, "cluster_known_nodes"),
				redisInfoField(info, "cluster_slots_ok"))
			if redisInfoField(info, "cluster_state") == "ok" &&
				redisInfoField(info, "cluster_known_nodes") == strconv.Itoa(nodes) &&
				redisInfoField(info, "cluster_slots_ok") == "16384" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: cluster node %s not ready: %s\n%s", s.Addr, last, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MasterFor returns the master that serves key's hash slot.
func (c *RedisCluster) MasterFor(ctx context.Context, key string) (*RedisServer, error) {
	reply, err := c.Masters[0].Do(ctx, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, err
	}
	slot, _ := reply.(int64)
	for i, r := range redisClusterSlots {
		if int(slot) >= r[0] && int(slot) <= r[1] {
			return c.Masters[i], nil
		}
	}
	return nil, fmt.Errorf("harness: slot %d of %q is unassigned", slot, key)
}

// Close stops every node. It is safe to call more than once.
func (c *RedisCluster) Close() error {
	for _, s := range c.Masters {
		_ = s.Close()
	}
	return nil
}
