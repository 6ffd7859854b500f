// Package loadgen is a closed-loop gRPC load generator for any Envoy
// rate-limit service (envoy.service.ratelimit.v3). It keeps a fixed number of
// requests in flight over a few connections, draws descriptors from
// templates, and reports throughput, a latency histogram and the count of
// each outcome.
//
// It is the core of tools/ratelimit-bench, of tools/benchrun and of the load
// the integration tests drive, which call it in process; no package of the
// service imports it. It knows nothing of this service's internals: it
// speaks only the wire protocol, so it measures envoyproxy/ratelimit the
// same way.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Load describes one measurement. At least one of Requests and Duration must
// be set; when both are, the run stops at whichever comes first.
type Load struct {
	// Domain is the request's domain.
	Domain string
	// Descriptors are templates (see ParseTemplate), one per descriptor of
	// each request, in order.
	Descriptors []string
	// Hits is the request's hits_addend; 0 leaves it unset (the server counts 1).
	Hits uint32
	// Override, when set, is the limit override every descriptor carries
	// (Envoy's per-route limit): the server applies it instead of its rules.
	Override *ratelimitv3.RateLimitDescriptor_RateLimitOverride
	// Concurrency is the number of requests in flight; default 64.
	Concurrency int
	// Requests is the number of measured requests; 0 means no count limit.
	Requests int64
	// Duration is the length of the measured phase; 0 means no time limit.
	Duration time.Duration
	// Warmup is a phase before the measurement whose requests are sent but
	// not counted; default 0.
	Warmup time.Duration
	// Timeout is the deadline of each request; 0 means none.
	Timeout time.Duration
}

// Client holds the gRPC connections of a load generator. Several loads can
// run one after another on one Client (warm-up once, measure several times).
// It is safe for concurrent use, though concurrent runs compete for the
// same connections.
type Client struct {
	addr  string
	conns []*grpc.ClientConn
}

// Dial opens n connections to addr (host:port, plaintext) and waits until all
// are ready or ctx ends.
func Dial(ctx context.Context, addr string, n int) (*Client, error) {
	if n < 1 {
		return nil, fmt.Errorf("bench: %d connections: want at least 1", n)
	}
	c := &Client{addr: addr}
	for range n {
		// Each ClientConn has its own HTTP/2 transport, so streams spread
		// over n TCP connections and n client writer goroutines.
		cc, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: %s: %w", addr, err)
		}
		c.conns = append(c.conns, cc)
	}
	for _, cc := range c.conns {
		if err := waitReady(ctx, cc); err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: connect %s: %w", addr, err)
		}
	}
	return c, nil
}

func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	cc.Connect()
	for {
		s := cc.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("%w (connection %s)", ctx.Err(), s)
		}
	}
}

// Addr returns the address the client was dialled to.
func (c *Client) Addr() string { return c.addr }

// Close closes all connections.
func (c *Client) Close() error {
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// Result is the outcome of one measured run.
type Result struct {
	Addr        string
	Domain      string
	Descriptors []string
	// KeySpace is the number of distinct requests the templates can make.
	KeySpace    int64
	Concurrency int
	Conns       int
	// Requests is the number of measured requests (those started in the
	// measured phase), with or without error; every other count and the
	// latencies cover the same requests.
	Requests uint64
	// Elapsed runs from the start of the measured phase to the last
	// completion.
	Elapsed time.Duration
	// Window is the measured phase of a duration-bounded run, and
	// InWindow the requests that completed within it. Throughput is taken
	// over the window so that one slow request at the end does not stretch
	// it. Window is 0 for a run bounded by count.
	Window   time.Duration
	InWindow uint64
	// OK, OverLimit and Unknown count successful responses by overall code.
	OK, OverLimit, Unknown uint64
	// Errors counts failed calls by gRPC status code.
	Errors  map[codes.Code]uint64
	Latency Latency
}

// Latency summarises the latency of the measured requests, errors included.
type Latency struct {
	Min, Mean, P50, P90, P99, P999, Max time.Duration
}

// RPS returns completed requests per second: over the window of a
// duration-bounded run, else from the start of measuring to the last
// completion.
func (r *Result) RPS() float64 {
	if r.Window > 0 {
		return float64(r.InWindow) / r.Window.Seconds()
	}
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// ErrorCount returns the number of failed calls.
func (r *Result) ErrorCount() uint64 {
	var n uint64
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// Run dials addr with conns connections, runs l once and closes.
func Run(ctx context.Context, addr string, conns int, l Load) (*Result, error) {
	c, err := Dial(ctx, addr, min(conns, max(l.Concurrency, 1)))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Run(ctx, l)
}

// worker is one closed loop: it owns its request, response, random source
// and statistics, so the loop shares nothing but a ticket counter.
type worker struct {
	conn *grpc.ClientConn
	rng  *rand.Rand
	req  *rlsv3.RateLimitRequest
	resp rlsv3.RateLimitResponse
	dyn  []dynEntry
	buf  []byte

	hist       histogram
	ok, over   uint64
	unknown    uint64
	codes      [17]uint64 // by codes.Code; other codes land in Unknown (2)
	count      uint64
	inWindow   uint64
	lastFinish time.Time
}

// dynEntry is an entry of the worker's request whose key or value changes
// per request.
type dynEntry struct {
	e          *ratelimitv3.RateLimitDescriptor_Entry
	key, value *field
}

// newWorker pre-builds the request message; per request only the strings of
// the entries that hold ranges are replaced. gRPC encodes the message before
// Invoke returns, so reusing it for the next call is safe.
func newWorker(conn *grpc.ClientConn, l *Load, tmpls []*Template, seed uint64) *worker {
	w := &worker{
		conn: conn,
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		req:  &rlsv3.RateLimitRequest{Domain: l.Domain, HitsAddend: l.Hits},
		buf:  make([]byte, 0, 64),
	}
	descs := make([]*ratelimitv3.RateLimitDescriptor, 0, len(tmpls))
	for _, t := range tmpls {
		entries := make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, len(t.entries))
		for i := range t.entries {
			te := &t.entries[i]
			e := &ratelimitv3.RateLimitDescriptor_Entry{Key: te.key.literal(), Value: te.value.literal()}
			entries = append(entries, e)
			if te.key.dynamic() || te.value.dynamic() {
				de := dynEntry{e: e}
				if te.key.dynamic() {
					de.key = &te.key
				}
				if te.value.dynamic() {
					de.value = &te.value
				}
				w.dyn = append(w.dyn, de)
			}
		}
		descs = append(descs, &ratelimitv3.RateLimitDescriptor{Entries: entries, Limit: l.Override})
	}
	w.req.Descriptors = descs
	return w
}

func (w *worker) next() {
	for i := range w.dyn {
		d := &w.dyn[i]
		if d.key != nil {
			d.e.Key = d.key.pick(w.rng, &w.buf)
		}
		if d.value != nil {
			d.e.Value = d.value.pick(w.rng, &w.buf)
		}
	}
}

// phase bounds shared by the workers of one run.
type phase struct {
	measureStart time.Time
	end          time.Time // zero: no time limit
	limit        int64     // 0: no count limit
	tickets      atomic.Int64
	timeout      time.Duration
}

func (w *worker) loop(ctx context.Context, p *phase) {
	done := ctx.Done()
	for {
		select {
		case <-done:
			return
		default:
		}
		w.next()
		t0 := time.Now()
		// A request belongs to the measurement when it starts after the
		// warm-up; one that straddles the boundary is discarded.
		measured := !t0.Before(p.measureStart)
		if measured {
			if !p.end.IsZero() && !t0.Before(p.end) {
				return
			}
			if p.limit > 0 && p.tickets.Add(1) > p.limit {
				return
			}
		}
		callCtx, cancel := ctx, context.CancelFunc(nil)
		if p.timeout > 0 {
			callCtx, cancel = context.WithTimeout(ctx, p.timeout)
		}
		err := w.conn.Invoke(callCtx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, w.req, &w.resp)
		if cancel != nil {
			cancel()
		}
		t1 := time.Now()
		if !measured {
			continue
		}
		w.count++
		w.lastFinish = t1
		if !p.end.IsZero() && !t1.After(p.end) {
			w.inWindow++
		}
		w.hist.record(t1.Sub(t0))
		if err != nil {
			c := status.Code(err)
			if int(c) >= len(w.codes) {
				c = codes.Unknown
			}
			w.codes[c]++
			continue
		}
		switch w.resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OK:
			w.ok++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			w.over++
		default:
			w.unknown++
		}
	}
}

// Run runs l on the client's connections and returns the measured result.
// When ctx ends early it returns what was measured so far with ctx's error.
func (c *Client) Run(ctx context.Context, l Load) (*Result, error) {
	if l.Concurrency == 0 {
		l.Concurrency = 64
	}
	tmpls, keySpace, err := l.check()
	if err != nil {
		return nil, err
	}
	seed := uint64(time.Now().UnixNano())
	workers := make([]*worker, l.Concurrency)
	for i := range workers {
		workers[i] = newWorker(c.conns[i%len(c.conns)], &l, tmpls, seed+uint64(i))
	}
	start := time.Now()
	p := &phase{measureStart: start.Add(l.Warmup), limit: l.Requests, timeout: l.Timeout}
	if l.Duration > 0 {
		p.end = p.measureStart.Add(l.Duration)
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.loop(ctx, p) })
	}
	wg.Wait()

	r := &Result{
		Addr:        c.addr,
		Domain:      l.Domain,
		Descriptors: l.Descriptors,
		KeySpace:    keySpace,
		Concurrency: l.Concurrency,
		Conns:       len(c.conns),
	}
	r.gather(workers, p.measureStart)
	// An interrupted run has no full window; its rate is taken to the last
	// completion instead.
	if l.Duration > 0 && ctx.Err() == nil {
		r.Window = l.Duration
	}
	return r, ctx.Err()
}

// check reports a Load that cannot run, and parses its descriptors'
// templates, with the number of distinct requests they make.
func (l *Load) check() ([]*Template, int64, error) {
	switch {
	case l.Concurrency < 0:
		return nil, 0, fmt.Errorf("bench: concurrency %d: want at least 1", l.Concurrency)
	case l.Requests < 0 || l.Duration < 0 || l.Warmup < 0 || l.Timeout < 0:
		return nil, 0, errors.New("bench: negative requests, duration, warm-up or timeout")
	case l.Requests == 0 && l.Duration == 0:
		return nil, 0, errors.New("bench: set a number of requests or a duration")
	case len(l.Descriptors) == 0:
		return nil, 0, errors.New("bench: no descriptors")
	}
	tmpls := make([]*Template, len(l.Descriptors))
	keySpace := int64(1)
	for i, s := range l.Descriptors {
		t, err := ParseTemplate(s)
		if err != nil {
			return nil, 0, err
		}
		tmpls[i] = t
		if n := t.Size(); keySpace > (1<<63-1)/n {
			keySpace = 1<<63 - 1
		} else {
			keySpace *= n
		}
	}
	return tmpls, keySpace, nil
}

// gather adds up what the workers counted and measured since
// measureStart.
func (r *Result) gather(workers []*worker, measureStart time.Time) {
	r.Errors = map[codes.Code]uint64{}
	var h histogram
	var last time.Time
	for _, w := range workers {
		h.merge(&w.hist)
		r.Requests += w.count
		r.InWindow += w.inWindow
		r.OK += w.ok
		r.OverLimit += w.over
		r.Unknown += w.unknown
		for code, n := range w.codes {
			if n > 0 {
				r.Errors[codes.Code(code)] += n
			}
		}
		if w.lastFinish.After(last) {
			last = w.lastFinish
		}
	}
	if r.Requests > 0 {
		r.Elapsed = last.Sub(measureStart)
	}
	r.Latency = Latency{
		Min:  time.Duration(h.min),
		Mean: h.mean(),
		P50:  h.quantile(0.50),
		P90:  h.quantile(0.90),
		P99:  h.quantile(0.99),
		P999: h.quantile(0.999),
		Max:  time.Duration(h.max),
	}
}
