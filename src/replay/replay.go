// Package replay runs a capture of decided requests (package capture)
// against sets of rules, with the service's own decision code on an
// in-memory store and a simulated clock, and reports per rule what each
// set would have refused, and where the sets (or a set and the answers in
// the capture) disagree. It is ratelimit-check -replay.
//
// Like server, it composes the service from its parts: the service
// decides, on the memory store, exactly as a running instance on the
// memory store does for the same requests at the same times. It knows no
// protos beyond building the requests it gives the service, and nothing of
// gRPC, files or flags.
package replay

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// Defaults of Config.
const (
	// DefaultMemoryMaxBytes is each rule set's memory store's ceiling, 1
	// GiB: far above the service's default (MEMORY_MAX_BYTES, 64 MiB), so
	// that a replay evicts nothing a Redis would have kept.
	DefaultMemoryMaxBytes = 1 << 30
	// DefaultTop is the keys listed per rule.
	DefaultTop = 10
	// DefaultMaxKeys and DefaultMaxKeyBytes bound the keys whose refusals
	// are counted, per rule set: a capture of many clients over their
	// limits costs at most that many keys, of at most that many bytes
	// (each key's length and keyOverhead).
	DefaultMaxKeys     = 1_000_000
	DefaultMaxKeyBytes = 128 << 20
	// DefaultReorder and DefaultReorderBytes bound the requests the replay
	// holds to put the capture in time order: concurrent requests are
	// written a few microseconds out of it, at most as many as there are
	// in flight. The requests being decided take at most as many bytes
	// again.
	DefaultReorder      = 4096
	DefaultReorderBytes = 16 << 20
	// MaxDomainRows bounds the rows of figures per domain of each rule set
	// ("DOMAIN (limit override)", "DOMAIN (no limit)"): past it the
	// figures of further domains go to one row, "(other domains) (...)".
	MaxDomainRows = 1024
)

// Config says what to replay against what. Its zero value is not usable:
// New must be set.
type Config struct {
	// New are the rules replayed, named NewName in the report.
	New     *rules.Config
	NewName string
	// Old, when not nil, are the rules New is compared with, named
	// OldName; nil compares New with the answers the capture holds.
	Old     *rules.Config
	OldName string
	// The service's settings that change decisions:
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, SHADOW_MODE, QUOTA_MODE.
	StopIncrementWhenOverLimit bool
	GlobalShadowMode           bool
	GlobalQuotaMode            bool
	// MemoryMaxBytes is each rule set's memory store's ceiling
	// (default DefaultMemoryMaxBytes; negative: none).
	MemoryMaxBytes int64
	// Top is how many keys the report lists per rule (default DefaultTop).
	Top int
	// MaxKeys and MaxKeyBytes bound the keys tracked per rule set
	// (default DefaultMaxKeys, DefaultMaxKeyBytes); the refusals of keys
	// past them are counted, not listed.
	MaxKeys     int
	MaxKeyBytes int64
	// Reorder and ReorderBytes bound how far, in requests and in the
	// bytes they take, the capture may be out of time order (default
	// DefaultReorder, DefaultReorderBytes); a request further out is an
	// error. The requests being decided take at most ReorderBytes more.
	Reorder      int
	ReorderBytes int64
}

// withDefaults returns c with the defaults of its zero fields.
func (c Config) withDefaults() Config {
	c.MemoryMaxBytes = cmp.Or(c.MemoryMaxBytes, DefaultMemoryMaxBytes)
	c.Top = cmp.Or(max(c.Top, 0), DefaultTop)
	c.MaxKeys = cmp.Or(max(c.MaxKeys, 0), DefaultMaxKeys)
	c.MaxKeyBytes = cmp.Or(max(c.MaxKeyBytes, 0), DefaultMaxKeyBytes)
	c.Reorder = cmp.Or(max(c.Reorder, 0), DefaultReorder)
	c.ReorderBytes = cmp.Or(max(c.ReorderBytes, 0), DefaultReorderBytes)
	return c
}

// MemoryBound is the most memory a replay of c holds, in bytes, whatever
// the capture holds; -1 when a store has no ceiling (MemoryMaxBytes
// negative). It is the sum of: the capture's reading (a line of
// capture.MaxLine, in the reader's buffer and as the request last read);
// the requests held, ReorderBytes in the reorder window and as much being
// decided (or one request, when it alone is larger); the buffers reused
// from request to request (reusedBytes and the window's ring); and per
// rule set its store (MemoryMaxBytes), the keys it tracks (MaxKeyBytes),
// its rows per domain (MaxDomainRows of domainRowBytes) and what its
// service keeps (serviceBytes). The heap holds that and the garbage of
// the decisions, which the collector frees.
func (c Config) MemoryBound() int64 {
	c = c.withDefaults()
	if c.MemoryMaxBytes < 0 {
		return -1
	}
	sides := int64(1)
	if c.Old != nil {
		sides = 2
	}
	perSide := c.MemoryMaxBytes + c.MaxKeyBytes + 2*(MaxDomainRows+1)*domainRowBytes + serviceBytes
	return 2*capture.MaxLine + 2*c.ReorderBytes + reusedBytes + 2*int64(c.Reorder)*itemBytes + sides*perSide
}

// ErrOrder is wrapped by the error of a capture further out of time order
// than Config.Reorder.
var ErrOrder = errors.New("replay: capture out of time order")

// Run replays every request rd holds, in the order of their times, and
// returns the report. It stops at the first line rd refuses and at the
// first request the service refuses (a *capture.LineError either way,
// naming the line), and when ctx ends.
func Run(ctx context.Context, rd *capture.Reader, cfg Config) (*Report, error) {
	if cfg.New == nil {
		return nil, errors.New("replay: no rules to replay")
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	r := &run{cfg: cfg, sides: []*side{newSide(cfg.NewName, cfg.New, &cfg)}}
	if cfg.Old != nil {
		r.sides = append(r.sides, newSide(cfg.OldName, cfg.Old, &cfg))
	}
	defer func() {
		for _, s := range r.sides {
			s.close()
		}
	}()
	r.report = &Report{New: cfg.NewName, Old: cfg.OldName, Against: "rules", Header: rd.Header()}
	if cfg.Old == nil {
		r.report.Against = "capture"
	}
	if err := r.all(ctx, rd); err != nil {
		return nil, err
	}
	r.report.Summary = rd.Summary()
	r.report.Rules = r.sides[0].rules(cfg.Top)
	for k, s := range r.sides {
		if k == 1 {
			r.report.OldRules = s.rules(cfg.Top)
		}
		r.report.Evicted += s.store.Evictions().UnderLimit
	}
	r.report.Took = time.Since(start)
	return r.report, nil
}

// run is one replay's state. The requests go through a pipeline: one
// goroutine reads them and puts them in time order, in chunks; each rule
// set decides every chunk on a goroutine of its own, so that two sets take
// two cores; Run's goroutine accounts for each chunk once both have.
type run struct {
	cfg    Config
	sides  []*side // New, then Old if any
	report *Report
	// held is the bytes of the requests sent to be decided and not yet
	// accounted for (at most cfg.ReorderBytes, or one request); freed
	// tells the reader that the accounting gave some back.
	held  atomic.Int64
	freed chan struct{}
}

// chunkSize is the most requests of a chunk, and chunks the chunks in
// flight: what the pipeline holds beside the reorder window (at most
// Config.ReorderBytes of requests, whatever their number).
const (
	chunkSize = 512
	chunks    = 8
)

// What a request read takes beside the strings of its line, as cost
// counts it: per request (its place in a chunk and the window, its proto,
// its answers), per descriptor (capture's and the proto's), per entry
// (capture's, the proto's and its pointer), per override (both). Each is
// rounded up to Go's size classes.
const (
	requestBytes    = 512
	descriptorBytes = 192
	entryBytes      = 128
	overrideBytes   = 80
)

// reusedBytes bounds the buffers kept from one request to the next: each
// of the chunks' chunkSize places keeps a proto of at most reuseMax
// descriptors and entries, and each side's answers of at most reuseMax
// decisions of a request; the rest goes when its chunk is accounted for.
// Beside them the reorder window's ring keeps at most twice Config.Reorder
// places of itemBytes.
const (
	reuseMax    = 8
	reusedBytes = chunks * chunkSize * (requestBytes + reuseMax*(descriptorBytes+entryBytes+2*decisionBytes))
	itemBytes   = 128
)

// serviceBytes bounds what each rule set's service keeps of the requests:
// statistics of at most 1,000 keys made of their values
// (service.Config.MaxDynamicStatKeys), each of which may keep the line its
// strings are slices of, of at most 4 KiB (a longer line's are copies).
const serviceBytes = 8 << 20

// cost is the bytes req takes until it is accounted for: held, the bytes
// of its strings (capture.Reader.Held), and what its structure takes.
func cost(req *capture.Request, held int) int64 {
	n := int64(requestBytes + held + cap(req.Codes) + cap(req.Descriptors)*descriptorBytes)
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		n += int64(cap(d.Entries) * entryBytes)
		if d.Limit != nil {
			n += overrideBytes
		}
	}
	return n
}

// chunk is a run of requests in time order and their decisions.
type chunk struct {
	items  []item
	bytes  int64 // the cost of items
	protos []*rlsv3.RateLimitRequest
	// res[k][i] is side k's decision of items[i]; err[k] the error that
	// stopped side k, at line errLine[k].
	res     [2][]result
	err     [2]error
	errLine [2]int
	// done counts the sides that have not decided the chunk yet.
	done sync.WaitGroup
	// final, on the last chunk the reader sends, is why it stopped (nil
	// at the capture's end).
	final error
}

// result is one side's decision of one request.
type result struct {
	over  bool
	codes []bool
	seen  []decision
}

// reset empties c once accounted for, keeping of its buffers only those
// small enough to be worth reusing (reusedBytes bounds them all).
func (c *chunk) reset() {
	clear(c.items[:cap(c.items)])
	c.items, c.bytes = c.items[:0], 0
	for i, p := range c.protos[:cap(c.protos)] {
		if p != nil && !reusable(p) {
			c.protos[i] = nil
		}
	}
	for k := range c.res {
		all := c.res[k][:cap(c.res[k])]
		for i := range all {
			res := &all[i]
			if cap(res.seen) > reuseMax || cap(res.codes) > reuseMax {
				*res = result{}
			}
			clear(res.seen[:cap(res.seen)])
		}
	}
}

// reusable reports whether p, with what its slices keep past their
// length, has at most reuseMax descriptors and entries, and so is worth
// keeping for another request; it empties the strings of those it keeps,
// which would keep their lines.
func reusable(p *rlsv3.RateLimitRequest) bool {
	n := cap(p.Descriptors)
	p.Domain = ""
	for _, d := range p.Descriptors[:cap(p.Descriptors)] {
		if n > reuseMax {
			return false
		}
		if d == nil {
			continue
		}
		n += cap(d.Entries)
		for _, e := range d.Entries[:min(cap(d.Entries), reuseMax)] {
			if e != nil {
				e.Key, e.Value = "", ""
			}
		}
	}
	return n <= reuseMax
}

// all reads and replays every request, in time order through a window of
// at most cfg.Reorder requests.
func (r *run) all(ctx context.Context, rd *capture.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.freed = make(chan struct{}, 1)
	free := make(chan *chunk, chunks)
	for range chunks {
		free <- &chunk{}
	}
	ordered := make(chan *chunk, chunks)
	toSide := make([]chan *chunk, len(r.sides))
	var wg sync.WaitGroup
	for k, s := range r.sides {
		toSide[k] = make(chan *chunk, chunks)
		wg.Go(func() {
			for c := range toSide[k] {
				s.decideChunk(k, c)
			}
		})
	}
	wg.Go(func() {
		defer func() {
			close(ordered)
			for _, ch := range toSide {
				close(ch)
			}
		}()
		r.read(ctx, rd, free, ordered, toSide)
	})
	defer wg.Wait()
	for c := range ordered {
		c.done.Wait()
		for k := range r.sides {
			if c.err[k] != nil {
				cancel()
				return &capture.LineError{Line: c.errLine[k], Err: c.err[k]}
			}
		}
		r.account(c)
		if c.final != nil {
			cancel()
			return c.final
		}
		r.held.Add(-c.bytes)
		select {
		case r.freed <- struct{}{}:
		default:
		}
		c.reset()
		free <- c
	}
	return nil
}

// read reads the capture, puts it in time order and sends it on in
// chunks, until its end, an error (sent on the last chunk), or ctx's end.
// Lines too long to read are counted and skipped.
func (r *run) read(ctx context.Context, rd *capture.Reader, free <-chan *chunk, ordered chan<- *chunk, toSide []chan *chunk) {
	f := &feeder{ctx: ctx, cfg: &r.cfg, free: free, ordered: ordered, toSide: toSide, held: &r.held, freed: r.freed}
	var pending window
	for {
		if err := ctx.Err(); err != nil {
			f.send(err)
			return
		}
		var req capture.Request
		err := rd.Next(&req)
		if err == io.EOF {
			break
		}
		if errors.Is(err, capture.ErrTooLong) {
			r.report.tooLong(rd.Line())
			continue
		}
		if err != nil {
			f.send(err)
			return
		}
		pending.push(item{req: req, line: rd.Line(), bytes: cost(&req, rd.Held())})
		for pending.len() > r.cfg.Reorder || pending.bytes > r.cfg.ReorderBytes {
			if !f.next(pending.pop()) {
				return
			}
		}
	}
	for pending.len() > 0 {
		if !f.next(pending.pop()) {
			return
		}
	}
	f.send(nil)
}

// feeder fills chunks with requests in time order and sends them on: to
// Run's goroutine, in order, and to each side.
type feeder struct {
	ctx     context.Context
	cfg     *Config
	held    *atomic.Int64 // run.held
	freed   <-chan struct{}
	free    <-chan *chunk
	ordered chan<- *chunk
	toSide  []chan *chunk
	last    item   // the request sent last
	c       *chunk // the chunk being filled, if any
}

// take makes f.c a free chunk, emptied; false when ctx ends first.
func (f *feeder) take() bool {
	select {
	case f.c = <-f.free:
		f.c.protos = f.c.protos[:0]
		return true
	case <-f.ctx.Done():
		return false
	}
}

// send sends the chunk being filled, with final as the reason the reading
// stopped (nil: it goes on, or the capture ended); an empty chunk goes
// only with a reason. It returns false when ctx ended first.
func (f *feeder) send(final error) bool {
	if f.c == nil {
		if final == nil {
			return true
		}
		if !f.take() {
			return false
		}
	}
	c := f.c
	c.final = final
	c.err = [2]error{}
	c.done.Add(len(f.toSide))
	select {
	case f.ordered <- c:
	case <-f.ctx.Done():
		return false
	}
	for _, ch := range f.toSide {
		ch <- c
	}
	f.c = nil
	return true
}

// next adds it, the next request in time order, to the chunk, and sends
// the chunk once full. A request before the one sent last (further out
// of order than the window) stops the reading with ErrOrder. It waits
// while the requests being decided would take more than
// Config.ReorderBytes with it, unless there are none.
func (f *feeder) next(it item) bool {
	if it.req.Time.Before(f.last.req.Time) {
		f.send(&capture.LineError{Line: it.line, Err: fmt.Errorf("%w: decided at %s, before the request of line %d (%s), replayed already: further out of order than the replay's window of %d requests or %d bytes; sort the capture by \"ns\" first",
			ErrOrder, it.req.Time.UTC().Format(time.RFC3339Nano), f.last.line, f.last.req.Time.UTC().Format(time.RFC3339Nano), f.cfg.Reorder, f.cfg.ReorderBytes)})
		return false
	}
	// Its time and line only: its strings would keep its line.
	f.last = item{req: capture.Request{Time: it.req.Time}, line: it.line}
	if !f.room(it.bytes) || f.c == nil && !f.take() {
		return false
	}
	c := f.c
	c.items = append(c.items, it)
	c.bytes += it.bytes
	f.held.Add(it.bytes)
	n := len(c.items) - 1
	c.protos = c.protos[:n]
	if n < cap(c.protos) && c.protos[:n+1][n] != nil {
		c.protos = c.protos[:n+1]
	} else {
		c.protos = append(c.protos, &rlsv3.RateLimitRequest{})
	}
	fill(c.protos[n], &c.items[n].req)
	if len(c.items) == chunkSize {
		return f.send(nil)
	}
	return true
}

// room waits until the requests being decided leave room for n bytes
// more, sending the chunk being filled first so that they can; false
// when ctx ends first.
func (f *feeder) room(n int64) bool {
	for held := f.held.Load(); held > 0 && held+n > f.cfg.ReorderBytes; held = f.held.Load() {
		if f.c != nil && len(f.c.items) > 0 && !f.send(nil) {
			return false
		}
		select {
		case <-f.freed:
		case <-f.ctx.Done():
			return false
		}
	}
	return true
}

// decideChunk has the side decide every request of c, as side k.
func (s *side) decideChunk(k int, c *chunk) {
	defer c.done.Done()
	res := c.res[k]
	if cap(res) < len(c.items) {
		res = append(res[:cap(res)], make([]result, len(c.items)-cap(res))...)
	}
	res = res[:len(c.items)]
	c.res[k] = res
	for i := range c.items {
		if err := s.decide(c.protos[i], c.items[i].req.Time, &res[i]); err != nil {
			c.err[k], c.errLine[k] = err, c.items[i].line
			return
		}
	}
}

// account counts the decisions of chunk c, request by request.
func (r *run) account(c *chunk) {
	rep := r.report
	for i := range c.items {
		req := &c.items[i].req
		if rep.Requests == 0 {
			rep.From = req.Time
		}
		rep.Requests++
		rep.To = req.Time
		if req.Degraded {
			rep.Degraded++
		}
		mine := &c.res[0][i]
		otherCodes, otherOver := req.Codes, req.OverLimit
		if len(r.sides) > 1 {
			old := &c.res[1][i]
			otherCodes, otherOver = old.codes, old.over
			r.sides[1].account(old, mine.codes, req.Time, req.Domain)
		}
		r.sides[0].account(mine, otherCodes, req.Time, req.Domain)
		for k, over := range mine.codes {
			if over != otherCodes[k] {
				rep.DescriptorsDiffer++
			}
		}
		switch {
		case mine.over && !otherOver:
			rep.RefusedByNewOnly++
		case !mine.over && otherOver:
			rep.RefusedByOtherOnly++
		}
	}
}

// fill makes p the request req, reusing p's memory.
func fill(p *rlsv3.RateLimitRequest, req *capture.Request) {
	p.Domain, p.HitsAddend = req.Domain, req.Hits
	descs := p.Descriptors[:0]
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		var pd *ratelimitv3.RateLimitDescriptor
		if i < cap(descs) && descs[:i+1][i] != nil {
			pd = descs[:i+1][i]
		} else {
			pd = &ratelimitv3.RateLimitDescriptor{}
		}
		entries := pd.Entries[:0]
		for j, e := range d.Entries {
			var pe *ratelimitv3.RateLimitDescriptor_Entry
			if j < cap(entries) && entries[:j+1][j] != nil {
				pe = entries[:j+1][j]
			} else {
				pe = &ratelimitv3.RateLimitDescriptor_Entry{}
			}
			pe.Key, pe.Value = e.Key, e.Value
			entries = append(entries, pe)
		}
		*pd = ratelimitv3.RateLimitDescriptor{Entries: entries, IsNegativeHits: d.Refund}
		if d.HasHits {
			pd.HitsAddend = wrapperspb.UInt64(d.Hits)
		}
		if o := d.Limit; o != nil {
			pd.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: o.RequestsPerUnit, Unit: typev3.RateLimitUnit(o.Unit),
			}
			if o.UnitMultiplier != 0 {
				pd.Limit.UnitMultiplier = wrapperspb.UInt32(o.UnitMultiplier)
			}
		}
		descs = append(descs, pd)
	}
	p.Descriptors = descs
}

// item is a request waiting for its turn, with its line and its cost.
type item struct {
	req   capture.Request
	line  int
	bytes int64
}

// window holds the requests read and not yet replayed, in time order (of
// equal times, in line order), in a ring: a capture is in time order but
// for concurrent requests, so a request read goes at the end, or a few
// places before it, and the first goes out.
type window struct {
	ring       []item
	head, size int
	bytes      int64 // the cost of the requests held
}

func (w *window) len() int { return w.size }

// at is the i-th request in order.
func (w *window) at(i int) *item { return &w.ring[(w.head+i)%len(w.ring)] }

// push puts it in its place.
func (w *window) push(it item) {
	if w.size == len(w.ring) {
		grown := make([]item, max(2*len(w.ring), 64))
		for i := range w.size {
			grown[i] = *w.at(i)
		}
		w.ring, w.head = grown, 0
	}
	i := w.size
	w.size++
	w.bytes += it.bytes
	for ; i > 0 && it.req.Time.Before(w.at(i-1).req.Time); i-- {
		*w.at(i) = *w.at(i - 1)
	}
	*w.at(i) = it
}

// pop takes the first request out.
func (w *window) pop() item {
	it := *w.at(0)
	*w.at(0) = item{}
	w.head = (w.head + 1) % len(w.ring)
	w.size--
	w.bytes -= it.bytes
	return it
}

// side is one rule set's service, on a memory store of its own, and what
// its decisions came to.
type side struct {
	name  string
	cfg   *Config
	svc   *service.Service
	store *memory.Store
	now   atomic.Int64 // the simulated clock, Unix ns
	// sweep is the simulated time of the store's next sweep of idle
	// keys, which the service's runs every 10 s.
	sweep time.Time

	// cur is the decision of the request being decided, which Observe
	// fills.
	cur *result

	// The rules' figures: those of the rules by limit, of per-request
	// overrides by ID, of descriptors admitted without a limit by domain;
	// order lists those that saw a decision.
	stats    map[*rules.Limit]*ruleStats
	special  map[string]*ruleStats
	noLimits map[string]*ruleStats
	order    []*ruleStats
	// keys and keyBytes are the keys tracked and their bytes, against
	// Config.MaxKeys and Config.MaxKeyBytes.
	keys     int
	keyBytes int64
}

// decision is one decision the service told of a descriptor.
type decision struct {
	i      int
	rule   *ruleStats
	over   bool
	key    string // set when over: the key as its limit counted it
	shadow bool
}

// decisionBytes is the size of a decision.
const decisionBytes = 48

// keyOverhead is what tracking a key takes beside its bytes: its
// KeyReport and its place in the rule's map.
const keyOverhead = 112

// domainRowBytes bounds what a row per domain takes: its figures, its
// name and its place in the map (a domain is at most 256 bytes, or the
// service refuses it).
const domainRowBytes = 1024

// sweepEvery is the service's memory store's sweep of idle keys.
const sweepEvery = 10 * time.Second

func newSide(name string, c *rules.Config, cfg *Config) *side {
	s := &side{name: name, cfg: cfg, stats: map[*rules.Limit]*ruleStats{}, special: map[string]*ruleStats{}, noLimits: map[string]*ruleStats{}}
	s.store = memory.New(memory.Config{MaxBytes: cfg.MemoryMaxBytes, SweepInterval: -1, Now: s.clock})
	lim := limiter.New(s.store, limiter.Config{
		KeyFormat:                  limiter.EscapedKeys, // the memory store's
		NearLimitRatio:             0.8,
		StopIncrementWhenOverLimit: cfg.StopIncrementWhenOverLimit,
	})
	s.svc = service.New(lim, stats.NewRegistry(), service.Config{
		GlobalShadowMode: cfg.GlobalShadowMode,
		GlobalQuotaMode:  cfg.GlobalQuotaMode,
		Now:              s.clock,
		Observe:          s.observe,
	})
	s.svc.SetRules(c)
	ids := ruleIDs(c.Limits())
	for i, l := range c.Limits() {
		st := &ruleStats{report: RuleReport{ID: ids[i], Source: l.Source, Shadow: l.Shadow}}
		s.stats[l] = st
	}
	return s
}

func (s *side) clock() time.Time { return time.Unix(0, s.now.Load()) }

func (s *side) close() { s.store.Close() }

// decide decides the request p at now into res: the answer, each
// descriptor's code (true: OVER_LIMIT), and the decisions the service
// told.
func (s *side) decide(p *rlsv3.RateLimitRequest, now time.Time, res *result) error {
	s.now.Store(now.UnixNano())
	if now.After(s.sweep) {
		if !s.sweep.IsZero() {
			s.store.Sweep()
		}
		s.sweep = now.Add(sweepEvery)
	}
	res.seen = res.seen[:0]
	s.cur = res
	resp, err := s.svc.ShouldRateLimit(context.Background(), p)
	if err != nil {
		return fmt.Errorf("%s: the service refuses the request: %w", s.name, err)
	}
	res.over = resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	res.codes = res.codes[:0]
	for _, st := range resp.GetStatuses() {
		res.codes = append(res.codes, st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	return nil
}

// observe is the service's Observer: it keeps what the accounting needs.
// The rule's statistics are looked up here, on the side's goroutine, and
// counted by the accounting, on Run's, after this side is done with the
// chunk: the two never touch them at once.
func (s *side) observe(i int, entries []rules.Entry, lim *rules.Limit, st *limiter.Status) {
	d := decision{i: i, rule: s.rule(lim), over: st.Code == limiter.OverLimit, shadow: lim.Shadow}
	if d.over {
		d.key = rawKey(entries)
	}
	s.cur.seen = append(s.cur.seen, d)
}

// rule returns the statistics of lim, a rule of the side's rules or a
// per-request override (counted per domain).
func (s *side) rule(lim *rules.Limit) *ruleStats {
	if st := s.stats[lim]; st != nil {
		return st
	}
	return domainRow(s.special, lim.Domain, "limit override")
}

// noLimit returns the figures of domain's descriptors admitted without a
// limit (on Run's goroutine: apart from special, which the side's fills).
func (s *side) noLimit(domain string) *ruleStats {
	return domainRow(s.noLimits, domain, "no limit")
}

// domainRow returns the row of domain in rows, named "DOMAIN (what)":
// of at most MaxDomainRows domains, and past them one row of the others.
func domainRow(rows map[string]*ruleStats, domain, what string) *ruleStats {
	if st := rows[domain]; st != nil {
		return st
	}
	id := domain
	if len(rows) >= MaxDomainRows {
		// The key of the others' row: no request has an empty domain
		// (the service refuses it).
		domain, id = "", "(other domains)"
		if st := rows[domain]; st != nil {
			return st
		}
	}
	st := &ruleStats{report: RuleReport{ID: id + " (" + what + ")"}}
	rows[strings.Clone(domain)] = st
	return st
}

// account counts the decisions of one request of domain, res, against the
// other's codes. It runs on Run's goroutine.
func (s *side) account(res *result, other []bool, at time.Time, domain string) {
	var decidedBuf [8]bool
	decided := decidedBuf[:0]
	if len(res.codes) > len(decidedBuf) {
		decided = make([]bool, 0, len(res.codes))
	}
	decided = decided[:len(res.codes)]
	clear(decided)
	for _, d := range res.seen {
		if !d.shadow {
			decided[d.i] = true
		}
		// A limit in force is compared by its descriptor's answer: of
		// a list, the limits that admitted a hit a sibling refused did
		// not make the answers differ. A shadow limit is compared by
		// what it would have answered.
		mine := res.codes[d.i]
		if d.shadow {
			mine = d.over
		}
		s.count(d.rule, d.over, mine, other[d.i], d.key, at)
	}
	for i := range res.codes {
		if !decided[i] && other[i] {
			// Admitted without a limit here, refused there.
			s.count(s.noLimit(domain), false, false, true, "", at)
		}
	}
}

// count adds one limit's answer to st: over, its own; mine, the answer
// it is compared by (its descriptor's, or a shadow limit's own); otherOver,
// the other side's answer to the descriptor.
func (s *side) count(st *ruleStats, over, mine, otherOver bool, key string, at time.Time) {
	if st.report.Requests == 0 {
		s.order = append(s.order, st)
	}
	r := &st.report
	r.Requests++
	switch {
	case over && mine && !otherOver:
		r.RefusedOtherAdmitted++
	case !mine && otherOver:
		r.AdmittedOtherRefused++
	}
	if !over {
		return
	}
	r.Refused++
	k := st.keys[key]
	if k == nil {
		size := int64(len(key) + keyOverhead)
		if s.keys >= s.cfg.MaxKeys || s.keyBytes+size > s.cfg.MaxKeyBytes {
			r.RefusedUntracked++
			return
		}
		s.keys++
		s.keyBytes += size
		if st.keys == nil {
			st.keys = map[string]*KeyReport{}
		}
		k = &KeyReport{Key: key, First: at}
		st.keys[key] = k
	}
	k.Refused++
}

// rawKey is a descriptor's entries as the replay counts a key: each key
// and value after its length, cheap to build for every refusal and never
// ambiguous. formatKey writes it for the report.
func rawKey(entries []rules.Entry) string {
	n := 0
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2*binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(len(e.Key)))
		b = append(b, e.Key...)
		b = binary.AppendUvarint(b, uint64(len(e.Value)))
		b = append(b, e.Value...)
	}
	return string(b)
}

// formatKey writes a key rawKey made as the report lists it: key="value"
// pairs, the values quoted so that any byte shows as text.
func formatKey(raw string) string {
	var b strings.Builder
	next := func() string {
		n, k := binary.Uvarint([]byte(raw[:min(len(raw), binary.MaxVarintLen64)]))
		s := raw[k : k+int(n)]
		raw = raw[k+int(n):]
		return s
	}
	for raw != "" {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(next())
		b.WriteByte('=')
		b.WriteString(strconv.Quote(next()))
	}
	return b.String()
}

// ruleIDs names the limits as the live view and the statistics do: the
// rule's key, and for a limit of a rate_limits list its name or window;
// "#2", "#3"... for further limits of one name.
func ruleIDs(limits []*rules.Limit) []string {
	ids := make([]string, len(limits))
	seen := map[string]int{}
	for i, l := range limits {
		id := l.FullKey
		if l.StatLevel != "" {
			id += "." + l.StatLevel
		}
		if n := seen[id]; n > 0 {
			ids[i] = id + "#" + strconv.Itoa(n+1)
		} else {
			ids[i] = id
		}
		seen[id]++
	}
	return ids
}
