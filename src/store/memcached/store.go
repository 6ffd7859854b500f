// Package memcached is the Memcached store: it keeps every key's state in
// one or more memcached servers (keys sharded over them by the client), so
// that any number of stateless instances share their counts. It knows the
// limiter's Store contract and nothing above it: no rules tree, no
// settings, no protos.
//
// Fixed windows count in envoyproxy/ratelimit's keys with incr, creating a
// key with add (value = hits, expiration = window + jitter) when incr
// misses, and incr again if another instance added it first. Each op is one
// atomic incr, so concurrent instances never lose a hit (the anchor reads,
// then increments in the background, and over-admits under load). A key
// this instance has not written in its current window is tried with add
// first (see written), so that the common case, first hits included, is
// one round trip per op.
//
// Fixed-window counts saturate instead of wrapping: memcached's incr wraps
// at 2^64 without a word, and a count that wrapped would let the next
// hits in, so that one request could reset a spent limit. A count at or
// above 2^63 is saturated: reported as the largest count, over any limit.
// An op adds at most limiter.MaxHits (2^32-1), and a count that passes
// 2^63+2^62 is set back to 2^63 (gets, then cas), so to wrap, some 2^30
// maximal ops would have to be under way at once. An op whose incr still
// wrapped (it answers less than the op's hits: only a count written near
// 2^64 by someone else gets there) is over the limit, and raises the count
// back to 2^63 plus what was added since, with one more incr made before
// the request's deadline. A saturated op is never taken back (AllOrNothing),
// so a saturated count goes back under 2^63 only by the undos of ops
// counted just under it, and stays over any (32-bit) limit.
//
// The other algorithms keep their state (see encoding.go) in
// one item per key and update it optimistically: gets, the limiter's pure
// function, then cas (or add for a new key), retried on a conflict, so the
// result is exact too. This instance's updates of one item take turns (a
// lock per key hash, see itemLocks), so that they do not conflict with each
// other, only with other instances'; an update retries at most maxAttempts
// times, with a jittered backoff, and then fails with an error wrapping
// limiter.ErrOverloaded (a load shed, not an outage: memcached answered,
// the key is busier than optimistic updates can follow). Memcached has
// no clock a client can read, so these algorithms run on Batch.Now, the
// instance's clock: the instances of a fleet must keep NTP time, and a skew
// between them shifts their windows by that much.
//
// A descriptor's list of limits (rate_limits: the ops of one
// limiter.Op.Group) keeps every limit's state in one item, under the part
// of the limits' keys they share (limiter.SplitListKey:
// "prefix{domain_key_value}"), and is applied in one such update: every
// limit to every hit in one atomic step, so that concurrent requests are
// admitted exactly, fixed windows included (a list's fixed windows count
// in the item, not with incr; a single rate_limit keeps the anchor's keys
// and incr). An AllOrNothing batch records a list's hits in all its limits
// or in none. The item's encoding is versioned, bounded in limits and
// bytes, and an item that does not decode fails its list with ErrData;
// see list.go.
//
// Items expire when their state would be the zero state again (the states'
// IdleAt; for fixed windows, the window), plus a random jitter of up to
// Config.ExpirationJitterMax, plus one second: memcached's clock ticks in
// whole seconds, so an item given n seconds may go up to a second early.
// Expirations beyond 30 days are sent as absolute Unix times, as memcached
// reads them.
//
// An item the store cannot count in (a fixed window that memcached refuses
// to incr because it is not a 64-bit decimal number, a state that does not
// decode) fails the ops on its key with an error wrapping limiter.ErrData.
// That is an answer, not an outage: health and the connections stay
// as they are, and other keys are served.
//
// Keys are the limiter's, as given, so a rolling upgrade from the anchor
// keeps counting in the same keys. Memcached refuses keys longer than 250
// bytes or with spaces or control characters (the anchor fails on them);
// such a key is replaced by its first 100 bytes with those characters
// turned into '_', then "#sha256:" and the hex SHA-256 of the whole key, a
// stable name that every instance computes alike.
//
// Refunds (limiter.Op.Refund, is_negative_hits) give hits back with decr
// for a fixed window (atomic, stops at 0, keeps the item's expiration),
// and with the same gets-then-cas update for the other algorithms and for
// lists, writing only a state the refund changed: a key never hit stays
// absent.
//
// AllOrNothing batches (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): memcached
// has no multi-key atomicity, so, as the Redis store on Cluster, each op
// (each list: its item) is applied atomically on its own key, and when any
// op was refused the ops that recorded hits (fixed windows always record
// them; a list's only when all its limits admitted) are taken back with
// the take-back rules of src/limiter/takeback.go: decr for a fixed window;
// for the others a cas loop that applies the limiter's TakeBack of the
// algorithm's state (the hits leave the window they went into, a token
// bucket's TAT moves back by their worth, that many hits logged at that
// instant are forgotten). Results are the contract's, but not in one instant:
// between the two steps other requests can see the hits being taken back
// (they may be refused; nothing is ever over-admitted), and if memcached
// fails in between, those hits stay counted.
package memcached

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
	"github.com/ratelimitd/ratelimit/src/store/memcached/mcclient"
)

// errClosed is the cause of errors after Close.
var errClosed = errors.New("store closed")

// The prober's schedule: backing off from probeInitial to probeInterval
// until memcached first answers, then every probeInterval.
const (
	probeInitial  = 50 * time.Millisecond
	probeInterval = time.Second
)

// Store is a limiter.Store backed by memcached. It is safe for concurrent
// use. Create it with New and release it with Close; the zero value is not
// usable.
type Store struct {
	cfg Config
	// written guides the first command of a fixed-window hit (count).
	written *written
	// locks serialise this instance's updates of one item (see update).
	locks *itemLocks
	// client is the pipelining memcached client (package mcclient); it holds
	// the server list.
	client *mcclient.Client
	// dial is the client's dial function, for the reads of the servers'
	// settings (memory.go), which speak to them on a connection of their own.
	dial   mcclient.DialFunc
	lookup lookupSRVFunc
	// srvAddrs is the server list last resolved from cfg.SRV; only New and
	// then the refresher touch it.
	srvAddrs []string
	// unresolved holds cfg.Addrs while one of their names does not resolve
	// (the server list is empty meanwhile); only New and then the prober
	// touch it.
	unresolved []string

	roundTrips, ops, shed atomic.Uint64
	// beforeWrite, when not nil, runs before every cas or add of an
	// update (tests change the item there to force a conflict).
	beforeWrite func(key string)
	// opCounts counts the commands by outcome (OpStats).
	opCounts opCounts

	// breakers are the servers' circuit breakers, by address; nil when
	// Config.Breaker turns them off (see breaker.go).
	breakers *breaker.Group

	// slots holds one token per Do (or probe) under way: at most
	// cfg.MaxConns (see acquire). waiting counts the Do calls waiting for
	// one.
	slots   chan struct{}
	waiting atomic.Int64

	// answered is closed when memcached first answers; up is false while
	// the last probe or op failed for want of memcached.
	answered     chan struct{}
	answeredOnce sync.Once
	started      atomic.Bool
	up           atomic.Bool
	// toldCloses counts the breakers' closings told (see breakerClosed).
	toldCloses atomic.Uint64

	// closed is set by Close; a Do checks it before every round trip.
	closed atomic.Bool

	ctx    context.Context // ends at Close; bounds the prober and the refresher
	cancel context.CancelFunc
	// exited holds a channel per background goroutine (the prober, the
	// refresher), closed when it returns.
	exited    []chan struct{}
	closeOnce sync.Once
}

var _ limiter.Store = (*Store)(nil)

// New returns a Store for cfg. It does not wait for memcached: with the
// servers down, or their names not resolving yet, it returns a working
// Store whose ops fail with limiter.ErrUnavailable and whose Healthy is
// false until memcached first answers (see WaitStarted). It fails for a bad
// cfg, and when the SRV record cannot be resolved (ctx bounds that lookup),
// as the anchor does.
func New(ctx context.Context, cfg Config) (*Store, error) {
	return newWith(ctx, cfg, deps{lookup: net.DefaultResolver.LookupSRV})
}

// deps are what a Store takes from the world outside memcached; tests
// replace them.
type deps struct {
	lookup lookupSRVFunc
	// wrapDial, when not nil, wraps the dial function (tests count the
	// connections).
	wrapDial func(mcclient.DialFunc) mcclient.DialFunc
}

func newWith(ctx context.Context, cfg Config, d deps) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dial := dialer(cfg)
	if d.wrapDial != nil {
		dial = d.wrapDial(dial)
	}
	s := &Store{
		cfg:      cfg,
		dial:     dial,
		lookup:   d.lookup,
		answered: make(chan struct{}),
		written:  newWritten(),
		locks:    newItemLocks(),
		slots:    make(chan struct{}, cfg.MaxConns),
		breakers: breaker.NewGroup("memcached", cfg.Breaker),
	}
	s.client = mcclient.New(mcclient.Config{
		Dial: dial, Conns: cfg.Conns, Idle: cfg.MaxIdleConns, MaxQueue: 4 * cfg.MaxConns,
		Timeout: cfg.Timeout, Observe: cfg.RoundTrip, Broken: s.breakConn,
		MaxValue: maxListBytes,
	})
	addrs := cfg.Addrs
	if cfg.SRV != "" {
		if addrs, err = resolveSRV(ctx, d.lookup, cfg.SRV); err != nil {
			return nil, err
		}
		s.srvAddrs = addrs
	}
	if err := s.client.SetServers(addrs...); err != nil {
		// A name that does not resolve yet (a service not yet in DNS):
		// the prober tries again. Names are resolved only here, as the
		// anchor's client (gomemcache's ServerList) does.
		if cfg.SRV != "" {
			return nil, fmt.Errorf("memcached: servers %q from SRV (MEMCACHE_SRV): %w", addrs, err)
		}
		s.unresolved = addrs
	}

	// The Store outlives New's ctx: it runs until Close.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.start(s.probe)
	if s.breakers != nil {
		s.start(func() { s.breakers.Run(s.ctx, s.probeBreakers) })
	}
	if cfg.SRV != "" && cfg.SRVRefresh > 0 {
		s.start(s.refresh)
	}
	return s, nil
}

// start runs f in a goroutine that Close stops (s.ctx) and waits for.
func (s *Store) start(f func()) {
	done := make(chan struct{})
	s.exited = append(s.exited, done)
	go func() {
		defer close(done)
		f()
	}()
}

// dialer returns the client's dial function: TCP with keep-alives, and TLS
// when configured; the client bounds each dial by Timeout.
func dialer(cfg Config) mcclient.DialFunc {
	d := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	if cfg.TLS != nil {
		// tls.Dialer takes ServerName from the address when the config
		// has none, and bounds the handshake by ctx too.
		return (&tls.Dialer{NetDialer: d, Config: cfg.TLS}).DialContext
	}
	return d.DialContext
}

// probe pings every server until they first answer, backing off from
// probeInitial to probeInterval, then every probeInterval, to keep Healthy
// true to reality while no traffic flows.
func (s *Store) probe() {
	wait := probeInitial
	for !s.started.Load() {
		if s.ping() == nil {
			s.markUp()
			break
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.answered: // an op got an answer first
		case <-time.After(wait):
		}
		wait = min(2*wait, probeInterval)
	}
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.up.Store(s.ping() == nil)
	}
}

// ping checks that every server answers version on every connection
// (dialing those that are down), after resolving the servers' names if
// New could not. Each answer is bounded by Timeout; the probe, pipelined
// like the requests, takes no slot.
func (s *Store) ping() error {
	ctx, cancel := context.WithTimeout(s.ctx, 2*s.cfg.Timeout)
	defer cancel()
	if s.unresolved != nil {
		if err := s.client.SetServers(s.unresolved...); err != nil {
			return err
		}
		s.unresolved = nil
	}
	return s.client.Ping(ctx)
}

// markUp records that memcached answered.
func (s *Store) markUp() {
	s.up.Store(true)
	s.answeredOnce.Do(func() {
		s.started.Store(true)
		close(s.answered)
		if s.cfg.Answered != nil {
			s.cfg.Answered()
		}
	})
}

// refresh re-resolves cfg.SRV every SRVRefresh and switches the client to
// the new list when it changed. A failed lookup keeps the current list.
func (s *Store) refresh() {
	t := time.NewTicker(s.cfg.SRVRefresh)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, max(s.cfg.Timeout, 5*time.Second))
		addrs, err := resolveSRV(ctx, s.lookup, s.cfg.SRV)
		cancel()
		if err != nil || slices.Equal(addrs, s.srvAddrs) {
			continue
		}
		if s.client.SetServers(addrs...) == nil {
			s.srvAddrs = addrs
		}
	}
}

// Healthy reports whether the store can serve: false until memcached first
// answered, then false while the last probe (every second) or op to it
// failed for want of memcached, or a server's circuit breaker is open.
// With several servers, every one must have answered the last probe.
func (s *Store) Healthy() bool { return s.started.Load() && s.up.Load() && !s.breakers.AnyOpen() }

// WaitStarted blocks until memcached first answered, or ctx ends. The
// server may use it to hold back readiness at startup.
func (s *Store) WaitStarted(ctx context.Context) error {
	select {
	case <-s.answered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("memcached: waiting for the first answer: %w", ctx.Err())
	}
}

// Counters returns the cumulative number of round trips that reached
// memcached (commands answered, misses and conflicts included; probes
// excluded) and of ops applied. roundTrips/ops is about 1 for fixed
// windows, 2 for the other algorithms when they record, plus retries; a
// list of limits takes 2 round trips for all its ops.
func (s *Store) Counters() (roundTrips, ops uint64) { return s.roundTrips.Load(), s.ops.Load() }

// Timeout returns the store's bound of a dial and of an answer's lateness
// (Config.Timeout, or its default).
func (s *Store) Timeout() time.Duration { return s.cfg.Timeout }

// Shed returns the cumulative number of Do calls that failed with
// limiter.ErrOverloaded: MaxWaiting were waiting for a slot already, none
// came free before the call's deadline, or a server's queue was full;
// plus the updates of an item (gets, then cas) that others' changes made
// fail maxAttempts times in a row.
func (s *Store) Shed() uint64 { return s.shed.Load() }

// closeGrace is how long Close waits beyond Config.Timeout for the calls
// under way, whose round trips end within Timeout.
const closeGrace = 100 * time.Millisecond

// Close stops the prober (and the SRV refresher), waits for the Do calls
// and the probe under way, and closes the connections once the commands
// under way are answered. It returns within Config.Timeout plus 100ms
// (plus a little for the connections' readers), memcached frozen or not:
// a call under way stops before its next round trip, and its round trip
// ends within Timeout. Do calls made afterwards fail with an error
// wrapping limiter.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		// Set first, so that the calls in flight stop at their next round
		// trip, and cancel the waits for a slot.
		s.closed.Store(true)
		s.cancel()
		deadline := time.Now().Add(s.cfg.Timeout + closeGrace)
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		s.drain(t.C)
		err = s.client.CloseBy(deadline)
	})
	return err
}

// drain waits until no call holds a slot and the background
// goroutines have returned, or timeout fires. It takes every slot and
// keeps them: a call that comes after Close gets none.
func (s *Store) drain(timeout <-chan time.Time) {
	for range cap(s.slots) {
		select {
		case s.slots <- struct{}{}:
		case <-timeout:
			return
		}
	}
	for _, done := range s.exited {
		select {
		case <-done:
		case <-timeout:
			return
		}
	}
}

// Do applies the batch: see limiter.Store, and the package documentation
// for AllOrNothing. An op takes one round trip in the common case (two when
// another instance created a fixed-window key this one has not written in
// the window yet, and for the other algorithms when they record); the ops
// of a list take two together. The ops (lists) of a batch run side by side (see fanout), so that a request with several
// descriptors waits about one round trip, not one per op. A zero b.Now is
// set to the current time.
//
// A Do first takes one of Config.MaxConns slots. When none is free it
// waits, at most until ctx's deadline, unless Config.MaxWaiting calls wait
// already; a call shed either way fails with an error wrapping
// limiter.ErrOverloaded (counted in Shed), not ErrUnavailable: memcached
// is slower than the load, not known to be down. The batch's other ops take
// further slots only when they are free at once, and otherwise run one
// after the other on the Do's own. The commands of all of them share the
// pipelined connections (client.go); a server's queue holds at most
// 4 × Config.MaxConns commands, and one more is shed the same way.
//
// ctx is checked before every round trip (retries after a cas conflict or
// an add/incr race, AllOrNothing take-backs included), and a round trip
// under way returns at ctx's end; only a dial (at most Config.Timeout) is
// not interrupted. The take-back of an AllOrNothing batch goes on when ctx
// is canceled, but not past its deadline: then the hits stay counted.
func (s *Store) Do(ctx context.Context, b *limiter.Batch) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	// An open circuit breaker fails the request at once, before it takes
	// a slot.
	if err := s.admit(b); err != nil {
		return err
	}
	if err := s.acquire(ctx); err != nil {
		return err
	}
	defer s.release()
	// Close may have given up waiting and freed no slot for us, but a
	// call that ended late did.
	if s.closed.Load() {
		return unavailable(errClosed)
	}
	n := b.SizeResults()
	if n == 0 {
		return nil
	}
	s.ops.Add(uint64(n))
	if b.Now.IsZero() {
		b.Now = time.Now()
	}
	var buf [8]unit
	us := units(b.Ops, buf[:0])
	apart := distinctKeys(us)
	switch {
	case countBatch(b, us, apart):
		return s.doCounts(ctx, b)
	case len(us) == 1 && !b.AllOrNothing: // without doUnits' closure
		_, err := s.applyUnit(ctx, b, &us[0], listEach)
		return err
	}
	return s.doUnits(ctx, b, slices.Clone(us), apart)
}

// acquire takes a slot for a Do: at once when one is free;
// else, unless MaxWaiting calls wait already (then it sheds the call at
// once), when one comes free, at most until ctx ends or the store closes.
// A call shed, or whose deadline came first, fails with
// limiter.ErrOverloaded and is counted in Shed; memcached is not known to
// be down then, only slower than the load.
func (s *Store) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		return nil
	default:
	}
	if s.waiting.Add(1) > int64(s.cfg.MaxWaiting) {
		s.waiting.Add(-1)
		s.shed.Add(1)
		return fmt.Errorf("memcached: %w: %d connections busy and %d requests waiting for one",
			limiter.ErrOverloaded, s.cfg.MaxConns, s.cfg.MaxWaiting)
	}
	defer s.waiting.Add(-1)
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return unavailable(ctx.Err())
		}
		s.shed.Add(1)
		// Not wrapping ctx.Err(): the request was shed, and the service
		// must answer so.
		return fmt.Errorf("memcached: %w: %d connections busy until the request's deadline",
			limiter.ErrOverloaded, s.cfg.MaxConns)
	case <-s.ctx.Done():
		return unavailable(errClosed)
	}
}

// release gives back a slot taken by acquire or fanout.
func (s *Store) release() { <-s.slots }

// check returns the error for a Do that must stop before its next round
// trip: ctx ended or the store closed.
func (s *Store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return unavailable(err)
	}
	if s.closed.Load() {
		return unavailable(errClosed)
	}
	return nil
}

// checkDeadline is check for the round trips that must not be left half
// done when the request goes away (taking back an AllOrNothing batch's
// hits, repairing a wrapped count): it ignores ctx's cancellation but
// honours its deadline, which bounds every Do.
func (s *Store) checkDeadline(ctx context.Context) error {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return unavailable(context.DeadlineExceeded)
	}
	if s.closed.Load() {
		return unavailable(errClosed)
	}
	return nil
}

// unavailable wraps a failure to reach memcached.
func unavailable(err error) error {
	return fmt.Errorf("memcached: %w: %w", limiter.ErrUnavailable, err)
}
