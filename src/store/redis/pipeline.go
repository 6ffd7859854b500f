package redis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
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
	scriptCmd struct{ *goredis.Cmd }
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
	err   error
	done  chan struct{}
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
)

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

func getRequest(ctx context.Context) *request {
	r := requestPool.Get().(*request)
	r.ctx = ctx
	return r
}

// putRequest recycles a request whose worker has finished with it.
func putRequest(r *request) {
	clear(r.cmds)
	r.cmds, r.plan, r.idx = r.cmds[:0], r.plan[:0], r.idx[:0]
	r.ctx, r.err, r.ncmds = nil, nil, 0
	requestPool.Put(r)
}

// backend is one Redis deployment (the main one or the per-second one) with
// its workers. Each worker owns at most one connection per node at a time,
// so PoolSize workers keep PoolSize pipelines in flight.
//
// Coalescing: a worker takes the first queued request, then everything else
// already queued (up to PipelineLimit commands), and sends it all as one
// pipeline. An idle worker therefore sends a lone request at once, adding no
// latency, while under load requests queue up during the round trips in
// flight and leave together: batches grow with the load, with no timer.
// PipelineWindow > 0 instead waits up to that long for more requests, as
// the anchor's implicit pipelining does. A request is never split.
type backend struct {
	name    string // for errors: "redis" or "redis persecond"
	client  goredis.UniversalClient
	cluster bool
	queue   chan *request
	window  time.Duration
	limit   int
	timeout time.Duration

	// answered is closed when Redis first answers; up follows the
	// connection afterwards (see Store.Healthy).
	answered     chan struct{}
	answeredOnce sync.Once
	up           atomic.Bool
}

func (be *backend) markUp() {
	be.up.Store(true)
	be.answeredOnce.Do(func() { close(be.answered) })
}

func (be *backend) hasAnswered() bool {
	select {
	case <-be.answered:
		return true
	default:
		return false
	}
}

// work is a worker's loop; it returns when ctx ends.
func (be *backend) work(ctx context.Context) {
	var batch []*request
	var timer *time.Timer
	if be.window > 0 {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
	}
	limit := be.limit
	if limit <= 0 {
		limit = maxPipelineCommands
	}
	for {
		var r *request
		select {
		case r = <-be.queue:
		case <-ctx.Done():
			return
		}
		batch = append(batch[:0], r)
		n := r.ncmds
		if be.window > 0 {
			timer.Reset(be.window)
		wait:
			for n < limit {
				select {
				case r := <-be.queue:
					batch = append(batch, r)
					n += r.ncmds
				case <-timer.C:
					break wait
				case <-ctx.Done():
					break wait
				}
			}
			timer.Stop()
		} else {
		drain:
			for n < limit {
				select {
				case r := <-be.queue:
					batch = append(batch, r)
					n += r.ncmds
				default:
					break drain
				}
			}
		}
		be.exec(ctx, batch)
		clear(batch)
	}
}

// exec sends the batch's commands as one pipeline (one per node for a
// cluster, in parallel) and signals every request. Requests whose caller
// has already given up are not sent.
func (be *backend) exec(ctx context.Context, batch []*request) {
	ctx, cancel := context.WithTimeout(ctx, be.timeout)
	defer cancel()
	pipe := be.client.Pipeline()
	sent := 0
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = unavailable(be.name, err)
			continue
		}
		_ = pipe.BatchProcess(ctx, r.cmds...)
		sent++
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
	for _, r := range batch {
		r.done <- struct{}{}
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
			if err := c.Err(); err != nil && !errors.Is(err, goredis.Nil) && !isDataError(err) {
				return true
			}
		}
	}
	return false
}

// retryNoScript sends again, as EVAL with the script's source, the EVALSHA
// commands that Redis refused with NOSCRIPT (after a restart, a failover
// or SCRIPT FLUSH). This is the one case where a request takes a second
// round trip; the script is cached by Redis from then on.
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
			cmd := scriptCmd{goredis.NewCmd(ctx, args...)}
			r.cmds[i] = cmd
			if pipe == nil {
				pipe = be.client.Pipeline()
			}
			_ = pipe.Process(ctx, cmd)
		}
	}
	if pipe != nil {
		_, _ = pipe.Exec(ctx)
	}
}

// submit queues r for a worker and waits for it, or for ctx or the store to
// end. It reports whether r may be recycled (the worker is done with it).
func (be *backend) submit(ctx context.Context, stop <-chan struct{}, r *request) (recycle bool, err error) {
	select {
	case be.queue <- r:
	case <-ctx.Done():
		return true, unavailable(be.name, ctx.Err())
	case <-stop:
		return true, unavailable(be.name, errClosed)
	}
	select {
	case <-r.done:
		return true, r.err
	case <-ctx.Done():
		return false, unavailable(be.name, ctx.Err())
	case <-stop:
		return false, unavailable(be.name, errClosed)
	}
}
