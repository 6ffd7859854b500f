package server

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// storeMemory is what one server of a shared store says of its memory
// cap and eviction policy (issue 24, case 2).
type storeMemory struct {
	server string
	// known is false when the server did not say.
	known    bool
	maxBytes int64 // 0: no cap
	policy   string
	// evicts reports that the server may drop counters before they expire.
	evicts bool
}

// memoryGauges are a store's memory statistics, under its prefix:
// maxmemory_bytes (the smallest cap of its servers, 0 when none is
// capped), evicting_servers (servers that may drop counters before they
// expire) and memory_unknown_servers (servers that did not say).
type memoryGauges struct {
	maxBytes, evicting, unknown atomic.Int64
	// asked wakes reportMemory (one pending ask is enough).
	asked chan struct{}
}

func newMemoryGauges(reg *stats.Registry, prefix string) *memoryGauges {
	g := &memoryGauges{asked: make(chan struct{}, 1)}
	reg.GaugeFunc(prefix+"maxmemory_bytes", g.maxBytes.Load)
	reg.GaugeFunc(prefix+"evicting_servers", g.evicting.Load)
	reg.GaugeFunc(prefix+"memory_unknown_servers", g.unknown.Load)
	return g
}

// askMemory asks reportMemory to read the servers' memory again: the
// store has just answered, for the first time or after an outage (a
// server that restarted may have come back with another configuration).
func (b *storeHandle) askMemory() {
	if b.mem == nil {
		return
	}
	select {
	case b.mem.asked <- struct{}{}:
	default:
	}
}

// reportMemory reads the servers' memory caps and eviction policies each
// time it is asked, until ctx is done: it logs each server's, warns when
// one may evict counters before they expire, and sets the statistics.
func (b *storeHandle) reportMemory(ctx context.Context, log *slog.Logger) {
	if b.mem == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.mem.asked:
		}
		ms := b.memory(ctx)
		var smallest, evicting, unknown int64
		for _, m := range ms {
			switch {
			case !m.known:
				unknown++
				log.Info("the store's server does not tell its memory cap and eviction policy (a proxy, or CONFIG and INFO refused): make sure it never evicts counters before they expire", "server", m.server)
				continue
			case m.evicts:
				evicting++
				log.Warn("the store's server may evict counters before they expire: a client over its limit whose counter goes starts afresh. Use noeviction (memcached: -M) and size its memory (README: Sizing Redis and Memcached)",
					"server", m.server, "maxmemory", m.maxBytes, "policy", m.policy)
			default:
				log.Info("the store's memory", "server", m.server, "maxmemory", m.maxBytes, "policy", m.policy)
			}
			if m.maxBytes > 0 && (smallest == 0 || m.maxBytes < smallest) {
				smallest = m.maxBytes
			}
		}
		b.mem.maxBytes.Store(smallest)
		b.mem.evicting.Store(evicting)
		b.mem.unknown.Store(unknown)
	}
}
