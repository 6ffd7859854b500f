package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// maxPipelineCommands bounds one pipeline when PipelineLimit is not set, so
// that a burst cannot build an unbounded write buffer.
const maxPipelineCommands = 4096

// Commands are wrapped so that go-redis never sends them twice. Our clients
// have MaxRetries -1, but the Cluster client also resends a pipeline after a
// transport error or a timeout (up to MaxRedirects), and a pipeline whose
// replies were lost may well have run: INCRBY twice is a double count.
// MOVED and ASK redirections, which mean the command did not run, are
// still followed.
type (
	intCmd    struct{ *goredis.IntCmd }
	stringCmd struct{ *goredis.StringCmd }
	scriptCmd struct{ *goredis.IntSliceCmd } // decideLua and undoLua reply integers only
)

func (intCmd) NoRetry() bool    { return true }
func (stringCmd) NoRetry() bool { return true }
func (scriptCmd) NoRetry() bool { return true }

// request is one Do call's share of a backend: its commands, and how to read
// the replies back into the batch's results.
//
// Ownership: the caller builds it and hands it to a worker through the
// backend's queue; the worker executes it, sets err when it was not sent
// and signals done. If the caller stops waiting (its ctx ended) the request
// belongs to the worker and is dropped after use, never reused.
type request struct {
	ctx   context.Context
	cmds  []goredis.Cmder
	plan  []opPlan
	idx   []int // the batch's op indexes this request carries, in order
	ncmds int   // Redis commands in cmds, for PipelineLimit
	work  int   // ncmds, with scriptWork per op of a script call
	load  int   // what r counts for deepQueue: see deepWork
	err   error
	done  chan struct{}
	at    time.Time // when queued

	// traced is set by the caller when the request has a span (see
	// Store.startSpan); the worker then records when it sent the request
	// and how many requests and commands went in that pipeline.
	traced       bool
	sentAt       time.Time
	pipeRequests int
	pipeCommands int

	// The commands' arguments point into vals (per op of idx) and fill
	// slots of args: kept across uses, they make building a command
	// allocation-free but for the command itself (see Store.build).
	vals []opVals
	args []any

	// made[k] is the go-redis command last made for cmds[k], kept across
	// uses so that a request of the same shape reuses it (see reuse).
	made []goredis.Cmder
}

// reuse returns the command kept for cmds[len(r.cmds)] when it can serve
// again as a command with the arguments a, or nil. It can when a is the
// very slice it was made with (same memory, same length: argv hands out
// the same slots to a request of the same shape), so that the arguments
// just written are its own, and it was not made for a Cluster: the
// cluster client caches a command's hash slot in it, which a new key
// would make wrong. What a round trip leaves in a command of one server
// is its reply and its error, which the caller resets.
func (r *request) reuse(be *backend, a []any) goredis.Cmder {
	k := len(r.cmds)
	if be.cluster || k >= len(r.made) || r.made[k] == nil {
		return nil
	}
	c := r.made[k]
	if old := c.Args(); len(old) != len(a) || len(a) == 0 || &old[0] != &a[0] {
		return nil
	}
	c.SetErr(nil)
	return c
}

// keep records c as the command made for cmds[len(r.cmds)].
func (r *request) keep(c goredis.Cmder) {
	k := len(r.cmds)
	if k >= len(r.made) {
		r.made = append(r.made, make([]goredis.Cmder, k+1-len(r.made))...)
	}
	r.made[k] = c
}

// command returns a command of type C with the arguments a: the one r
// keeps for this place, emptied by reset, when it can serve again (see
// reuse), or else a new one made by newCmd.
func command[C goredis.Cmder](r *request, be *backend, a []any, newCmd func(context.Context, ...any) C, reset func(C)) C {
	if c, ok := r.reuse(be, a).(C); ok {
		reset(c)
		return c
	}
	c := newCmd(context.Background(), a...)
	r.keep(c)
	return c
}

// The resets of the commands build makes: no reply.
func resetInt(c *goredis.IntCmd)         { c.SetVal(0) }
func resetString(c *goredis.StringCmd)   { c.SetVal("") }
func resetScript(c *goredis.IntSliceCmd) { c.SetVal(nil) }

// opVals are the values of one op's command arguments. go-redis writes a
// *string, *uint64 or *int64 argument as the value it points to, and a
// pointer in an interface needs no allocation, unlike a string or a number.
type opVals struct {
	key                   string
	hits, limit, capacity uint64
	windowMicros, ttl     int64
	// refund is -hits for a refund (limiter.Op.Refund), 0 otherwise:
	// decideLua's hits argument then.
	refund int64
}

// set records op's values for decideLua, with a fixed-window TTL in seconds.
func (v *opVals) set(op *limiter.Op, ttlSeconds int64) {
	v.hits, v.limit, v.capacity = op.Hits, op.Limit, op.Capacity()
	v.windowMicros, v.ttl = windowMicros(op.Window), ttlSeconds
	v.refund = 0
	if op.Refund {
		v.refund = -int64(op.Hits) // at most limiter.MaxHits
	}
}

// setLean records op's values for its lean script: for a token bucket the
// capacity and the refill interval T = ceil(window / limit) in place of
// the limit and the window (see leanTokenBucketLua).
func (v *opVals) setLean(op *limiter.Op) {
	v.hits, v.limit, v.windowMicros = op.Hits, op.Limit, windowMicros(op.Window)
	if op.Algorithm == rules.TokenBucket {
		v.limit = op.Capacity()
		if op.Limit > 0 {
			w := uint64(v.windowMicros)
			t := w / op.Limit
			if w%op.Limit != 0 {
				t++
			}
			v.windowMicros = int64(t)
		}
	}
}

// putArgs fills the argsPerOp arguments of decideLua for v's op into a.
func (v *opVals) putArgs(a []any, alg rules.Algorithm) {
	a[0], a[1], a[2], a[3], a[4], a[5] = algorithmArgs[algorithmIndex(alg)], &v.limit, &v.capacity, &v.windowMicros, &v.hits, &v.ttl
	if v.refund < 0 {
		a[4] = &v.refund
	}
}

// argv returns the next n slots of r.args. Its capacity is n, so that no
// command's arguments can run into the next command's.
func (r *request) argv(n int) []any {
	if len(r.args)+n > cap(r.args) {
		// Commands built so far keep the old array.
		r.args = make([]any, 0, max(2*cap(r.args), n, 16))
	}
	i := len(r.args)
	r.args = r.args[:i+n]
	return r.args[i : i+n : i+n]
}

// opPlan says where op idx[i]'s reply is: cmds[cmd], of the given kind, at
// position pos among the ops of a script call.
type opPlan struct {
	cmd  int32
	pos  int32
	kind uint8
}

const (
	kindIncr   uint8 = iota // INCRBY (then EXPIRE): fixed window
	kindGet                 // GET: fixed window with 0 hits
	kindScript              // EVALSHA decideLua
	kindLean                // EVALSHA of a lean script: one op
)

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func getRequest(ctx context.Context) *request {
	r := requestPool.Get().(*request)
	r.ctx = ctx
	return r
}

// putRequest recycles a request whose worker has finished with it.
func putRequest(r *request) {
	r.reset()
	requestPool.Put(r)
}

// reset empties r for its next use, keeping its memory and its commands
// (request.made).
func (r *request) reset() {
	clear(r.cmds)
	clear(r.args)
	clear(r.vals)
	r.cmds, r.plan, r.idx, r.args, r.vals = r.cmds[:0], r.plan[:0], r.idx[:0], r.args[:0], r.vals[:0]
	r.ctx, r.err, r.ncmds, r.work, r.load = nil, nil, 0, 0, 0
	r.traced, r.sentAt, r.pipeRequests, r.pipeCommands = false, time.Time{}, 0, 0
}

// perKey reports whether each key must have a script call of its own: the
// server may be a sharding proxy (twemproxy), which cannot run a script
// over keys of two shards.
func (be *backend) perKey() bool {
	return !be.cluster && !be.oneServer.Load()
}

// backend is one Redis deployment (the main one or the per-second one) with
// its PoolSize workers. A worker owns at most one connection per node at a
// time, so at most PoolSize pipelines are in flight to a node.
//
// Adaptive pipelining: requests wait in one queue, and a worker takes
// everything queued (up to PipelineLimit commands) as one pipeline, then
// comes back for more until the queue is empty. When no pipeline is in
// flight, a request wakes a worker and leaves at once, adding no latency.
// While one is in flight, new requests wait for the next worker to come back
// from Redis ("flush when the connection is idle"), so pipelines grow with
// the load, with no timer. Another worker, on another connection, is used
// only when the queue holds deepQueue work or PipelineLimit commands, or
// when its oldest request has waited maxQueueWait (a slow or stuck round
// trip must not hold the others): each pipeline costs system
// calls and wake-ups on both sides, the main cost of a shallow pipeline,
// while a deep queue is worth a round trip in parallel
// (BenchmarkStoreQueueDepth). A request is never split and never takes more
// than one round trip.
//
// PipelineWindow > 0 instead holds a pipeline until its oldest request has
// waited that long or PipelineLimit commands are queued, as the anchor's
// implicit pipelining does; one worker at a time collects so.
type backend struct {
	name    string // for errors: "redis" or "redis persecond"
	client  goredis.UniversalClient
	cluster bool
	window  time.Duration
	limit   int // commands per pipeline; PipelineLimit or maxPipelineCommands
	deep    int // queued work that justifies another pipeline in flight: deepQueue
	timeout time.Duration
	workers []*worker

	// maxQueue bounds len(queue) (Config.MaxQueue); a request beyond it
	// fails with full, made once so that shedding allocates nothing, and
	// counts in shed (Store.Shed).
	maxQueue int
	full     error
	shed     *atomic.Uint64

	// closed fails the requests left in the queue at Close, and those
	// queued afterwards (see drain).
	closed error

	// conns counts the connections the dialer makes (Store.Conns).
	conns connCounts

	// paces are how slow the backend's servers have been to answer
	// lately, which stretches the bound of their silences (see stallConn).
	paces paces

	// oneServer is set once the backend is known to keep every key on one
	// server: a Sentinel master, or a SINGLE address that answers INFO as
	// Redis does. Until then (and behind twemproxy, which shards keys and
	// does not know INFO) an AllOrNothing batch runs one script per key
	// (see Store.build).
	oneServer atomic.Bool

	// mu guards the fields below it.
	mu         sync.Mutex
	shut       bool        // drained: the workers have stopped
	queue      []*request  // oldest first
	queued     int         // Redis commands in queue
	queuedWork int         // their work (request.load)
	idle       []*worker   // workers waiting on their wake channel
	busy       int         // workers not idle
	starting   int         // workers woken that have not taken from the queue yet
	collector  *worker     // with PipelineWindow, the worker waiting for more requests
	watching   bool        // watch is set to fire
	watch      *time.Timer // calls stalled: see maxQueueWait

	// breakers are the circuit breakers of the backend's servers, nil when
	// Config.Breaker turns them off; server is the one breaker of a SINGLE
	// or SENTINEL backend (see breaker.go).
	breakers *breaker.Group
	server   *breaker.Breaker

	// answered is closed when Redis first answers; up follows the
	// connection afterwards (see Store.Healthy).
	answered     chan struct{}
	answeredOnce sync.Once
	up           atomic.Bool
	// onAnswered is Config.Answered, called once answered is closed, and
	// after a breaker closed (breakerClosed); toldCloses counts the
	// breakers' closings told.
	onAnswered func()
	toldCloses atomic.Uint64
}

// deepQueue is the work queued (request.load) that justifies one more
// pipeline in flight: 32 requests of fixed windows, or 16 ops of the Lua
// algorithms. Chosen with BenchmarkStoreQueueDepth (docs/BENCHMARKS.md):
// below it, more pipelines cost client and Redis CPU for nothing; far above
// it, a Redis-bound load (scripts) leaves Redis idle between round trips.
const deepQueue = 64

// fixedRequestWork is the most a request's fixed-window commands count for
// deepQueue together, whatever their number: one op's INCRBY and EXPIRE.
// Those commands cost Redis about a microsecond each, far less than what
// the client spends per request (waking its caller, building and parsing),
// so a load of fixed windows is client-bound whatever its ops per request,
// and what a second pipeline saves (waiting on Redis) is worth its cost
// (system calls and wake-ups on both sides) only when many requests wait.
// Counted per command, three-descriptor requests opened a second pipeline
// once 11 of them waited: 0.09 round trips per request where one pipeline
// in flight makes 0.035, for 1.2-1.3 times the client's CPU per request
// (BenchmarkStoreOpsPerRequest, tools/libtrial; docs/BENCHMARKS.md).
const fixedRequestWork = 2

// maxQueueWait bounds how long a request waits for the pipelines in flight
// before another connection takes it, however shallow the queue: about
// ten round trips to a Redis nearby, a tenth of Envoy's default timeout.
const maxQueueWait = 2 * time.Millisecond

// scriptWork is what an op of a script call counts for deepQueue: decideLua
// runs two to six Redis commands per op, and costs Redis about five times
// the CPU of a fixed window's INCRBY and EXPIRE.
const scriptWork = 4

// worker is one of a backend's PoolSize senders. It sleeps on wake while
// idle; a value on wake means "take the queue" (while idle) or "send now"
// (while collecting with PipelineWindow). Only senders holding backend.mu
// send on it, and never while the worker can find a stale value (see take).
type worker struct {
	wake  chan struct{} // capacity 1
	pipe  goredis.Pipeliner
	batch []*request
	timer *time.Timer // with PipelineWindow
}

func (be *backend) markUp() {
	be.up.Store(true)
	be.answeredOnce.Do(func() {
		close(be.answered)
		if be.onAnswered != nil {
			be.onAnswered()
		}
	})
	be.breakerClosed()
}

func (be *backend) hasAnswered() bool {
	select {
	case <-be.answered:
		return true
	default:
		return false
	}
}

// initQueue makes the backend's poolSize workers, idle, without their
// pipelines.
func (be *backend) initQueue(poolSize int) {
	for range poolSize {
		w := &worker{wake: make(chan struct{}, 1)}
		be.workers = append(be.workers, w)
		be.idle = append(be.idle, w)
	}
	be.watch = time.AfterFunc(time.Hour, be.stalled)
	be.watch.Stop()
}

// stop stops the watch timer; the workers stop with their ctx.
func (be *backend) stop() {
	be.mu.Lock()
	be.watch.Stop()
	be.watching = false
	be.mu.Unlock()
}

// drain runs at Close once the workers have stopped: it stops the watch
// timer and fails every request still queued, and every request queued
// afterwards, with be.closed. Their callers wait on nothing else (see
// wait).
func (be *backend) drain() {
	be.stop()
	be.mu.Lock()
	defer be.mu.Unlock()
	be.shut = true
	for _, r := range be.queue {
		r.err = be.closed
		r.done <- struct{}{}
	}
	clear(be.queue)
	be.queue, be.queued, be.queuedWork = be.queue[:0], 0, 0
}

// enqueue queues r and wakes a worker if the queue justifies one. It
// queues nothing and returns be.full when be.maxQueue requests wait
// already, be.closed after Close.
func (be *backend) enqueue(r *request) error {
	r.at = time.Now()
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.shut {
		return be.closed
	}
	if len(be.queue) >= be.maxQueue {
		be.shed.Add(1)
		return be.full
	}
	r.load = r.deepWork()
	be.queue = append(be.queue, r)
	be.queued += r.ncmds
	be.queuedWork += r.load
	be.dispatchLocked()
	return nil
}

// dequeue takes r out of the queue unless a worker has taken it already,
// so that a request whose caller gave up neither holds a place in the
// queue (a stalled Redis would otherwise fill it with the dead, and shed
// the living) nor is sent. It reports whether it did: r may be recycled.
func (be *backend) dequeue(r *request) bool {
	be.mu.Lock()
	defer be.mu.Unlock()
	// The oldest requests are the likeliest to have given up.
	i := slices.Index(be.queue, r)
	if i < 0 {
		return false
	}
	be.queue = slices.Delete(be.queue, i, i+1)
	be.queued -= r.ncmds
	be.queuedWork -= r.load
	return true
}

// deepWork is what r counts for deepQueue: the work of its script calls
// (scriptWork per op), and its other commands (fixed windows: INCRBY and
// EXPIRE, or GET), one each, but at most fixedRequestWork together.
func (r *request) deepWork() int {
	fixed := 0
	for _, c := range r.cmds {
		if _, ok := c.(scriptCmd); !ok {
			fixed++
		}
	}
	return r.work - fixed + min(fixed, fixedRequestWork)
}

// dispatchLocked wakes an idle worker when the queue needs one: when no
// pipeline is in flight, when the work that no woken worker will take
// reaches be.deep, or when the oldest request has waited maxQueueWait (the
// watch timer fires then). With a collector, it only tells the collector to
// send once the limit is reached. be.mu is held.
func (be *backend) dispatchLocked() {
	if be.collector != nil {
		if be.queued >= be.limit {
			be.signal(be.collector)
			be.collector = nil
		}
		return
	}
	if len(be.queue) == 0 || len(be.idle) == 0 {
		return
	}
	if be.busy > 0 && !be.deepLocked() {
		if be.starting > 0 || be.window > 0 {
			return // a worker is about to take the queue, or to collect
		}
		wait := maxQueueWait - time.Since(be.queue[0].at)
		if wait > 0 {
			if !be.watching {
				be.watching = true
				be.watch.Reset(wait)
			}
			return
		}
	}
	w := be.idle[len(be.idle)-1]
	be.idle = be.idle[:len(be.idle)-1]
	be.busy++
	be.starting++
	be.signal(w)
}

// deepLocked reports whether the queue, beyond what the woken workers will
// take, justifies one more pipeline in flight: be.deep work, or a full
// pipeline (PipelineLimit commands). be.mu is held.
func (be *backend) deepLocked() bool {
	claimed := be.starting * be.limit
	return be.queuedWork-claimed >= be.deep || be.queued-claimed >= be.limit
}

// stalled runs when the watch timer fires: see dispatchLocked.
func (be *backend) stalled() {
	be.mu.Lock()
	defer be.mu.Unlock()
	be.watching = false
	be.dispatchLocked()
}

// signal sends on w.wake without blocking: w.wake is empty whenever a
// sender may use it (see take), so the value is never lost.
func (be *backend) signal(w *worker) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// work is a worker's loop; it returns when ctx ends.
func (be *backend) work(ctx context.Context, w *worker) {
	if be.window > 0 {
		w.timer = time.NewTimer(time.Hour)
		w.timer.Stop()
		defer w.timer.Stop()
	}
	for {
		select {
		case <-w.wake:
		case <-ctx.Done():
			return
		}
		// Send until the queue is empty: requests that arrived during a
		// round trip leave together in the next one.
		woken := true
		for {
			batch := be.take(ctx, w, woken)
			woken = false
			if len(batch) == 0 {
				break
			}
			be.exec(ctx, w, batch)
			clear(batch)
		}
	}
}

// take returns the next pipeline's requests for w, or none after making w
// idle. woken says w was just woken from idle.
func (be *backend) take(ctx context.Context, w *worker, woken bool) []*request {
	be.mu.Lock()
	defer be.mu.Unlock()
	if woken {
		be.starting--
	} else if be.busy > 1 && len(be.queue) > 0 && !be.deepLocked() && time.Since(be.queue[0].at) < maxQueueWait {
		// Back from Redis while another pipeline is in flight: the queue
		// is not deep enough for two, so leave it to that one (within
		// maxQueueWait: dispatchLocked sets the watch).
		be.goIdle(w)
		be.dispatchLocked()
		return nil
	}
	for be.window > 0 && len(be.queue) > 0 && be.queued < be.limit && ctx.Err() == nil {
		wait := be.window - time.Since(be.queue[0].at)
		if wait <= 0 {
			break
		}
		if be.collector != nil && be.collector != w {
			// Another worker collects these requests.
			be.goIdle(w)
			return nil
		}
		be.collector = w
		be.mu.Unlock()
		w.timer.Reset(wait)
		select {
		case <-w.wake:
		case <-w.timer.C:
		case <-ctx.Done():
		}
		w.timer.Stop()
		be.mu.Lock()
		if be.collector == w {
			be.collector = nil
		}
		// A signal sent while the timer fired must not wake w later.
		select {
		case <-w.wake:
		default:
		}
	}
	if len(be.queue) == 0 || ctx.Err() != nil {
		be.goIdle(w)
		return nil
	}
	k, n, work := 0, 0, 0
	for k < len(be.queue) && (k == 0 || n+be.queue[k].ncmds <= be.limit) {
		n += be.queue[k].ncmds
		work += be.queue[k].load
		k++
	}
	w.batch = append(w.batch[:0], be.queue[:k]...)
	rest := copy(be.queue, be.queue[k:])
	clear(be.queue[rest:])
	be.queue = be.queue[:rest]
	be.queued -= n
	be.queuedWork -= work
	be.dispatchLocked()
	return w.batch
}

// goIdle makes w idle. be.mu is held.
func (be *backend) goIdle(w *worker) {
	be.busy--
	be.idle = append(be.idle, w)
}

// exec sends the batch's commands as one pipeline (one per node for a
// cluster, in parallel) and signals every request. Requests whose caller
// has already given up are not sent. A panic fails the batch's requests
// and the worker goes on (see survive).
func (be *backend) exec(ctx context.Context, w *worker, batch []*request) {
	defer func() {
		for _, r := range batch {
			r.done <- struct{}{}
		}
	}()
	defer be.survive(w, batch)
	ctx, cancel := context.WithTimeout(ctx, be.timeout)
	defer cancel()
	pipe := w.pipe // Exec empties it
	sent, cmds, traced := 0, 0, false
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = unavailable(be.name, err)
			continue
		}
		_ = pipe.BatchProcess(ctx, r.cmds...)
		sent++
		cmds += r.ncmds
		traced = traced || r.traced
	}
	if traced {
		// Read by each caller once done is signalled.
		now := time.Now()
		for _, r := range batch {
			if r.traced && r.err == nil {
				r.sentAt, r.pipeRequests, r.pipeCommands = now, sent, cmds
			}
		}
	}
	if sent > 0 {
		_, err := pipe.Exec(ctx)
		if err != nil && !anyCmdErr(batch) {
			// The pipeline failed as a whole (no connection, a failed
			// handshake or AUTH, a timeout): go-redis may leave the
			// commands without an error of their own.
			for _, r := range batch {
				if r.err == nil {
					r.err = unavailable(be.name, err)
				}
			}
			be.up.Store(false)
		} else {
			if err != nil {
				be.retryNoScript(ctx, batch)
			}
			if unavailableCmdErr(batch) {
				be.up.Store(false)
			} else {
				be.markUp()
			}
		}
	}
}

// errPanic is wrapped by the error of what panicked in the store's own
// goroutines: a round trip's requests, a probe.
var errPanic = errors.New("panic")

// survive, deferred by exec, turns a panic of the round trip (in go-redis
// or in a hook) into an Unavailable error for each of its requests, so
// that the worker and the process live on. The replies go-redis cannot
// read without panicking are refused before it reads them (replyGuard);
// this is the last line. go-redis may have put the connection back in
// the middle of a reply: replyGuard fails it at its next write. The
// pipeline may still hold the commands of the round trip: the worker
// gets a new one.
func (be *backend) survive(w *worker, batch []*request) {
	p := recover()
	if p == nil {
		return
	}
	err := unavailable(be.name, fmt.Errorf("%w: %v", errPanic, p))
	for _, r := range batch {
		r.err = err
	}
	w.pipe = be.client.Pipeline()
	be.up.Store(false)
}

// recovered, deferred by the store's probes, turns a panic into *err
// (when err is not nil), so that the probe's goroutine lives on.
func recovered(err *error) {
	if p := recover(); p != nil && err != nil {
		*err = fmt.Errorf("redis: %w: %v", errPanic, p)
	}
}

// anyCmdErr reports whether a command of the batch carries an error of its
// own (goredis.Nil, a GET's "no such key", included).
func anyCmdErr(batch []*request) bool {
	for _, r := range batch {
		if r.err != nil {
			continue
		}
		for _, c := range r.cmds {
			if c.Err() != nil {
				return true
			}
		}
	}
	return false
}

// unavailableCmdErr reports whether a command of the batch failed in a way
// that means Redis cannot serve (see cmdError).
func unavailableCmdErr(batch []*request) bool {
	for _, r := range batch {
		if r.err != nil {
			continue
		}
		for _, c := range r.cmds {
			if err := c.Err(); err != nil && !errors.Is(err, goredis.Nil) && !isDataError(err) && !isOOM(err) {
				return true
			}
		}
	}
	return false
}

// retryNoScript sends again, as EVAL with the script's source, the EVALSHA
// commands that Redis refused with NOSCRIPT (after a restart, a failover
// or SCRIPT FLUSH). This is the one case where a request takes a second
// round trip; the script is cached by Redis from then on. On one server
// (not a Cluster, whose pipeline routes by key, nor a proxy, which may
// not pass SCRIPT LOAD) the same round trip loads every other script too,
// so that one NOSCRIPT is met once, not once per script.
func (be *backend) retryNoScript(ctx context.Context, batch []*request) {
	var pipe goredis.Pipeliner
	for _, r := range batch {
		if r.err != nil {
			continue
		}
		for i, c := range r.cmds {
			if !goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				continue
			}
			args := append([]any(nil), c.Args()...)
			sha, _ := args[1].(string)
			args[0], args[1] = "eval", scriptSource(sha)
			cmd := scriptCmd{goredis.NewIntSliceCmd(ctx, args...)}
			r.cmds[i] = cmd
			if pipe == nil {
				pipe = be.client.Pipeline()
			}
			_ = pipe.Process(ctx, cmd)
		}
	}
	if pipe == nil {
		return
	}
	if be.oneServer.Load() && !be.cluster {
		for _, src := range scriptSources {
			_ = pipe.Process(ctx, goredis.NewStringCmd(ctx, "script", "load", src))
		}
	}
	_, _ = pipe.Exec(ctx)
}

// submit queues r for a worker and waits for it, or for ctx or the store to
// end. It reports whether r may be recycled (the worker is done with it).
func (be *backend) submit(ctx context.Context, stop <-chan struct{}, r *request) (recycle bool, err error) {
	if err := be.send(ctx, stop, r); err != nil {
		return true, err
	}
	return be.wait(ctx, r)
}

// send queues r, unless ctx or the store has ended or the queue is full.
func (be *backend) send(ctx context.Context, stop <-chan struct{}, r *request) error {
	if err := ctx.Err(); err != nil {
		return unavailable(be.name, err)
	}
	select {
	case <-stop:
		return unavailable(be.name, errClosed)
	default:
	}
	return be.enqueue(r)
}

// wait waits for the worker to be done with the queued r, or for ctx to
// end. It reports whether r may be recycled. Close needs no case of its
// own: it ends the round trips in flight, whose workers then signal
// done, and drain signals the requests left in the queue. A third
// channel here, the store's, shared by every waiting request, cost a
// lock and a waiter on it per request.
//
// A request whose deadline passes while it is still queued fails as one
// whose round trip is late, with ErrUnavailable and the deadline: the
// queue may stand still because Redis froze (an outage, which
// STORE_FAILURE_MODE=local decides locally) as well as because this
// process is busy, and only the round trips tell (see breakerHook).
func (be *backend) wait(ctx context.Context, r *request) (recycle bool, err error) {
	select {
	case <-r.done:
		return true, r.err
	case <-ctx.Done():
		return be.dequeue(r), unavailable(be.name, ctx.Err())
	}
}
