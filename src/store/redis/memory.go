package redis

import (
	"context"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// Memory is what a Redis server says of its memory cap and eviction
// policy (issue 24, case 2): a policy that evicts keys before they expire
// can forget a counter, and a client over its limit then starts afresh.
type Memory struct {
	// Server names the server: the backend ("redis", "redis persecond")
	// and, on a Cluster, the master's address.
	Server string
	// Known is false when the server did not say: CONFIG GET and INFO
	// both refused (a managed Redis, an ACL), or a proxy (twemproxy).
	Known bool
	// MaxBytes is maxmemory, 0 for no cap.
	MaxBytes int64
	// Policy is maxmemory-policy (noeviction, allkeys-lru, volatile-ttl...).
	Policy string
}

// Evicts reports whether the server may drop keys before they expire:
// with a cap, every policy but noeviction does (the volatile ones drop
// keys with a time to live, and every counter has one). Without a cap a
// server never evicts, and the host's memory is its bound.
func (m Memory) Evicts() bool { return m.Known && m.MaxBytes > 0 && m.Policy != "noeviction" }

// Memory asks every server of the store for its memory cap and eviction
// policy: each Redis (the main one and the per-second one), each master
// of a Cluster. It reads CONFIG GET maxmemory and maxmemory-policy, and
// INFO memory where CONFIG is refused; a server that tells neither (a
// proxy) is not Known. Each question is bounded by the store's timeout.
func (s *Store) Memory(ctx context.Context) []Memory {
	var out []Memory
	for _, be := range s.backends() {
		cctx, cancel := context.WithTimeout(ctx, be.timeout)
		switch c := be.client.(type) {
		case *goredis.ClusterClient:
			// ForEachMaster asks the masters side by side.
			var mu sync.Mutex
			_ = c.ForEachMaster(cctx, func(ctx context.Context, n *goredis.Client) error {
				m := readMemory(ctx, n)
				m.Server = be.name + " " + n.Options().Addr
				mu.Lock()
				out = append(out, m)
				mu.Unlock()
				return nil
			})
		default:
			m := Memory{Server: be.name}
			if be.oneServer.Load() {
				m = readMemory(cctx, c)
				m.Server = be.name
			}
			out = append(out, m)
		}
		cancel()
	}
	return out
}

// readMemory reads one server's cap and policy.
func readMemory(ctx context.Context, c goredis.Cmdable) (m Memory) {
	defer recovered(nil)
	mem, err1 := c.ConfigGet(ctx, "maxmemory").Result()
	pol, err2 := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err1 == nil && err2 == nil && mem["maxmemory"] != "" && pol["maxmemory-policy"] != "" {
		if n, err := strconv.ParseInt(mem["maxmemory"], 10, 64); err == nil {
			return Memory{Known: true, MaxBytes: n, Policy: pol["maxmemory-policy"]}
		}
	}
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return Memory{}
	}
	var maxOK, polOK bool
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case k == "maxmemory":
			m.MaxBytes, err = strconv.ParseInt(v, 10, 64)
			maxOK = err == nil
		case k == "maxmemory_policy":
			m.Policy, polOK = v, v != ""
		}
	}
	m.Known = maxOK && polOK
	return m
}
