package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// RedisSentinelMaster is the master name the Sentinel group monitors.
const RedisSentinelMaster = "mymaster"

// RedisSentinelOptions configures a Sentinel group.
type RedisSentinelOptions struct {
	// Data configures the master and the replica (auth only; TLS is not
	// supported for Sentinel groups).
	Data RedisOptions
	// SentinelPassword is the sentinels' own requirepass (REDIS_SENTINEL_AUTH).
	SentinelPassword string
}

// RedisSentinel is a Sentinel group: one master, one replica and three
// sentinels with quorum 2, all on free 127.0.0.1 ports.
type RedisSentinel struct {
	// Master and Replica are the current roles; Failover swaps them.
	Master, Replica *RedisServer
	Sentinels       []*RedisServer
	// URL is the REDIS_URL for REDIS_TYPE=SENTINEL: "mymaster,host:port,...".
	URL string
}

// StartRedisSentinel starts a Sentinel group and stops it in t.Cleanup.
func StartRedisSentinel(tb testing.TB, opts RedisSentinelOptions) *RedisSentinel {
	tb.Helper()
	return startFor(tb, func(dir string) (*RedisSentinel, error) { return LaunchRedisSentinel(dir, opts) })
}

// LaunchRedisSentinel starts a Sentinel group whose files live under dir and
// waits until every sentinel sees the replica and the two other sentinels.
// The caller must call Close.
func LaunchRedisSentinel(dir string, opts RedisSentinelOptions) (g *RedisSentinel, err error) {
	if opts.Data.TLS {
		return nil, errors.New("harness: TLS is not supported for Sentinel groups")
	}
	g = &RedisSentinel{}
	defer func() {
		if err != nil {
			_ = g.Close()
		}
	}()
	sub := func(name string) (string, error) {
		d := filepath.Join(dir, name)
		return d, os.MkdirAll(d, 0o700)
	}
	masterDir, err := sub("master")
	if err != nil {
		return nil, err
	}
	masterOpts := opts.Data
	masterOpts.Config = append(append([]string(nil), opts.Data.Config...), redisReplicationAuth(opts.Data)...)
	// A master waits 5 s by default for more replicas before a sync.
	masterOpts.Config = append(masterOpts.Config, "repl-diskless-sync-delay 0")
	if g.Master, err = LaunchRedis(masterDir, masterOpts); err != nil {
		return nil, err
	}
	replicaDir, err := sub("replica")
	if err != nil {
		return nil, err
	}
	replicaOpts := masterOpts
	replicaOpts.Config = append(append([]string(nil), masterOpts.Config...),
		fmt.Sprintf("replicaof 127.0.0.1 %d", g.Master.Port()))
	if g.Replica, err = LaunchRedis(replicaDir, replicaOpts); err != nil {
		return nil, err
	}
	// A sentinel learns the replicas from the master's INFO, at its first
	// look and then every 10 s: started before the replica is linked, it
	// would wait up to 10 s more to see it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := waitReplicaLinked(ctx, g.Replica); err != nil {
		return nil, err
	}
	url := RedisSentinelMaster
	for i := range 3 {
		sd, err := sub(fmt.Sprintf("sentinel%d", i))
		if err != nil {
			return nil, err
		}
		s, err := launchSentinel(sd, g.Master.Port(), opts)
		if err != nil {
			return nil, err
		}
		g.Sentinels = append(g.Sentinels, s)
		url += "," + s.Addr
	}
	g.URL = url
	for _, s := range g.Sentinels {
		if err := waitSentinelReady(ctx, s); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// redisReplicationAuth lets a replica (or a demoted master) authenticate to
// its master with the data nodes' credentials.
func redisReplicationAuth(o RedisOptions) []string {
	var lines []string
	if o.User != "" {
		lines = append(lines, "masteruser "+o.User)
	}
	if o.Password != "" {
		lines = append(lines, "masterauth "+o.Password)
	}
	return lines
}

func launchSentinel(dir string, masterPort int, opts RedisSentinelOptions) (*RedisServer, error) {
	return launchRedisProcess(redisProcess{
		dir:      dir,
		opts:     RedisOptions{Password: opts.SentinelPassword},
		sentinel: true,
		lines: func(port int) []string {
			lines := []string{
				"port " + strconv.Itoa(port),
				fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", RedisSentinelMaster, masterPort),
				fmt.Sprintf("sentinel down-after-milliseconds %s 1000", RedisSentinelMaster),
				fmt.Sprintf("sentinel failover-timeout %s 10000", RedisSentinelMaster),
				fmt.Sprintf("sentinel parallel-syncs %s 1", RedisSentinelMaster),
			}
			if opts.Data.User != "" {
				lines = append(lines, fmt.Sprintf("sentinel auth-user %s %s", RedisSentinelMaster, opts.Data.User))
			}
			if opts.Data.Password != "" {
				lines = append(lines, fmt.Sprintf("sentinel auth-pass %s %s", RedisSentinelMaster, opts.Data.Password))
			}
			if opts.SentinelPassword != "" {
				lines = append(lines, "requirepass "+opts.SentinelPassword)
			}
			return lines
		},
	})
}

// writeSentinelConf is writeRedisConf without the persistence directives a
// sentinel does not take. The file must stay writable: sentinels rewrite it.
func writeSentinelConf(path, dir string, port int, extra []string) error {
	lines := fmt.Sprintf("bind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir %s\nlogfile %s\nloglevel notice\n",
		dir, filepath.Join(dir, fmt.Sprintf("sentinel-%d.log", port)))
	for _, l := range extra {
		lines += l + "\n"
	}
	return os.WriteFile(path, []byte(lines), 0o600)
}

// waitReplicaLinked waits until the replica has synchronised with its master.
func waitReplicaLinked(ctx context.Context, r *RedisServer) error {
	var last string
	for {
		info, err := r.Do(ctx, "INFO", "replication")
		if err == nil && redisInfoField(info, "master_link_status") == "up" {
			return nil
		}
		last = fmt.Sprint(redisInfoField(info, "master_link_status"), err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: replica %s not linked to its master: %s\n%s", r.Addr, last, r.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitSentinelReady waits until the sentinel knows the replica and the two
// other sentinels, so that a failover can reach its quorum.
func waitSentinelReady(ctx context.Context, s *RedisServer) error {
	var last string
	for {
		reply, err := s.Do(ctx, "SENTINEL", "MASTER", RedisSentinelMaster)
		if err == nil {
			fields := redisPairs(reply)
			last = fmt.Sprintf("num-slaves=%s num-other-sentinels=%s flags=%s",
				fields["num-slaves"], fields["num-other-sentinels"], fields["flags"])
			if fields["num-slaves"] == "1" && fields["num-other-sentinels"] == "2" && fields["flags"] == "master" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: sentinel %s not ready: %s\n%s", s.Addr, last, s.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Failover kills the master and waits until the sentinels have promoted the
// replica and it accepts writes. Master and Replica are swapped; the old
// master stays stopped.
func (g *RedisSentinel) Failover(ctx context.Context) error {
	old, next := g.Master, g.Replica
	if err := old.Stop(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	want := next.Addr
	var last string
	for {
		promoted := 0
		for _, s := range g.Sentinels {
			reply, err := s.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", RedisSentinelMaster)
			if a, ok := reply.([]any); ok && err == nil && len(a) == 2 {
				host, _ := a[0].(string)
				port, _ := a[1].(string)
				if net.JoinHostPort(host, port) == want {
					promoted++
				}
				last = fmt.Sprintf("%s says %s:%s", s.Addr, host, port)
			}
		}
		if promoted == len(g.Sentinels) {
			info, err := next.Do(ctx, "INFO", "replication")
			if err == nil && redisInfoField(info, "role") == "master" {
				g.Master, g.Replica = next, old
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: failover to %s did not complete: %s", want, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops every process of the group. It is safe to call more than once.
func (g *RedisSentinel) Close() error {
	for _, s := range g.Sentinels {
		_ = s.Close()
	}
	for _, s := range []*RedisServer{g.Master, g.Replica} {
		if s != nil {
			_ = s.Close()
		}
	}
	return nil
}

// redisPairs turns a flat [name, value, ...] array reply into a map.
func redisPairs(reply any) map[string]string {
	m := map[string]string{}
	a, _ := reply.([]any)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		v, _ := a[i+1].(string)
		m[k] = v
	}
	return m
}
