package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rlqs"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
	"github.com/ratelimitd/ratelimit/src/store/memcached"
	"github.com/ratelimitd/ratelimit/src/store/memory"
	"github.com/ratelimitd/ratelimit/src/store/redis"
	"github.com/ratelimitd/ratelimit/src/store/writebehind"
)

// healthPoll is how often the store's health is re-read.
const healthPoll = time.Second

// storeHandle is the configured store with what the server needs to know of it.
type storeHandle struct {
	store    limiter.Store
	supports func(rules.Algorithm) bool
	// unsupported says why supports refuses (rules.Options.Unsupported).
	unsupported string
	// alone says the instance decides during a store outage (write-behind
	// counting, or the local store of STORE_FAILURE_MODE=local).
	alone   bool
	healthy func() bool
	close   func()
	// started, when set, waits until the store first answers.
	started func(ctx context.Context) error
	// timeout is the store's own round-trip bound (the longer of REDIS_TIMEOUT
	// and REDIS_PERSECOND_TIMEOUT; Memcached's 500 ms), which an answer may
	// wait for; 0 for the memory store, which gets no REQUEST_TIMEOUT.
	timeout time.Duration
	// keyFormat is how the limiter builds the store's keys.
	keyFormat limiter.KeyFormat
	// local, with STORE_FAILURE_MODE=local and a shared store, is the
	// memory store that decides while the shared one is unreachable.
	local *memory.Store
	// breakers, for Redis and Memcached, reports their circuit breakers.
	breakers func() breaker.Stats
	// health, once set (see storeHealth), is told when the store first
	// answers (answered).
	health atomic.Pointer[storeHealth]
	// share, for Redis, shares the quota service's pools with the other
	// replicas; nil for the memory store and Memcached, which keep them
	// in one replica.
	share rlqs.Share
	// memory, for Redis and Memcached, asks every server for its memory
	// cap and eviction policy; mem holds what it last said, for the
	// statistics. Nil for the memory store.
	memory func(ctx context.Context) []storeMemory
	mem    *memoryGauges
}

// answered is the Redis and Memcached stores' Config.Answered: the store
// has just answered for the first time, and the answer is not handed to
// its request yet. Health is read again now, so that /healthcheck is 200
// by the time a decision from the store reaches its caller.
func (b *storeHandle) answered() {
	if w := b.health.Load(); w != nil {
		w.check()
	}
}

// keyFormat is CACHE_KEY_FORMAT for a store an anchor process may share.
func keyFormat(set *settings.Settings) limiter.KeyFormat {
	if set.CacheKeyFormat == settings.KeyFormatEscaped {
		return limiter.EscapedKeys
	}
	return limiter.AnchorKeys
}

// newMemory makes a memory store within the MEMORY_* ceilings and registers
// its statistics: its size, the keys it dropped, compacted or folded, by
// class, and its filters' false-positive rate.
func newMemory(set *settings.Settings, reg *stats.Registry) *memory.Store {
	m := memory.New(memory.Config{MaxBytes: set.MemoryMaxBytes, MaxKeys: set.MemoryMaxKeys})
	reg.GaugeFunc("ratelimit.memory.keys", func() int64 { return int64(m.Len()) })
	reg.GaugeFunc("ratelimit.memory.bytes", func() int64 { return m.Bytes() })
	reg.CounterFunc("ratelimit.memory.reclaimed_idle", func() uint64 { return m.Evictions().ReclaimedIdle })
	reg.CounterFunc("ratelimit.memory.evicted_under_limit", func() uint64 { return m.Evictions().UnderLimit })
	reg.GaugeFunc("ratelimit.memory.compact_keys", func() int64 { return int64(m.Records()) })
	reg.CounterFunc("ratelimit.memory.compacted_over_limit", func() uint64 { return m.Evictions().Compacted })
	reg.CounterFunc("ratelimit.memory.folded_over_limit", func() uint64 { return m.Evictions().Folded })
	reg.GaugeFunc("ratelimit.memory.filter_false_positive_ppm", func() int64 {
		return int64(math.Ceil(m.FilterFalsePositive() * 1e6))
	})
	return m
}

// newStoreHandle connects the store BACKEND_TYPE names, with the local store
// of STORE_FAILURE_MODE=local beside a shared one. A Redis or Memcached
// store traces its round trips with tracer, when not nil.
func newStoreHandle(ctx context.Context, set *settings.Settings, reg *stats.Registry, tracer trace.Tracer) (*storeHandle, error) {
	b, err := newStore(ctx, set, reg, tracer)
	if err == nil && set.BackendType != settings.BackendMemory && set.WriteBehindInterval > 0 {
		b.writeBehind(set, reg)
		return b, nil
	}
	if err != nil || set.BackendType == settings.BackendMemory || set.StoreFailureMode != settings.FailureModeLocal {
		return b, err
	}
	// The same ceilings as the memory store's, and its statistics: it
	// holds the keys of the requests decided during outages.
	b.local, b.alone = newMemory(set, reg), true
	closeShared := b.close
	b.close = func() {
		closeShared()
		b.local.Close()
	}
	return b, nil
}

// writeBehind makes b's store decide fixed windows from a memory store and
// write them behind to the shared store every WRITE_BEHIND_INTERVAL, and
// registers its statistics. Decisions never wait for the shared store, so
// requests get no budget, as on the memory store; a flush is bounded by
// the store's own timeout. It decides alone during outages: as with
// STORE_FAILURE_MODE=local, health does not follow the shared store.
func (b *storeHandle) writeBehind(set *settings.Settings, reg *stats.Registry) {
	local := newMemory(set, reg)
	took := reg.Timer("ratelimit.write_behind.flush")
	keys := reg.Histogram("ratelimit.write_behind.batch_keys", pipelineBuckets)
	wb := writebehind.New(b.store, local, writebehind.Config{
		Interval: set.WriteBehindInterval,
		MaxKeys:  set.WriteBehindMaxKeys,
		Timeout:  b.timeout,
		Flushed: func(n int, d time.Duration) {
			keys.Observe(uint64(n))
			took.Record(d)
		},
	})
	reg.CounterFunc("ratelimit.write_behind.batches", func() uint64 { return wb.Stats().Batches })
	reg.CounterFunc("ratelimit.write_behind.local_decisions", func() uint64 { return wb.Stats().LocalOnly })
	reg.CounterFunc("ratelimit.write_behind.hits_dropped", func() uint64 { return wb.Stats().Dropped })
	reg.GaugeFunc("ratelimit.write_behind.keys", func() int64 { return wb.Stats().Keys })
	reg.GaugeFunc("ratelimit.write_behind.lag_ms", func() int64 { return wb.Stats().Lag.Milliseconds() })
	closeShared := b.close
	b.close = func() {
		wb.Close()
		closeShared()
		local.Close()
	}
	b.store, b.alone, b.timeout = wb, true, 0
	b.supports, b.unsupported = writebehind.Supports, writebehind.Unsupported
}

func newStore(ctx context.Context, set *settings.Settings, reg *stats.Registry, tracer trace.Tracer) (*storeHandle, error) {
	// b is made first, so that the store can tell it of its first answer
	// from the moment it starts.
	b := &storeHandle{}
	var err error
	switch set.BackendType {
	case settings.BackendMemory:
		m := newMemory(set, reg)
		b.store, b.close = m, m.Close
		b.healthy = func() bool { return true }
		// No anchor process shares this store, so its keys need not be
		// the anchor's, whatever CACHE_KEY_FORMAT says.
		b.keyFormat = limiter.EscapedKeys
	case settings.BackendRedis:
		err = b.openRedis(ctx, set, reg, tracer)
	case settings.BackendMemcache:
		err = b.openMemcached(ctx, set, reg, tracer)
	default:
		err = fmt.Errorf("server: BACKEND_TYPE %q is not available in this build", set.BackendType)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// openRedis makes b's store a Redis store, with its statistics.
func (b *storeHandle) openRedis(ctx context.Context, set *settings.Settings, reg *stats.Registry, tracer trace.Tracer) error {
	cfg, err := redisConfig(set)
	if err != nil {
		return err
	}
	cfg.Tracer = tracer
	cfg.RoundTrip = redisRoundTrips(reg)
	cfg.Answered = b.answered
	r, err := redis.New(ctx, cfg)
	if err != nil {
		return err
	}
	reg.CounterFunc("ratelimit.redis.round_trips", func() uint64 { rt, _ := r.Counters(); return rt })
	reg.CounterFunc("ratelimit.redis.ops", func() uint64 { _, ops := r.Counters(); return ops })
	reg.CounterFunc("ratelimit.redis.load_shed", r.Shed)
	registerBreakers(reg, "ratelimit.redis.", r.Breakers)
	redisPoolStats(reg, "ratelimit.redis_pool", r, false)
	if set.RedisPerSecond {
		redisPoolStats(reg, "ratelimit.redis_per_second_pool", r, true)
	}
	b.store, b.healthy, b.close, b.started = r, r.Healthy, func() { _ = r.Close() }, r.WaitStarted
	b.timeout, b.keyFormat, b.breakers = redisTimeout(cfg), keyFormat(set), r.Breakers
	b.share = r
	b.memory = func(ctx context.Context) []storeMemory {
		var out []storeMemory
		for _, m := range r.Memory(ctx) {
			out = append(out, storeMemory{server: m.Server, known: m.Known, maxBytes: m.MaxBytes, policy: m.Policy, evicts: m.Evicts()})
		}
		return out
	}
	b.mem = newMemoryGauges(reg, "ratelimit.redis.")
	return nil
}

// openMemcached makes b's store a Memcached store, with its statistics.
func (b *storeHandle) openMemcached(ctx context.Context, set *settings.Settings, reg *stats.Registry, tracer trace.Tracer) error {
	cfg, err := memcacheConfig(set)
	if err != nil {
		return err
	}
	cfg.Tracer = tracer
	cfg.RoundTrip = reg.Timer("ratelimit.memcache.round_trip").Record
	cfg.Answered = b.answered
	m, err := memcached.New(ctx, cfg)
	if err != nil {
		return err
	}
	reg.CounterFunc("ratelimit.memcache.round_trips", func() uint64 { rt, _ := m.Counters(); return rt })
	reg.CounterFunc("ratelimit.memcache.ops", func() uint64 { _, ops := m.Counters(); return ops })
	reg.CounterFunc("ratelimit.memcache.load_shed", m.Shed)
	registerBreakers(reg, "ratelimit.memcache.", m.Breakers)
	memcacheOpStats(reg, m)
	b.store, b.healthy, b.close, b.started = m, m.Healthy, func() { _ = m.Close() }, m.WaitStarted
	// The timeout is the store's, its default included: 0 would be the
	// memory store's, which gets no REQUEST_TIMEOUT (issue 24).
	b.timeout, b.keyFormat, b.breakers = m.Timeout(), keyFormat(set), m.Breakers
	b.memory = func(ctx context.Context) []storeMemory {
		var out []storeMemory
		for _, s := range m.Memory(ctx) {
			policy := "evictions off (-M)"
			if s.Evictions {
				policy = "evictions on"
			}
			out = append(out, storeMemory{server: s.Server, known: s.Known, maxBytes: s.MaxBytes, policy: policy, evicts: s.Evicts()})
		}
		return out
	}
	b.mem = newMemoryGauges(reg, "ratelimit.memcache.")
	return nil
}

// pipelineBuckets are the Prometheus buckets of the commands per Redis
// pipeline: powers of two up to the most commands one pipeline takes.
var pipelineBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}

// redisRoundTrips returns the Redis store's round-trip observer: each
// pipeline's duration in the timer ratelimit.redis.round_trip and its
// commands in the histogram ratelimit.redis.pipeline_commands.
func redisRoundTrips(reg *stats.Registry) func(time.Duration, int) {
	rt := reg.Timer("ratelimit.redis.round_trip")
	commands := reg.Histogram("ratelimit.redis.pipeline_commands", pipelineBuckets)
	return func(d time.Duration, n int) {
		rt.Record(d)
		commands.Observe(uint64(n))
	}
}

// registerBreakers registers a store's circuit-breaker statistics under
// prefix: breaker_open (gauge: servers whose breaker is open now),
// breaker_trips (times one opened) and breaker_open_rejections (requests
// refused at once by an open breaker).
func registerBreakers(reg *stats.Registry, prefix string, f func() breaker.Stats) {
	reg.GaugeFunc(prefix+"breaker_open", func() int64 { return f().Open })
	reg.CounterFunc(prefix+"breaker_trips", func() uint64 { return f().Trips })
	reg.CounterFunc(prefix+"breaker_open_rejections", func() uint64 { return f().Rejections })
}

// breakerConfig is the circuit breaker of the Redis and Memcached stores.
// It trips on evidence that a server fails, judged against the store's own
// timeout (REDIS_TIMEOUT; Memcached's 500 ms), never on requests that ran
// out of their own budget (see breaker).
func breakerConfig(set *settings.Settings) breaker.Config {
	return breaker.Config{
		Failures:      set.StoreBreakerFailures,
		ProbeInterval: set.StoreBreakerProbeInterval,
	}
}

// redisPoolStats registers the anchor's connection statistics of one
// Redis under prefix: cx_active (a gauge), cx_total and cx_local_close.
func redisPoolStats(reg *stats.Registry, prefix string, r *redis.Store, perSecond bool) {
	reg.GaugeFunc(prefix+".cx_active", func() int64 { return r.Conns(perSecond).Active() })
	reg.CounterFunc(prefix+".cx_total", func() uint64 { return r.Conns(perSecond).Opened })
	reg.CounterFunc(prefix+".cx_local_close", func() uint64 { return r.Conns(perSecond).Closed })
}

// memcacheOpStats registers the anchor's memcache command statistics,
// told apart by their "code" tag as there.
func memcacheOpStats(reg *stats.Registry, m *memcached.Store) {
	code := func(c string) stats.Label { return stats.Label{Name: "code", Value: c} }
	for _, c := range []struct {
		name string
		f    func(memcached.OpStats) uint64
		tags []stats.Label
	}{
		{"increment", func(o memcached.OpStats) uint64 { return o.IncrementSuccess }, []stats.Label{code("success")}},
		{"increment", func(o memcached.OpStats) uint64 { return o.IncrementMiss }, []stats.Label{code("miss")}},
		{"increment", func(o memcached.OpStats) uint64 { return o.IncrementError }, []stats.Label{code("error")}},
		{"add", func(o memcached.OpStats) uint64 { return o.AddSuccess }, []stats.Label{code("success")}},
		{"add", func(o memcached.OpStats) uint64 { return o.AddNotStored }, []stats.Label{code("not_stored")}},
		{"add", func(o memcached.OpStats) uint64 { return o.AddError }, []stats.Label{code("error")}},
		{"multiget", func(o memcached.OpStats) uint64 { return o.MultiGetSuccess }, []stats.Label{code("success")}},
		{"multiget", func(o memcached.OpStats) uint64 { return o.MultiGetError }, []stats.Label{code("error")}},
		{"keys_requested", func(o memcached.OpStats) uint64 { return o.KeysRequested }, nil},
		{"keys_found", func(o memcached.OpStats) uint64 { return o.KeysFound }, nil},
	} {
		reg.CounterFunc("ratelimit.memcache."+c.name, func() uint64 { return c.f(m.OpStats()) }, c.tags...)
	}
}

// memcacheConfig turns the MEMCACHE_* settings into the Memcached store's
// Config, its TLS from the MEMCACHE_TLS_* files. As many calls may wait
// for a connection slot as MAX_CONCURRENT_REQUESTS lets in (the store's
// own bound without it): a healthy memcached sheds nothing the service
// admitted.
func memcacheConfig(set *settings.Settings) (memcached.Config, error) {
	cfg := memcached.Config{
		SRV:                 set.MemcacheSrv,
		SRVRefresh:          set.MemcacheSrvRefresh,
		Conns:               set.MemcacheConnections,
		MaxIdleConns:        set.MemcacheMaxIdleConns,
		MaxConns:            set.MemcacheMaxInFlight,
		MaxWaiting:          set.MaxConcurrentRequests,
		ExpirationJitterMax: time.Duration(set.ExpirationJitterMaxSeconds) * time.Second,
		Breaker:             breakerConfig(set),
	}
	// The store's client honours each request's budget (REQUEST_TIMEOUT);
	// its own Timeout (500ms, gomemcache's) bounds dials and closes a
	// connection whose answers are that late.
	for _, a := range set.MemcacheHostPort {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Addrs = append(cfg.Addrs, a)
		}
	}
	if set.MemcacheTLS {
		t, err := memcached.TLSConfig(memcached.TLSFiles{
			ClientCert:               set.MemcacheTLSClientCert,
			ClientKey:                set.MemcacheTLSClientKey,
			CACert:                   set.MemcacheTLSCACert,
			SkipHostnameVerification: set.MemcacheTLSSkipHostnameVerification,
		})
		if err != nil {
			return memcached.Config{}, fmt.Errorf("server: MEMCACHE_TLS: %w", err)
		}
		cfg.TLS = t
	}
	return cfg, nil
}

// redisConfig turns the REDIS_* settings into the Redis store's Config. As
// many requests may wait for each Redis as MAX_CONCURRENT_REQUESTS lets in
// (the store's own bound without it): a healthy Redis sheds nothing the
// service admitted.
func redisConfig(set *settings.Settings) (redis.Config, error) {
	tlsFor := func(on bool) (*tls.Config, error) {
		if !on {
			return nil, nil
		}
		return redis.TLSConfig(redis.TLSFiles{
			ClientCert:               set.RedisTLSClientCert,
			ClientKey:                set.RedisTLSClientKey,
			CACert:                   set.RedisTLSCACert,
			SkipHostnameVerification: set.RedisTLSSkipHostnameVerification,
		})
	}
	t, err := tlsFor(set.RedisTLS)
	if err != nil {
		return redis.Config{}, fmt.Errorf("server: REDIS_TLS: %w", err)
	}
	cfg := redis.Config{
		Type:                        set.RedisType,
		SocketType:                  set.RedisSocketType,
		URL:                         set.RedisURL,
		Auth:                        set.RedisAuth,
		SentinelAuth:                set.RedisSentinelAuth,
		TLS:                         t,
		PoolSize:                    set.RedisPoolSize,
		Timeout:                     set.RedisTimeout,
		PipelineWindow:              set.RedisPipelineWindow,
		PipelineLimit:               set.RedisPipelineLimit,
		MaxQueue:                    set.MaxConcurrentRequests,
		ExpirationJitterMax:         time.Duration(set.ExpirationJitterMaxSeconds) * time.Second,
		HealthCheckActiveConnection: set.RedisHealthCheckActiveConnection,
		StartupInitialInterval:      set.RedisStartupInitialInterval,
		StartupMaxInterval:          set.RedisStartupMaxInterval,
		Breaker:                     breakerConfig(set),
		Stall:                       redisStall(set.RedisStallTimeout),
	}
	if set.RedisPerSecond {
		pt, err := tlsFor(set.RedisPerSecondTLS)
		if err != nil {
			return redis.Config{}, fmt.Errorf("server: REDIS_PERSECOND_TLS: %w", err)
		}
		cfg.PerSecond = &redis.Config{
			Type:           set.RedisPerSecondType,
			SocketType:     set.RedisPerSecondSocketType,
			URL:            set.RedisPerSecondURL,
			Auth:           set.RedisPerSecondAuth,
			SentinelAuth:   set.RedisPerSecondSentinelAuth,
			TLS:            pt,
			PoolSize:       set.RedisPerSecondPoolSize,
			Timeout:        set.RedisPerSecondTimeout,
			PipelineWindow: set.RedisPerSecondPipelineWindow,
			PipelineLimit:  set.RedisPerSecondPipelineLimit,
			MaxQueue:       set.MaxConcurrentRequests,
		}
	}
	return cfg, nil
}

// budget is d, a bound of the request budget the service gives this store
// (REQUEST_TIMEOUT), for the stores that wait on the network; none for the
// memory store, which never waits for I/O (so a request pays for no timer).
func (b *storeHandle) budget(d time.Duration) time.Duration {
	if b.timeout == 0 {
		return 0
	}
	return d
}

// redisStall is the Redis store's Stall for REDIS_STALL_TIMEOUT, whose 0
// turns the bound off (the store's zero is its default).
func redisStall(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// redisTimeout is the longer of the main and per-second timeouts: a request
// with both kinds of rule waits for both Redis at once.
func redisTimeout(cfg redis.Config) time.Duration {
	if cfg.PerSecond != nil {
		return max(cfg.Timeout, cfg.PerSecond.Timeout)
	}
	return cfg.Timeout
}

// storeHealth reports the store's health to a Health, and logs each change
// of the store's state at warn level: its health, and its circuit breakers
// opening or all closing again. It reads the store when the store first
// answers (storeHandle.answered), and then every healthPoll (run). With a
// local store beside the shared one (STORE_FAILURE_MODE=local) the
// instance answers whatever the shared store does, so its health does not
// follow the shared store's: an orchestrator would otherwise take every
// instance out of rotation during the outage the mode is there to ride
// out. It is safe for concurrent use.
type storeHealth struct {
	b   *storeHandle
	h   *Health
	log *slog.Logger

	// mu serialises check, and guards st.
	mu sync.Mutex
	st storeState
}

// watchStore makes the storeHealth of b, which b tells of its first answer
// from now on.
func watchStore(b *storeHandle, h *Health, log *slog.Logger) *storeHealth {
	w := &storeHealth{b: b, h: h, log: log}
	b.health.Store(w)
	return w
}

// check reads the store's health and reports it.
func (w *storeHealth) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	healthy := w.b.healthy()
	if w.st.log(w.log, healthy, w.b.breakers) {
		w.b.askMemory()
	}
	w.h.SetStore(healthy || w.b.alone)
}

// run reports the store's health until ctx is done. The first report waits
// for the store's first answer, at most the store's own timeout, so that a
// store connecting at startup is reported (and logged) as it is, not as not
// answering yet; until then health is unhealthy, as a Health starts.
func (w *storeHealth) run(ctx context.Context) {
	if w.b.started != nil && !w.b.alone && w.b.timeout > 0 {
		sctx, cancel := context.WithTimeout(ctx, w.b.timeout)
		_ = w.b.started(sctx)
		cancel()
	}
	w.check()
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check()
		}
	}
}

// storeState is what storeHealth last logged of the store.
type storeState struct {
	seen    bool
	healthy bool
	open    int64
}

// log logs what changed since the last call: the first call only a store
// that does not answer yet. It reports whether the store has just
// answered: for the first time, or again after an outage (unhealthy, or a
// breaker open).
func (st *storeState) log(log *slog.Logger, healthy bool, breakers func() breaker.Stats) (back bool) {
	var open int64
	if breakers != nil {
		open = breakers().Open
	}
	switch {
	case !st.seen && !healthy:
		log.Warn("the store does not answer yet")
	case st.seen && st.healthy && !healthy:
		log.Warn("the store stopped answering")
	case st.seen && !st.healthy && healthy:
		log.Warn("the store answers again")
	}
	switch {
	case open > st.open:
		log.Warn("store circuit breakers opened: requests for those servers are refused at once", "open", open)
	case open == 0 && st.open > 0:
		log.Warn("store circuit breakers all closed again")
	}
	back = healthy && open == 0 && (!st.seen || !st.healthy || st.open > 0)
	st.seen, st.healthy, st.open = true, healthy, open
	return back
}
