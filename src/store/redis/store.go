// Package redis is the Redis store: it keeps every key's state in Redis
// (single, Sentinel or Cluster), so that any number of stateless instances
// share their counts. Fixed windows use INCRBY and EXPIRE on
// envoyproxy/ratelimit's keys, so a rolling upgrade from the anchor keeps
// counting; the other algorithms run one Lua script per op that mirrors the
// limiter's pure function. Concurrent requests share pipelines.
//
// It knows the limiter's Store contract and nothing above it: no rules
// tree, no settings, no protos.
package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// errClosed is the cause of errors after Close.
var errClosed = errors.New("store closed")

// errBadReply is wrapped by the error of a reply no correct Redis gives.
// One that breaks replyGuard's bounds, answers no command or is not RESP
// closes its connection, and its requests fail with ErrUnavailable; a
// well-formed reply of a value no command can have (nil to INCRBY, a
// script reply of another length or out of range) fails only its request.
var errBadReply = errors.New("reply refused")

// Store is a limiter.Store backed by Redis. It is safe for concurrent use.
// Create it with New; the zero value is not usable.
//
// Atomicity: every op is applied atomically (INCRBY, or one Lua script on
// its one key). An AllOrNothing batch is one script over all its keys, so
// the check and the recording are one atomic step, on a single Redis or a
// Sentinel group. A script cannot span Redis Cluster hash slots (nor the
// main and the per-second Redis), so there the batch runs one
// all-or-nothing script per slot in the same round trip; if one refused
// while another recorded, a second round trip takes the recorded ops back
// (see compensate). The result is the contract's, but not in one instant:
// for about one round trip other requests can see the hits being taken back
// (they may be refused; nothing is ever over-admitted), and if Redis fails
// in between, those hits stay counted.
type Store struct {
	cfg       Config
	main      *backend
	perSecond *backend // nil: every op goes to main

	ops, roundTrips, shed atomic.Uint64

	ctx    context.Context // ends at Close; bounds workers and probes
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
}

var _ limiter.Store = (*Store)(nil)

// New connects a Store as cfg says. It does not wait for Redis: with Redis
// down it returns a working Store whose ops fail with limiter.ErrUnavailable
// and whose Healthy is false until Redis first answers (see WaitStarted).
// It fails only for a bad cfg.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	useSlog()
	s := &Store{cfg: cfg}
	// The Store outlives New's ctx: it runs until Close.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.main, err = s.newBackend("redis", cfg)
	if err != nil {
		return nil, err
	}
	if cfg.PerSecond != nil {
		ps, err := cfg.PerSecond.withDefaults()
		if err != nil {
			_ = s.main.client.Close()
			return nil, fmt.Errorf("persecond: %w", err)
		}
		ps.Breaker, ps.Stall = cfg.Breaker, cfg.Stall
		if s.perSecond, err = s.newBackend("redis persecond", ps); err != nil {
			_ = s.main.client.Close()
			return nil, err
		}
	}
	for _, be := range s.backends() {
		for _, w := range be.workers {
			s.wg.Go(func() { be.work(s.ctx, w) })
		}
		s.wg.Go(func() { s.probe(be) })
		s.wg.Go(func() { be.breakers.Run(s.ctx, func(ctx context.Context) { s.probeBreakers(ctx, be) }) })
	}
	return s, nil
}

func (s *Store) backends() []*backend {
	if s.perSecond != nil {
		return []*backend{s.main, s.perSecond}
	}
	return []*backend{s.main}
}

// goredisPoolSize is the pool size given to go-redis. Our workers bound the
// connections in use (PoolSize per node); go-redis's PoolSize also sets how
// many failed dials make its pool stop dialling and probe only once a
// second, which would fail the first requests after Redis comes back. A
// large value keeps dialling on every attempt.
const goredisPoolSize = 1 << 12

func (s *Store) newBackend(name string, cfg Config) (*backend, error) {
	ep, err := ParseURL(cfg.Type, cfg.URL)
	if err != nil {
		return nil, err
	}
	user, password := ParseAuth(cfg.Auth)
	be := &backend{
		name:       name,
		window:     cfg.PipelineWindow,
		limit:      maxPipelineCommands,
		deep:       deepQueue,
		timeout:    cfg.Timeout,
		maxQueue:   cfg.MaxQueue,
		full:       fmt.Errorf("%s: %w: %d requests wait for Redis already (MaxQueue)", name, limiter.ErrOverloaded, cfg.MaxQueue),
		shed:       &s.shed,
		closed:     unavailable(name, errClosed),
		answered:   make(chan struct{}),
		onAnswered: s.cfg.Answered,
		breakers:   breaker.NewGroup(name, cfg.Breaker),
	}
	if cfg.PipelineLimit > 0 {
		be.limit = cfg.PipelineLimit
	}
	hook := countHook{n: &s.roundTrips, observe: s.cfg.RoundTrip}
	if be.breakers == nil {
		// A silence is the breaker's evidence: without a breaker every
		// request tries the server, and waits for it (see Config.Stall).
		cfg.Stall = -1
	}
	dial := dialer(cfg, &be.conns, &be.paces)
	// One set of client options for every topology: no retries (a lost
	// reply must not count twice), every wait bounded by the timeout, RESP2
	// without CLIENT SETINFO, and go-redis's pool kept large (see
	// goredisPoolSize); the workers cap the connections in use.
	opts := &goredis.UniversalOptions{
		Addrs:                    ep.Addrs,
		MasterName:               ep.MasterName,
		Username:                 user,
		Password:                 password,
		Dialer:                   dial,
		Protocol:                 2,
		DisableIdentity:          true,
		MaxRetries:               -1,
		DialTimeout:              cfg.Timeout,
		DialerRetries:            1,
		ReadTimeout:              cfg.Timeout,
		WriteTimeout:             cfg.Timeout,
		ContextTimeoutEnabled:    true,
		PoolSize:                 goredisPoolSize,
		PoolTimeout:              cfg.Timeout,
		PipelinePoolSize:         -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	switch cfg.Type {
	case TypeSingle:
		o := opts.Simple()
		o.Network = cfg.SocketType // UniversalOptions has no network
		c := goredis.NewClient(o)
		c.AddHook(hook)
		be.server = be.addBreaker(c, ep.Addrs[0])
		be.client = c
	case TypeSentinel:
		opts.SentinelUsername, opts.SentinelPassword = ParseAuth(cfg.SentinelAuth)
		c := goredis.NewFailoverClient(opts.Failover())
		c.AddHook(hook)
		// One breaker for the group: whichever server is master.
		be.server = be.addBreaker(c, ep.MasterName)
		be.client = c
		be.oneServer.Store(true)
	case TypeCluster:
		c := goredis.NewClusterClient(opts.Cluster())
		// Count round trips and keep a breaker per node: the cluster
		// client splits a pipeline into one pipeline per node.
		c.OnNewNode(func(n *goredis.Client) {
			n.AddHook(hook)
			be.addBreaker(n, n.Options().Addr)
		})
		be.client, be.cluster = c, true
	}
	be.initQueue(cfg.PoolSize)
	for _, w := range be.workers {
		w.pipe = be.client.Pipeline()
	}
	return be, nil
}

// countHook counts the pipelines that reached Redis, and times them for
// Config.RoundTrip.
type countHook struct {
	n       *atomic.Uint64
	observe func(time.Duration, int)
}

func (countHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		var start time.Time
		if h.observe != nil {
			start = time.Now()
		}
		err := next(ctx, cmds)
		if err == nil || isRedisError(err) {
			h.n.Add(1)
			if h.observe != nil {
				h.observe(time.Since(start), len(cmds))
			}
		}
		return err
	}
}

// probe pings a backend until it first answers, backing off from
// StartupInitialInterval to StartupMaxInterval, then, with
// HealthCheckActiveConnection, every HealthCheckInterval to keep
// Healthy current while no traffic flows.
func (s *Store) probe(be *backend) {
	wait := s.cfg.StartupInitialInterval
	for !be.hasAnswered() {
		if s.ping(be) == nil {
			s.identify(be)
			s.loadScripts(be)
			be.markUp()
			break
		}
		select {
		case <-s.ctx.Done():
			return
		case <-be.answered:
		case <-time.After(wait):
		}
		wait = min(2*wait, s.cfg.StartupMaxInterval)
	}
	if !s.cfg.HealthCheckActiveConnection {
		return
	}
	t := time.NewTicker(s.cfg.HealthCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if s.ping(be) == nil {
			be.markUp()
		} else {
			be.up.Store(false)
		}
	}
}

// identify sets be.oneServer when a SINGLE address is a Redis server
// (INFO names its version), not a proxy sharding keys over several: the
// anchor's default deployment puts twemproxy there, which closes the
// connection on INFO. It runs before the backend is first marked up, so
// WaitStarted returns with the answer known.
func (s *Store) identify(be *backend) {
	defer recovered(nil)
	c, ok := be.client.(*goredis.Client)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, be.timeout)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err == nil && strings.Contains(info, "redis_version:") {
		be.oneServer.Store(true)
	}
}

// loadScripts loads every script into a Redis server or, on a Cluster,
// into every master, before the backend is first marked up, so that the
// first requests do not each meet NOSCRIPT (one more round trip) on a
// script of their own. Behind a proxy the first EVALSHA of each script
// falls back to EVAL instead (see retryNoScript). Best effort: a failure
// leaves that fallback.
func (s *Store) loadScripts(be *backend) {
	defer recovered(nil)
	ctx, cancel := context.WithTimeout(s.ctx, be.timeout)
	defer cancel()
	// One command per script (a handful, once): not a pipeline, which
	// the round-trip counter would count as traffic.
	load := func(ctx context.Context, c *goredis.Client) error {
		for _, src := range scriptSources {
			if err := c.ScriptLoad(ctx, src).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	switch c := be.client.(type) {
	case *goredis.ClusterClient:
		_ = c.ForEachMaster(ctx, load)
	case *goredis.Client:
		if be.oneServer.Load() {
			_ = load(ctx, c)
		}
	}
}

func (s *Store) ping(be *backend) (err error) {
	defer recovered(&err)
	ctx, cancel := context.WithTimeout(s.ctx, be.timeout)
	defer cancel()
	if c, ok := be.client.(*goredis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			return n.Ping(ctx).Err()
		})
	}
	return be.client.Ping(ctx).Err()
}

// Healthy reports whether the store can serve. Before Redis has answered
// once it is false (the service starts anyway, unhealthy). Afterwards it is
// true, unless HealthCheckActiveConnection is set: then it is false while
// the last round trip or probe to Redis failed, as envoyproxy/ratelimit's
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION does. With a per-second Redis, both
// must be healthy. An open circuit breaker (Config.Breaker) counts as a
// failed round trip: with HealthCheckActiveConnection, Healthy is false
// while a breaker of either Redis is open (on a Cluster, that of one
// master is enough).
func (s *Store) Healthy() bool {
	for _, be := range s.backends() {
		if !be.hasAnswered() {
			return false
		}
		if s.cfg.HealthCheckActiveConnection && (!be.up.Load() || be.breakers.AnyOpen()) {
			return false
		}
	}
	return true
}

// WaitStarted blocks until every Redis has answered once, or ctx ends. The
// server may use it to give up after REDIS_STARTUP_MAX_ELAPSED_TIME.
func (s *Store) WaitStarted(ctx context.Context) error {
	for _, be := range s.backends() {
		select {
		case <-be.answered:
		case <-ctx.Done():
			return fmt.Errorf("redis: waiting for %s: %w", be.name, ctx.Err())
		}
	}
	return nil
}

// Counters returns the cumulative number of pipelines that reached Redis
// (one per node for a cluster) and of ops applied (ratelimit.redis.round_trips,
// ratelimit.redis.ops). ops/roundTrips is the mean pipeline depth.
func (s *Store) Counters() (roundTrips, ops uint64) { return s.roundTrips.Load(), s.ops.Load() }

// Shed returns the cumulative number of requests refused at once because
// MaxQueue requests were waiting for that Redis already
// (ratelimit.redis.load_shed). A request with both per-second and other
// ops counts once per Redis that refused it.
func (s *Store) Shed() uint64 { return s.shed.Load() }

// Close stops the workers and closes the connections. Do calls in flight or
// made afterwards fail with limiter.ErrUnavailable. It does not wait for
// Redis: round trips in flight are cut short, so that Close returns at once
// even when Redis has stopped answering (the server's shutdown drain
// relies on it).
func (s *Store) Close() error {
	var err error
	s.closed.Do(func() {
		// Cancelling ends dials and probes' waits, but not a read from
		// Redis: go-redis bounds that by a deadline (Timeout, 10 s by
		// default), never by ctx. Closing the clients closes their
		// connections, in use or idle, which ends those reads (their
		// requests fail); only then wait for the workers, and fail the
		// requests they left in the queues (drain).
		s.cancel()
		for _, be := range s.backends() {
			err = errors.Join(err, be.client.Close())
		}
		s.wg.Wait()
		for _, be := range s.backends() {
			be.drain()
		}
	})
	return err
}

// Do applies the batch: see limiter.Store. One request takes one round trip
// per Redis (both in parallel when it has per-second and other ops), shared
// with the concurrent requests of the same pipeline; a second one only after
// NOSCRIPT (Redis lost the script) or to take back the ops of a split
// AllOrNothing batch (see compensate). A zero b.Now is set to the current
// time. When MaxQueue requests wait for a Redis already, Do fails at once
// with an error wrapping limiter.ErrOverloaded.
func (s *Store) Do(ctx context.Context, b *limiter.Batch) error {
	if err := ctx.Err(); err != nil {
		return unavailable(s.main.name, err)
	}
	n := b.SizeResults()
	if n == 0 {
		return nil
	}
	s.ops.Add(uint64(n))
	if b.Now.IsZero() {
		b.Now = time.Now()
	}
	reqs, bes := s.split(ctx, b, n)
	// An open circuit breaker fails the request at once, before it costs
	// a command or a place in a queue.
	for k, r := range reqs {
		if r == nil {
			continue
		}
		if err := bes[k].admit(ctx, r, b); err != nil {
			for _, r := range reqs {
				if r != nil {
					putRequest(r)
				}
			}
			return err
		}
	}
	for k, r := range reqs {
		if r != nil {
			s.build(r, b, bes[k])
		}
	}
	recycle, err := s.exchange(ctx, b, reqs, bes)
	if err == nil && b.AllOrNothing {
		err = s.compensate(ctx, b, reqs, bes)
	}
	for k, r := range reqs {
		if r != nil && recycle[k] {
			putRequest(r)
		}
	}
	return err
}

// split makes the requests of b's n ops: one to the main Redis, or, with
// a per-second Redis, one to each Redis that has ops of b.
func (s *Store) split(ctx context.Context, b *limiter.Batch, n int) (reqs [2]*request, bes [2]*backend) {
	if s.perSecond == nil {
		r := getRequest(ctx)
		for i := range n {
			r.idx = append(r.idx, i)
		}
		reqs[0], bes[0] = r, s.main
		return reqs, bes
	}
	for i := range b.Ops {
		k, be := 0, s.main
		if b.Ops[i].PerSecond {
			k, be = 1, s.perSecond
		}
		if reqs[k] == nil {
			reqs[k], bes[k] = getRequest(ctx), be
		}
		reqs[k].idx = append(reqs[k].idx, i)
	}
	return reqs, bes
}

// exchange sends the built requests and decodes their replies into b.
// With both Redis, it queues on both before waiting for either, so that
// the two round trips overlap. recycle says which requests are the
// caller's to put back (a request given up on stays with its pipeline).
func (s *Store) exchange(ctx context.Context, b *limiter.Batch, reqs [2]*request, bes [2]*backend) (recycle [2]bool, err error) {
	stop := s.ctx.Done()
	var errs [2]error
	var spans [2]trace.Span
	for k, r := range reqs {
		if r != nil {
			recycle[k] = true
			spans[k] = s.startSpan(ctx, bes[k], r)
			errs[k] = bes[k].send(ctx, stop, r)
		}
	}
	for k, r := range reqs {
		if r == nil {
			continue
		}
		if errs[k] != nil {
			endSpan(spans[k], r, false, errs[k])
			continue
		}
		// A deadline that passes while the request waits (for a
		// connection, or for its pipeline's replies) is the request's,
		// not evidence that Redis fails: under load this process may be
		// what is late. Only the round trip itself, bounded by
		// REDIS_TIMEOUT, counts for the breaker (breakerHook).
		recycle[k], errs[k] = bes[k].wait(ctx, r)
		if errs[k] == nil {
			errs[k] = s.decode(bes[k], r, b)
		}
		endSpan(spans[k], r, recycle[k], errs[k])
	}
	return recycle, errors.Join(errs[0], errs[1])
}

// compensate completes an AllOrNothing batch that needed more than one
// script: on a Cluster, one per hash slot; behind a proxy, one per key;
// with a per-second Redis, one per Redis. Each script is all-or-nothing by itself; when one refused its ops
// while another recorded its own, compensate takes the recorded ops back
// with undoLua in a second round trip and reports their unchanged state,
// as the Batch contract asks. Between the two round trips other requests
// can see the hits that are being taken back: they may be refused, never
// over-admitted. If the second round trip fails, the hits stay recorded
// (counted against the client, never for it) and Do returns the error.
func (s *Store) compensate(ctx context.Context, b *limiter.Batch, reqs [2]*request, bes [2]*backend) error {
	refused, recorded := false, false
	for _, r := range reqs {
		if r == nil {
			continue
		}
		for _, c := range r.cmds {
			vals, err := c.(scriptCmd).Result()
			if err != nil || len(vals) == 0 || vals[0] != 0 && vals[0] != 1 {
				return fmt.Errorf("redis: %w: script reply %v, %v", errBadReply, vals, err)
			}
			if vals[0] == 1 {
				recorded = true
			} else {
				refused = true
			}
		}
	}
	if !refused || !recorded {
		return nil
	}
	var errs [2]error
	for k, r := range reqs {
		if r != nil {
			errs[k] = s.undo(ctx, bes[k], r, b)
		}
	}
	return errors.Join(errs[0], errs[1])
}

// undo takes back the ops of r's script calls that recorded them.
func (s *Store) undo(ctx context.Context, be *backend, r *request, b *limiter.Batch) error {
	u := getRequest(ctx)
	var undone [][]int // per undo command, the batch's op indexes
	for ci, c := range r.cmds {
		vals := c.(scriptCmd).Val()
		if vals[0] != 1 {
			continue
		}
		var ops []int
		var keys, args []any
		for j, i := range r.idx {
			p := r.plan[j]
			if int(p.cmd) != ci || b.Ops[i].Shadow {
				// A shadow op is never taken back with the batch
				// (limiter.Op.Shadow).
				continue
			}
			op := &b.Ops[i]
			o := 1 + int(p.pos)*resultsPerOp
			ops = append(ops, i)
			keys = append(keys, stateKey(op))
			args = appendOpArgs(args, op, 0)
			args = append(args[:len(args)-1], // replace the TTL with the undo values
				strconv.FormatInt(vals[o+5], 10), strconv.FormatInt(vals[o+6], 10))
		}
		if len(ops) == 0 {
			continue
		}
		all := make([]any, 0, 4+len(keys)+len(args))
		all = append(all, "evalsha", undoSHA, strconv.Itoa(len(keys)))
		all = append(all, keys...)
		all = append(all, s.scriptNow(b))
		all = append(all, args...)
		u.cmds = append(u.cmds, scriptCmd{goredis.NewIntSliceCmd(context.Background(), all...)})
		u.ncmds++
		u.work += scriptWork * len(ops)
		undone = append(undone, ops)
	}
	if len(undone) == 0 { // shadow ops only
		putRequest(u)
		return nil
	}
	span := s.startSpan(ctx, be, u)
	recycle, err := be.submit(ctx, s.ctx.Done(), u)
	endSpan(span, u, recycle, err)
	if err == nil {
	replies:
		for ci, ops := range undone {
			vals, cerr := u.cmds[ci].(scriptCmd).Result()
			if cerr != nil {
				err = cmdError(be.name, b.Ops[ops[0]].Key, cerr)
				break
			}
			if len(vals) < 2*len(ops) {
				err = fmt.Errorf("%s: %w: undo reply has %d values, want %d", be.name, errBadReply, len(vals), 2*len(ops))
				break
			}
			for j, i := range ops {
				if vals[2*j] < 0 || uint64(vals[2*j]) > b.Ops[i].Capacity() || vals[2*j+1] < 0 {
					err = fmt.Errorf("%s: key %q: %w: undo reply %d, %d", be.name, b.Ops[i].Key, errBadReply, vals[2*j], vals[2*j+1])
					break replies
				}
				res := &b.Results[i]
				res.Remaining = uint64(vals[2*j])
				if b.Ops[i].Algorithm != rules.FixedWindow {
					res.ResetAfter = microseconds(vals[2*j+1])
				}
			}
		}
	}
	if recycle {
		putRequest(u)
	}
	return err
}

// build turns the ops r carries into Redis commands. Their arguments are
// pointers into r.vals, in slots of r.args, both kept with r across uses,
// and so are the commands themselves but on a Cluster (request.reuse),
// so that an op costs one allocation, its key's copy, once r has served a
// request of the same shape. The commands run under the worker's
// deadline, not under a context of their own.
func (s *Store) build(r *request, b *limiter.Batch, be *backend) {
	// Commands point into r.vals: it must not grow once they exist.
	r.vals = slices.Grow(r.vals[:0], len(r.idx))[:len(r.idx)]
	now := s.scriptNow(b)
	for j, i := range r.idx {
		// The limiter reuses the keys' memory after Do returns, and a
		// request whose caller gave up may still be sent: copy.
		r.vals[j] = opVals{key: stateKey(&b.Ops[i])}
	}
	r.plan = slices.Grow(r.plan[:0], len(r.idx))[:len(r.idx)]
	if b.AllOrNothing {
		s.scripts(r, b, be, 0, len(r.idx), "1", now)
		return
	}
	for j := 0; j < len(r.idx); {
		i := r.idx[j]
		op, v := &b.Ops[i], &r.vals[j]
		if g := op.Group; g != 0 && !be.perKey() {
			// One descriptor's limits: one script per hash slot,
			// applying each op as alone but in one atomic step.
			end := j + 1
			for end < len(r.idx) && b.Ops[r.idx[end]].Group == g {
				end++
			}
			s.scripts(r, b, be, j, end, "0", now)
			j = end
			continue
		}
		switch {
		case op.Refund && op.Hits > 0:
			// decideLua gives hits back (no lean script does), one op a
			// call: refunds are as frequent as the hits they follow, at
			// most, and cost one script either way.
			s.scripts(r, b, be, j, j+1, "0", now)
		case op.Algorithm == rules.FixedWindow && op.Hits == 0:
			r.plan[j] = opPlan{cmd: int32(len(r.cmds)), kind: kindGet}
			a := r.argv(2)
			a[0], a[1] = "get", &v.key
			r.cmds = append(r.cmds, stringCmd{command(r, be, a, goredis.NewStringCmd, resetString)})
			r.ncmds++
			r.work++
		case op.Algorithm == rules.FixedWindow:
			r.plan[j] = opPlan{cmd: int32(len(r.cmds)), kind: kindIncr}
			v.hits, v.ttl = op.Hits, s.ttl(op)
			a := r.argv(3)
			a[0], a[1], a[2] = "incrby", &v.key, &v.hits
			e := r.argv(3)
			e[0], e[1], e[2] = "expire", &v.key, &v.ttl
			r.cmds = append(r.cmds, intCmd{command(r, be, a, goredis.NewIntCmd, resetInt)})
			r.cmds = append(r.cmds, intCmd{command(r, be, e, goredis.NewIntCmd, resetInt)})
			r.ncmds += 2
			r.work += 2
		default:
			// The lean script of the op's algorithm (see leanHead).
			r.plan[j] = opPlan{cmd: int32(len(r.cmds)), kind: kindLean}
			v.setLean(op)
			a := r.argv(8)
			a[0], a[1], a[2], a[3], a[4] = "evalsha", leanSHAArgs[algorithmIndex(op.Algorithm)], "1", &v.key, now
			a[5], a[6], a[7] = &v.limit, &v.windowMicros, &v.hits
			r.cmds = append(r.cmds, scriptCmd{command(r, be, a, goredis.NewIntSliceCmd, resetScript)})
			r.ncmds++
			r.work += scriptWork
		}
		j++
	}
}

// scripts places the ops of r.idx[from:to] in decideLua calls, with aon
// ("1" or "0") as the all-or-nothing argument (followed by the marks of
// the call's shadow ops, see decideLua): as few calls as the
// deployment lets one script span, that is one on a single server, one per
// hash slot on a Cluster, and one per key when the server may be a
// sharding proxy (compensate then makes an AllOrNothing batch's calls
// all-or-nothing together).
func (s *Store) scripts(r *request, b *limiter.Batch, be *backend, from, to int, aon, now any) {
	cluster, perKey := be.cluster, be.perKey()
	clear(r.plan[from:to]) // kind 0: not placed yet
	for j := from; j < to; j++ {
		r.vals[j].set(&b.Ops[r.idx[j]], s.ttl(&b.Ops[r.idx[j]]))
	}
	for placed := from; placed < to; {
		cmd, slot, n := int32(len(r.cmds)), -1, 0
		for j := from; j < to; j++ {
			if r.plan[j].kind == kindScript {
				continue // in an earlier call
			}
			if perKey && n > 0 {
				continue
			}
			if cluster {
				ks := keySlot(r.vals[j].key)
				if slot == -1 {
					slot = ks
				} else if ks != slot {
					continue
				}
			}
			r.plan[j] = opPlan{cmd: cmd, pos: int32(n), kind: kindScript}
			n++
		}
		placed += n
		// evalsha sha numkeys keys... now aon args...
		a := r.argv(5 + (1+argsPerOp)*n)
		a[0], a[1], a[2] = "evalsha", decideSHAArg, countArg(n)
		keys, args := a[3:3+n], a[5+n:]
		a[3+n], a[4+n] = now, aon
		var shadows []byte // the ops' marks after aon, when one is a shadow op
		for j := from; j < to; j++ {
			if p := r.plan[j]; p.kind == kindScript && p.cmd == cmd {
				keys[p.pos] = &r.vals[j].key
				op := &b.Ops[r.idx[j]]
				r.vals[j].putArgs(args[int(p.pos)*argsPerOp:], op.Algorithm)
				if op.Shadow && aon == "1" {
					if shadows == nil {
						shadows = bytes.Repeat([]byte{'.'}, 1+n)
						shadows[0] = '1'
					}
					shadows[1+p.pos] = 's'
				}
			}
		}
		if shadows != nil {
			// Rare (shadow limits with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT):
			// a string of its own, see decideLua.
			a[4+n] = string(shadows)
		}
		r.cmds = append(r.cmds, scriptCmd{command(r, be, a, goredis.NewIntSliceCmd, resetScript)})
		r.ncmds++
		r.work += scriptWork * n
	}
}

// scriptNow is the script's time argument: "" for Redis TIME.
func (s *Store) scriptNow(b *limiter.Batch) any {
	if s.cfg.scriptClock {
		return strconv.FormatInt(b.Now.UnixMicro(), 10)
	}
	return ""
}

// ttl is a fixed-window key's TTL in seconds: the window plus a random
// jitter in [0, ExpirationJitterMax), as envoyproxy/ratelimit sets it.
func (s *Store) ttl(op *limiter.Op) int64 {
	ttl := max(int64(op.Window/time.Second), 1)
	if j := int64(s.cfg.ExpirationJitterMax / time.Second); j > 0 {
		ttl += rand.Int64N(j)
	}
	return ttl
}

// decode reads r's replies into b.Results. An op whose reply is an error
// leaves its Result as it was, and the others' are read: decode returns
// the first op's error (see limiter.Store).
func (s *Store) decode(be *backend, r *request, b *limiter.Batch) (first error) {
	for j, i := range r.idx {
		if err := s.decodeOp(be, r, b, j, i); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// decodeOp reads the reply of r's j-th op, b.Ops[i], into b.Results[i].
func (s *Store) decodeOp(be *backend, r *request, b *limiter.Batch, j, i int) error {
	p := r.plan[j]
	op := &b.Ops[i]
	c := r.cmds[p.cmd]
	if err := c.Err(); err != nil && !errors.Is(err, goredis.Nil) {
		if p.kind == kindIncr && isOverflow(err) {
			b.Results[i] = saturated(op, b.Now)
			return nil
		}
		return cmdError(be.name, op.Key, err)
	}
	switch p.kind {
	case kindIncr:
		expire := r.cmds[p.cmd+1].(intCmd)
		if err := expire.Err(); err != nil && !errors.Is(err, goredis.Nil) {
			return cmdError(be.name, op.Key, err)
		}
		after, err := incrResult(c.(intCmd), expire, op)
		if err != nil {
			return fmt.Errorf("%s: key %q: %w", be.name, op.Key, err)
		}
		_, b.Results[i] = limiter.FixedWindow(limiter.FixedWindowState{Count: after - op.Hits}, b.Now, *op)
	case kindGet:
		count, err := strconv.ParseUint(c.(stringCmd).Val(), 10, 64)
		if err != nil && !errors.Is(c.Err(), goredis.Nil) {
			return fmt.Errorf("%s: key %q: %w: not a counter: %w", be.name, op.Key, limiter.ErrData, err)
		}
		_, b.Results[i] = limiter.FixedWindow(limiter.FixedWindowState{Count: count}, b.Now, *op)
	case kindLean:
		res, err := leanResult(c.(scriptCmd))
		if err == nil {
			err = res.check(op)
		}
		if err != nil {
			return fmt.Errorf("%s: key %q: %w", be.name, op.Key, err)
		}
		b.Results[i] = toResult(res, op, b.Now)
	case kindScript:
		res, err := scriptResult(c.(scriptCmd), int(p.pos))
		if err == nil {
			err = res.check(op)
		}
		if err != nil {
			return fmt.Errorf("%s: key %q: %w", be.name, op.Key, err)
		}
		b.Results[i] = toResult(res, op, b.Now)
	}
	if op.Refund {
		b.Results[i].Allowed = true // a refund of 0 hits is a read, never refused
	}
	return nil
}

// incrResult returns the count a fixed window's INCRBY left, from its reply
// and its EXPIRE's (neither an error reply). A reply no Redis gives to
// them (nil to either, an EXPIRE other than 0 or 1) wraps errBadReply; a
// count below op.Hits means the key held a negative count, which no
// instance of this service writes, and wraps limiter.ErrData. Either way
// the op fails: a count read low would admit the client (issue 24).
func incrResult(incr, expire intCmd, op *limiter.Op) (uint64, error) {
	if errors.Is(incr.Err(), goredis.Nil) {
		return 0, fmt.Errorf("%w: nil to INCRBY", errBadReply)
	}
	if errors.Is(expire.Err(), goredis.Nil) {
		return 0, fmt.Errorf("%w: nil to EXPIRE", errBadReply)
	}
	if v := expire.Val(); v != 0 && v != 1 {
		return 0, fmt.Errorf("%w: %d to EXPIRE", errBadReply, v)
	}
	n := incr.Val()
	if n < 0 || uint64(n) < op.Hits {
		return 0, fmt.Errorf("%w: not a counter: INCRBY %d left %d (it held a negative count)", limiter.ErrData, op.Hits, n)
	}
	return uint64(n), nil
}

// saturated is the Result of a fixed-window op whose INCRBY would have
// passed 2^63-1, the top of Redis's integer range: Redis refused it and
// left the count where it was, within op.Hits of the top and over any
// limit. The count is reported at the top, as the limiter's contract has
// counts saturate; a client can neither wrap it nor turn the refusal into
// an outage. Later hits find it still over the limit, each saturating
// again once it reaches the top.
func saturated(op *limiter.Op, now time.Time) limiter.Result {
	read := *op
	read.Hits = 0
	_, r := limiter.FixedWindow(limiter.FixedWindowState{Count: math.MaxInt64}, now, read)
	return r
}

// isOverflow reports whether err is Redis refusing INCRBY past 2^63-1.
func isOverflow(err error) bool {
	return isRedisError(err) && strings.Contains(err.Error(), "increment or decrement would overflow")
}

// scriptReply is one op's part of decideLua's reply.
type scriptReply struct {
	allowed, before, after, remaining, resetMicros int64
}

// check returns an error wrapping errBadReply when res is no reply our
// scripts give for op: a flag other than 0 or 1, a negative count or
// time, more room left than the op's capacity; for a refund, a refusal or
// units after it other than before; for the others, units after the op
// fewer than before it or than its hits, or an admission past the
// capacity.
func (res scriptReply) check(op *limiter.Op) error {
	c := op.Capacity()
	switch {
	case res.allowed != 0 && res.allowed != 1,
		res.before < 0, res.after < 0, res.remaining < 0, res.resetMicros < 0,
		uint64(res.remaining) > c:
	case op.Refund && op.Hits > 0:
		// A refund is allowed and reads the state after it (a fixed
		// window may still be over its limit). One of 0 hits is a
		// read, made allowed by decode.
		if res.allowed == 1 && res.after == res.before {
			return nil
		}
	case res.after < res.before, uint64(res.after) < op.Hits,
		res.allowed == 1 && uint64(res.after) > c:
	default:
		return nil
	}
	return fmt.Errorf("%w: script reply %+v for a capacity of %d", errBadReply, res, c)
}

// scriptResult reads op pos's values from decideLua's reply c, which
// carries no error reply: a nil or a short reply wraps errBadReply.
func scriptResult(c scriptCmd, pos int) (scriptReply, error) {
	vals, err := c.Result()
	if err != nil {
		return scriptReply{}, fmt.Errorf("%w: script reply: %w", errBadReply, err)
	}
	o := 1 + pos*resultsPerOp
	if len(vals) < o+resultsPerOp {
		return scriptReply{}, fmt.Errorf("%w: script reply has %d values, want %d", errBadReply, len(vals), o+resultsPerOp)
	}
	return scriptReply{
		allowed:     vals[o],
		before:      vals[o+1],
		after:       vals[o+2],
		remaining:   vals[o+3],
		resetMicros: vals[o+4],
	}, nil
}

// leanResult reads a lean script's reply: one op's values, as decideLua's.
// As scriptResult, a nil reply or one of another length wraps errBadReply.
func leanResult(c scriptCmd) (scriptReply, error) {
	vals, err := c.Result()
	if err != nil {
		return scriptReply{}, fmt.Errorf("%w: script reply: %w", errBadReply, err)
	}
	if len(vals) != 5 {
		return scriptReply{}, fmt.Errorf("%w: script reply has %d values, want 5", errBadReply, len(vals))
	}
	return scriptReply{allowed: vals[0], before: vals[1], after: vals[2], remaining: vals[3], resetMicros: vals[4]}, nil
}

// toResult turns a script reply into the op's Result. A fixed window's
// ResetAfter comes from the pure function on the instance's clock, as its
// key does.
func toResult(res scriptReply, op *limiter.Op, now time.Time) limiter.Result {
	r := limiter.Result{
		Before:     uint64(res.before),
		After:      uint64(res.after),
		Allowed:    res.allowed == 1,
		Remaining:  uint64(res.remaining),
		ResetAfter: microseconds(res.resetMicros),
	}
	if op.Algorithm == rules.FixedWindow {
		r.ResetAfter = limiter.FixedWindowEnd(now, op.Window).Sub(time.Unix(now.Unix(), 0))
	}
	return r
}

// microseconds converts a script's µs to a Duration, saturating as the
// limiter's pure functions do: a token bucket's TAT may lie up to 2^63 µs
// ahead, past the largest Duration.
func microseconds(us int64) time.Duration {
	switch {
	case us <= 0:
		return 0
	case us > math.MaxInt64/int64(time.Microsecond):
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// unavailable wraps a failure to reach Redis.
func unavailable(name string, err error) error {
	return fmt.Errorf("%s: %w: %w", name, limiter.ErrUnavailable, err)
}

// cmdError classifies a command's error: Redis refusing the op for its data
// or its key (isDataError) wraps limiter.ErrData; Redis refusing the op's
// write for lack of memory (isOOM) wraps limiter.ErrOverloaded;
// everything else (transport errors, timeouts, LOADING, READONLY,
// CLUSTERDOWN, NOAUTH, WRONGPASS, BUSY ...) means Redis cannot serve and
// wraps limiter.ErrUnavailable.
func cmdError(name, key string, err error) error {
	switch {
	case isDataError(err):
		return fmt.Errorf("%s: key %q: %w: %w", name, key, limiter.ErrData, err)
	case isOOM(err):
		return fmt.Errorf("%s: key %q: %w: %w: %w", name, key, limiter.ErrOverloaded, limiter.ReasonOutOfMemory, err)
	}
	return unavailable(name, err)
}

// isOOM reports whether err is Redis refusing a write because its memory
// is at maxmemory (with maxmemory-policy noeviction, or nothing left it
// may evict): "OOM command not allowed when used memory > 'maxmemory'",
// from the command or from inside a script. It is an answer about that
// write, not an outage (issue 24): Redis serves the reads and the writes
// that need no memory, and frees memory as keys expire, so it neither
// trips a breaker nor marks Redis down; the request fails with
// ResourceExhausted, never OK.
func isOOM(err error) bool {
	if !isRedisError(err) {
		return false
	}
	code, _, _ := strings.Cut(scriptCause(err.Error()), " ")
	return code == "OOM"
}

// isDataError reports whether err is Redis refusing a command for what its
// key holds, not for its own state: a key of another type (WRONGTYPE), a
// value that is not a counter, a count at the top of its range, or an error
// our script raised on such a value. The classes a client's data can
// cause are listed, and everything else is an outage: the other way
// round, a new server error would let one client's key mark Redis down
// for everyone (see exec), while here it costs that client an Internal
// error and the operators a log line.
func isDataError(err error) bool {
	if !isRedisError(err) {
		return false
	}
	msg := scriptCause(err.Error())
	code, text, _ := strings.Cut(msg, " ")
	switch code {
	case "WRONGTYPE":
		return true
	case "ERR":
		// A Lua error in our script ("ERR user_script:12: attempt to
		// compare nil with number") comes from a value it did not write.
		return strings.HasPrefix(text, "value is not an integer") ||
			strings.HasPrefix(text, "increment or decrement would overflow") ||
			strings.HasPrefix(text, "user_script:")
	}
	// A Lua error as Redis 6 reports it, unwrapped by scriptCause.
	return strings.HasPrefix(msg, "user_script:")
}

// scriptCause returns the error a script raised, as Redis 6 wraps it:
// "ERR Error running script (call to f_<sha>): @user_script:<line>: <cause>",
// where the cause of a failed redis.call adds "@user_script: <line>: -"
// before the command's error. Redis 7 reports that error itself, followed
// by " script: <sha>, on @user_script:<line>."; other messages are
// returned as they are.
func scriptCause(msg string) string {
	rest, ok := strings.CutPrefix(msg, "ERR Error running script")
	if !ok {
		return msg
	}
	if _, rest, ok = strings.Cut(rest, "): "); !ok {
		return msg
	}
	for strings.HasPrefix(rest, "@user_script:") {
		_, after, ok := strings.Cut(rest[len("@user_script:"):], ": ")
		if !ok {
			break
		}
		rest = after
	}
	return strings.TrimPrefix(rest, "-")
}

// isRedisError reports whether err is an error reply from Redis (the server
// answered), as opposed to a transport or timeout error.
func isRedisError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && !errors.Is(err, goredis.Nil)
}
