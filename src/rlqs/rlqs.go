// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3): each Envoy's stream of usage reports
// in, token-bucket assignments out. The fair shares are computed by the
// pure src/quota; this package owns the streams, their bounds, the leases
// and, with several replicas, the exchange through a store (share.go). It
// shares the request bounds and the codec with the rate-limit service
// through src/wire, and imports nothing of src/service.
package rlqs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/quota"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// Config tunes a Service. Zero bounds take their defaults.
type Config struct {
	// Auto answers Unimplemented while the rules have no quota_buckets
	// (RLQS_ENABLED empty); otherwise streams are served whatever the
	// rules.
	Auto bool
	// Pool tunes the allocation: the assignments' TTL
	// (RLQS_ASSIGNMENT_TTL), the idle timeout (RLQS_IDLE_TIMEOUT) and the
	// start of the learning period (Pool.Start; zero means when New
	// runs).
	Pool quota.Config
	// MaxStreams bounds the streams open at once (RLQS_MAX_STREAMS,
	// 1024); a new one past it is refused with ResourceExhausted.
	MaxStreams int
	// MaxBuckets bounds the subscriptions counted at once, all streams
	// together (RLQS_MAX_BUCKETS, 100,000), and MaxBucketsPerStream those
	// of one stream (RLQS_MAX_BUCKETS_PER_STREAM, 10,000). A bucket past
	// either gets no assignment, so that Envoy's no_assignment_behavior
	// decides its requests, and is counted as refused.
	MaxBuckets, MaxBucketsPerStream int
	// MaxStreamsPerPeer and MaxBucketsPerPeer are one client address's
	// share of MaxStreams and MaxBuckets (RLQS_MAX_STREAMS_PER_PEER, 16;
	// RLQS_MAX_BUCKETS_PER_PEER, 20,000), so that one client cannot take
	// what the others need; past them as past the global bounds. Streams
	// without an IP address (a unix socket, in process) or from a loopback
	// one (a sidecar's) have no share (see wire.PeerHost).
	MaxStreamsPerPeer, MaxBucketsPerPeer int
	// MaxReportBytes is the largest report the gRPC server accepts
	// (GRPC_MAX_RECV_MSG_SIZE); 0: no bound. Envoy sends every bucket it
	// holds in each report, and past this size the server refuses the
	// report and the stream ends, every time: so a report past three
	// quarters of it sheds buckets (see shed) until Envoy's next one
	// would take half.
	MaxReportBytes int
	// Share, when set, shares the pools with the other replicas of the
	// service through a store (Redis): see docs/RLQS.md, "Several
	// replicas". Nil: this process is the only replica, and its pools
	// live in its memory.
	Share Share
	// Replica names this replica to the others (with Share): a number
	// below 2^31, unique among the replicas; zero picks one at random.
	Replica uint32
	// Scope is the prefix of the store's keys (CACHE_KEY_PREFIX): the
	// replicas of one scope share their pools.
	Scope string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives what an operator should know; nil discards it.
	Log *slog.Logger
}

// Bounds of a quota report, besides the message size (GRPC_MAX_RECV_MSG_SIZE).
// A report past one ends its stream with InvalidArgument and the reason.
const (
	// MaxBucketEntries bounds the entries of one bucket id; key and
	// value lengths are those of descriptor entries (wire.MaxKeyLen,
	// wire.MaxValueLen).
	MaxBucketEntries = 64
	// maxReportedRequests caps the requests one bucket's report may
	// claim, so that sums cannot overflow; no Envoy serves 2^40 requests
	// in a report period.
	maxReportedRequests = 1 << 40
	// maxElapsed caps the time_elapsed a report may claim.
	maxElapsed = time.Hour
)

// Service serves Envoy's Rate Limit Quota Service: it answers each Envoy's
// stream of usage reports with quota assignments, one per bucket, from the
// quota_buckets of the rules. It is safe for concurrent use; rules are
// swapped whole with SetRules. Run must run for assignments to follow
// settling decreases, leases and idle buckets.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	cfg     Config
	rules   atomic.Pointer[rules.Config]
	closing chan struct{}
	close   sync.Once

	// pace is the report budget of every client together: a quarter of
	// MaxBuckets bucket reports a second (minAllReports at least), so
	// that the reports take a bounded part of the service's time whoever
	// sends them (a fleet at MaxBuckets reporting every 5 s, as Envoy 1.40
	// does, fits with room to spare). Guarded by mu.
	pace pacer
	// mu guards pools, streams, peers, subs, nextID, share and pace.
	mu      sync.Mutex
	pools   map[poolKey]*quotaPool
	streams map[uint64]*quotaStream
	// peers are the open streams of each client address (the host of
	// quotaStream.peer), for the per-peer shares.
	peers  map[string][]*quotaStream
	subs   int
	nextID uint64
	// idBase is the top half of the ids of this replica's streams.
	idBase uint64
	// share is the side of sharing the pools; nil with one replica.
	share *shareState
	// tickMu lets one Tick run at a time.
	tickMu sync.Mutex

	reports, noRule, refused, refusedStreams, invalid, badBuckets, shedBuckets, paced *stats.Counter
	// shedLog and paceLog hold back the warnings of shed buckets and of
	// paced streams: one a second.
	shedLog, paceLog wire.LogEvery
	// badLog holds back log lines of refused buckets: one a second.
	badLog wire.LogEvery
	reg    *stats.Registry
	// ruleStats are the counters of each quota rule, by ruleLabel;
	// guarded by mu.
	ruleStats map[string]*ruleTotals
	// stateHook, for tests, runs between the chunks of State's walk,
	// without the lock.
	stateHook func()
}

// ruleTotals are a quota rule's counters: the requests Envoys reported
// admitted and denied in its buckets, and those admitted beyond the
// shares granted (quota.Pool.Beyond).
type ruleTotals struct {
	allowed, denied, beyond *stats.Counter
}

// poolKey names a pool: a domain and a bucket id (see bucketKey).
type poolKey struct{ domain, bucket string }

// quotaPool is the allocation of one bucket id under one rule. With
// replicas, sh is this replica's side of it and p is set only while this
// replica owns it.
type quotaPool struct {
	id   map[string]string
	rule *rules.QuotaRule
	p    *quota.Pool
	sh   *sharedPool
	// retired: its rule is gone (see dropPool); it counts the grants
	// still in force until their leases end, then goes.
	retired bool
}

// quotaStream is one Envoy's stream.
type quotaStream struct {
	id uint64
	// peer is the client's address, for the live view; empty in process.
	// host is its IP address, which the per-peer shares count by; empty
	// when it has none.
	peer, host string
	domain     string
	// buckets are the stream's subscriptions, by bucketKey: the buckets
	// it reported that are subscribed to a pool. A bucket answered
	// without a pool (a blanket rule, no rule, a bound) has none, and one
	// leaves when it is abandoned, its pool is dropped or its rule
	// changes, so RLQS_MAX_BUCKETS_PER_STREAM counts live state only.
	buckets map[string]*streamBucket
	// pending are the assignments to send, by bucketKey; wake tells the
	// stream's handler there are some.
	pending map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction
	wake    chan struct{}
	// done is closed when the service ends the stream, with endErr (see
	// end); guarded by Service.mu.
	done   chan struct{}
	endErr error
	// pace is the report budget of the stream's client: shared by the
	// streams of one address, the stream's own without one. hold is how
	// long the stream's next report waits, set by each report (see
	// pacer.spend).
	pace *pacer
	hold time.Duration
}

// pacer spaces the reports of one client: each report, and each bucket in
// it, costs per of the client's time, and a client more than burst ahead
// of its time waits, its next report unread (gRPC's flow control holds
// the rest at the client). A client may so report each bucket place of
// its share once every paceRound, and all of them at once; Envoy reports
// every bucket once per reporting_interval (5 s), and each new one once
// more. Guarded by Service.mu.
type pacer struct {
	due        time.Time
	per, burst time.Duration
}

// paceRound is how often a client may report each bucket place of its
// share: a little more often than Envoy's 5 s, so that a client reporting
// faster than Envoy costs the service and the store what an Envoy would
// (issue 35: once a second, a client's 20,000 buckets cost ShouldRateLimit
// a third of its speed on Redis).
const paceRound = 4 * time.Second

// newPacer returns the budget of a client whose share is max bucket
// places: each of them, and one report more, every paceRound (so that a
// client of one bucket place reports it every 4 s too).
func newPacer(max int) *pacer {
	return &pacer{per: paceRound / time.Duration(max+1), burst: paceRound}
}

// minAllReports is the fewest bucket reports a second the service takes
// from all its clients together, however low RLQS_MAX_BUCKETS is.
const minAllReports = 1000

// spend charges cost to the client at now and returns how long its next
// report waits.
func (p *pacer) spend(now time.Time, cost int) time.Duration {
	if p.due.Before(now) {
		p.due = now
	}
	p.due = p.due.Add(time.Duration(cost) * p.per)
	return max(0, p.due.Sub(now)-p.burst)
}

// end ends the stream with err: its handler returns err.
func (st *quotaStream) end(err error) {
	if st.endErr == nil {
		st.endErr = err
		close(st.done)
	}
}

type streamBucket struct {
	stream uint64
	// key is the bucket id's bucketKey.
	key  string
	id   *rlqsv3.BucketId
	pool *quotaPool
}

// New returns a Service counting into reg.
func New(reg *stats.Registry, cfg Config) *Service {
	cfg.setDefaults()
	q := &Service{
		cfg:            cfg,
		closing:        make(chan struct{}),
		pools:          map[poolKey]*quotaPool{},
		streams:        map[uint64]*quotaStream{},
		pace:           pacer{per: time.Second / time.Duration(max(cfg.MaxBuckets/4, minAllReports)), burst: time.Second},
		peers:          map[string][]*quotaStream{},
		reports:        reg.Counter("ratelimit.rlqs.reports"),
		noRule:         reg.Counter("ratelimit.rlqs.no_rule"),
		refused:        reg.Counter("ratelimit.rlqs.buckets_refused"),
		refusedStreams: reg.Counter("ratelimit.rlqs.streams_refused"),
		invalid:        reg.Counter("ratelimit.rlqs.invalid_reports"),
		badBuckets:     reg.Counter("ratelimit.rlqs.invalid_buckets"),
		shedBuckets:    reg.Counter("ratelimit.rlqs.buckets_shed"),
		paced:          reg.Counter("ratelimit.rlqs.reports_paced"),
		reg:            reg,
		ruleStats:      map[string]*ruleTotals{},
	}
	if cfg.Share != nil {
		q.shareThroughStore(reg)
	}
	reg.GaugeFunc("ratelimit.rlqs.streams", func() int64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		return int64(len(q.streams))
	})
	reg.GaugeFunc("ratelimit.rlqs.subscriptions", func() int64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		return int64(q.subs)
	})
	return q
}

// shareThroughStore sets q up to share its pools with the other replicas
// through cfg.Share.
func (q *Service) shareThroughStore(reg *stats.Registry) {
	if q.cfg.Replica == 0 || q.cfg.Replica >= 1<<31 {
		q.cfg.Replica = newReplica()
	}
	q.idBase = uint64(q.cfg.Replica) << 32
	q.nextID = q.idBase
	q.share = &shareState{
		replica: strconv.FormatUint(uint64(q.cfg.Replica), 10),
		// Longer than any grant lives, and than a lease: a pool
		// nobody writes to is gone after that.
		keep:       4 * (q.cfg.Pool.TTL + q.cfg.Pool.Settle),
		lastOK:     q.cfg.Now(),
		chunk:      shareChunk,
		budget:     shareTickBudget,
		errors:     reg.Counter("ratelimit.rlqs.shared.errors"),
		takeovers:  reg.Counter("ratelimit.rlqs.shared.takeovers"),
		late:       reg.Counter("ratelimit.rlqs.shared.late_assignments"),
		badRecords: reg.Counter("ratelimit.rlqs.shared.bad_records"),
		tags:       map[string]poolKey{},
		urgent:     map[poolKey]bool{},
		wakes:      map[string]time.Time{},
		exchanges:  reg.Counter("ratelimit.rlqs.shared.exchanges"),
		notes:      reg.Counter("ratelimit.rlqs.shared.notes"),
	}
	q.cfg.Log.Info("quota service: the pools are shared with the other replicas through the store", "replica", q.cfg.Replica)
	reg.GaugeFunc("ratelimit.rlqs.shared.owned", func() int64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		n := 0
		for _, qp := range q.pools {
			if qp.sh != nil && qp.sh.owned {
				n++
			}
		}
		return int64(n)
	})
}

// setDefaults fills the settings left zero.
func (cfg *Config) setDefaults() {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Log = cmp.Or(cfg.Log, slog.New(slog.DiscardHandler))
	if cfg.Pool.Start.IsZero() {
		cfg.Pool.Start = cfg.Now()
	}
	cfg.Pool.TTL = cmp.Or(max(cfg.Pool.TTL, 0), quota.DefaultTTL)
	cfg.MaxStreams = cmp.Or(max(cfg.MaxStreams, 0), 1024)
	cfg.MaxBuckets = cmp.Or(max(cfg.MaxBuckets, 0), 100_000)
	cfg.MaxBucketsPerStream = cmp.Or(max(cfg.MaxBucketsPerStream, 0), min(10_000, cfg.MaxBuckets))
	cfg.MaxStreamsPerPeer = cmp.Or(max(cfg.MaxStreamsPerPeer, 0), min(16, cfg.MaxStreams))
	cfg.MaxBucketsPerPeer = cmp.Or(max(cfg.MaxBucketsPerPeer, 0), min(2*cfg.MaxBucketsPerStream, cfg.MaxBuckets))
	if cfg.Share != nil && cfg.Pool.Settle <= 0 {
		cfg.Pool.Settle = sharedSettle
	}
}

// SetRules publishes new rules. Pools whose rule changed take the new
// limit (decreases at once, increases as they settle; with replicas, at
// the next tick of the pool's owner); pools whose bucket
// no longer has a limited rule are dropped, and their buckets are
// answered by the new rule at their next report.
func (q *Service) SetRules(c *rules.Config) {
	now := q.cfg.Now()
	// Under the lock, so that a report sees the new rules and the pools
	// that follow them together.
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rules.Store(c)
	for k, qp := range q.pools {
		r := c.MatchQuota(k.domain, qp.id)
		switch {
		case r == qp.rule:
		case r == nil || !r.Policy.Limited():
			if !qp.retired {
				q.dropPool(now, k, qp)
			}
		case qp.sh != nil:
			// Its owner takes the new limit at its next tick.
			qp.rule = r
		default:
			// A retired pool whose rule came back resumes with the
			// grants still in force counted.
			qp.rule, qp.retired = r, false
			q.deliver(k, qp, qp.p.SetLimit(now, limitOf(r)))
		}
	}
}

// dropPool unsubscribes a pool's buckets from it, its rule being gone.
// The grants it gave stay in force at the Envoys until their leases end,
// so the pool, retired, counts them until then as it counts a closed
// stream's: a rule removed and restored within a lease shares only what
// they leave (issue 35: for 2.5 s the shares in force were 28.5/s of
// 20/s). A shared pool this replica owned is left to its lease's end: no
// replica runs it any more.
func (q *Service) dropPool(now time.Time, k poolKey, qp *quotaPool) {
	for _, st := range q.streams {
		if sb := st.buckets[k.bucket]; sb != nil && sb.pool == qp && st.domain == k.domain {
			sb.pool = nil
			delete(st.buckets, k.bucket)
		}
	}
	if qp.sh != nil {
		q.subs -= len(qp.sh.local)
		q.forgetShared(k, qp)
		return
	}
	qp.retired = true
	before := qp.p.Len()
	for _, s := range qp.p.Subscribers(now) {
		if !s.Gone && !s.Abandoned {
			qp.p.Leave(now, s.ID)
		}
	}
	q.subs += qp.p.Len() - before
	if qp.p.Empty() {
		delete(q.pools, k)
	}
}

func limitOf(r *rules.QuotaRule) quota.Limit {
	return quota.Limit{Rate: r.Rate(), Burst: float64(r.Capacity()), Equal: r.Policy == rules.Static}
}

// Run advances the allocation once a second (increases after decreases
// settled, ended leases, idle buckets) until ctx is done; with replicas,
// it also polls for what cannot wait for the next tick (see Poll).
func (q *Service) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var poll <-chan time.Time
	if q.share != nil {
		p := time.NewTicker(sharePoll)
		defer p.Stop()
		poll = p.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			q.tick(ctx)
		case <-poll:
			q.poll(ctx)
		}
	}
}

// Tick advances every pool to now and sends what changed; Run calls it
// once a second. With replicas, it exchanges the reports and grants of
// the tick with the store (see tickShared).
func (q *Service) Tick() { q.tick(context.Background()) }

func (q *Service) tick(ctx context.Context) {
	if q.share != nil {
		q.tickShared(ctx)
		return
	}
	q.tickMu.Lock()
	defer q.tickMu.Unlock()
	for _, k := range q.poolKeys() {
		// The lock is taken pool by pool: a report waits for one
		// pool's tick at most, not for all of them. Each pool reads
		// the clock when its turn comes: ticking 10,000 pools takes
		// milliseconds.
		q.mu.Lock()
		if qp := q.pools[k]; qp != nil {
			now := q.cfg.Now()
			before := qp.p.Len()
			changes := qp.p.Tick(now)
			q.subs += qp.p.Len() - before
			q.deliver(k, qp, changes)
			if qp.p.Empty() {
				delete(q.pools, k)
			}
		}
		q.mu.Unlock()
	}
}

// poolKeys returns the keys of the pools, sorted (without the lock).
func (q *Service) poolKeys() []poolKey {
	q.mu.Lock()
	keys := slices.AppendSeq(make([]poolKey, 0, len(q.pools)), maps.Keys(q.pools))
	q.mu.Unlock()
	slices.SortFunc(keys, comparePoolKeys)
	return keys
}

// Close ends every stream with Unavailable and refuses new ones: Envoy
// keeps its assignments until their TTL and opens a stream again, to
// this process or another. The server calls it at shutdown, before its
// graceful stop, which would otherwise wait for streams that never end.
func (q *Service) Close() { q.close.Do(func() { close(q.closing) }) }

// Streams returns the number of streams open.
func (q *Service) Streams() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.streams)
}

var errClosing = status.Error(codes.Unavailable, "service: shutting down; assignments stay in force until their TTL")

// StreamRateLimitQuotas serves one Envoy's stream through a Session.
func (q *Service) StreamRateLimitQuotas(ss rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	if q.cfg.Auto && !q.rules.Load().HasQuota() {
		return status.Error(codes.Unimplemented, "service: no quota_buckets in the rules, so the Rate Limit Quota Service is off (RLQS_ENABLED)")
	}
	ctx := ss.Context()
	var addr string
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	st, err := q.open(addr)
	if err != nil {
		return err
	}
	s := &Session{q: q, st: st}
	defer s.Close()
	// Recv blocks; a goroutine of its own leaves this one free to send
	// and to stop. It ends when the stream does: gRPC cancels the stream
	// when this handler returns, which ends a Recv in progress.
	msgs := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	// in is msgs, nil while the stream's client waits for its report
	// budget (see pacer): until resume.
	in := msgs
	var resume <-chan time.Time
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := ss.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	send := func() error {
		if r := s.Take(); r != nil {
			return ss.Send(r)
		}
		return nil
	}
	for {
		select {
		case m := <-in:
			if err := s.Report(m); err != nil {
				return err
			}
			if st.hold > 0 {
				in, resume = nil, time.After(st.hold)
			}
		case <-resume:
			in, resume = msgs, nil
		case <-s.Ready():
			if err := send(); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				// The client is done sending: answer its last reports.
				return send()
			}
			return err
		case <-q.closing:
			return errClosing
		case <-st.done:
			return q.endErr(st)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// Session is one client's stream of reports, in process: the gRPC
// handler serves each stream through one, and a simulator can drive the
// service through many with no network and a fake clock. Report, Take and
// Close may be called from different goroutines, each of them from one at
// a time.
type Session struct {
	q  *Service
	st *quotaStream
}

// Open starts a session, within MaxStreams: ResourceExhausted past it,
// Unavailable once Close was called.
func (q *Service) Open() (*Session, error) {
	st, err := q.open("")
	if err != nil {
		return nil, err
	}
	return &Session{q: q, st: st}, nil
}

// Report handles one message of the session's client. A message past a
// bound is refused with InvalidArgument and the reason; the stream should
// then end.
func (s *Session) Report(m *rlqsv3.RateLimitQuotaUsageReports) error {
	if err := s.q.report(s.st, m); err != nil {
		s.q.invalid.Inc()
		s.q.cfg.Log.Warn("quota report refused; closing the stream", "err", err)
		return err
	}
	return nil
}

// Ready is signalled when the session has actions to send (see Take).
func (s *Session) Ready() <-chan struct{} { return s.st.wake }

// Done is closed when the service ends the session (a replica that cannot
// reach the store it shares quotas through); Err then says why.
func (s *Session) Done() <-chan struct{} { return s.st.done }

// Err is why the service ended the session, nil while it has not.
func (s *Session) Err() error { return s.q.endErr(s.st) }

// Take returns the session's pending actions in one response, sorted by
// bucket, and clears them; nil when there are none. An action replaces an
// older one for the same bucket that was not taken yet.
func (s *Session) Take() *rlqsv3.RateLimitQuotaResponse {
	q, st := s.q, s.st
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(st.pending) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(st.pending))
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(keys))}
	for _, k := range keys {
		resp.BucketAction = append(resp.BucketAction, st.pending[k])
	}
	clear(st.pending)
	return resp
}

// Close ends the session: its buckets' shares stay counted until their
// leases end, since Envoy keeps its assignments until then.
func (s *Session) Close() { s.q.end(s.st) }

// open registers a new stream, within MaxStreams.
func (q *Service) open(peer string) (*quotaStream, error) {
	select {
	case <-q.closing:
		return nil, errClosing
	default:
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.share != nil && q.share.down {
		return nil, q.share.downErr
	}
	if len(q.streams) >= q.cfg.MaxStreams {
		q.refusedStreams.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "service: %d quota streams open already (RLQS_MAX_STREAMS)", q.cfg.MaxStreams)
	}
	host := wire.PeerHost(peer)
	if host != "" && len(q.peers[host]) >= q.cfg.MaxStreamsPerPeer {
		q.refusedStreams.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "service: %d quota streams open already from this address (RLQS_MAX_STREAMS_PER_PEER)", q.cfg.MaxStreamsPerPeer)
	}
	// Ids count up in the bottom half; a process that opened 2^32
	// streams starts again from 1.
	q.nextID = q.idBase | uint64(uint32(q.nextID)+1)
	if uint32(q.nextID) == 0 {
		q.nextID++
	}
	st := &quotaStream{
		id:      q.nextID,
		peer:    peer,
		host:    host,
		pace:    q.pacerFor(host),
		buckets: map[string]*streamBucket{},
		pending: map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction{},
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	q.streams[st.id] = st
	if host != "" {
		q.peers[host] = append(q.peers[host], st)
	}
	return st, nil
}

// pacerFor returns the report budget of a new stream from host: its
// address's, shared by its streams, for RLQS_MAX_BUCKETS_PER_PEER bucket
// places; a stream's own for RLQS_MAX_BUCKETS_PER_STREAM without an
// address. q.mu is held.
func (q *Service) pacerFor(host string) *pacer {
	if host == "" {
		return newPacer(q.cfg.MaxBucketsPerStream)
	}
	if others := q.peers[host]; len(others) > 0 {
		return others[0].pace
	}
	return newPacer(q.cfg.MaxBucketsPerPeer)
}

// peerSubs counts the subscriptions of the streams of st's client
// address; q.mu is held.
func (q *Service) peerSubs(st *quotaStream) int {
	n := 0
	for _, o := range q.peers[st.host] {
		n += len(o.buckets)
	}
	return n
}

// end unsubscribes a stream's buckets: their shares stay counted until
// their leases end, since Envoy keeps its assignments until then.
func (q *Service) end(st *quotaStream) {
	now := q.cfg.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.streams, st.id)
	if st.host != "" {
		rest := slices.DeleteFunc(q.peers[st.host], func(o *quotaStream) bool { return o == st })
		if len(rest) == 0 {
			delete(q.peers, st.host)
		} else {
			q.peers[st.host] = rest
		}
	}
	for key, sb := range st.buckets {
		q.leave(now, st, poolKey{st.domain, key}, sb)
	}
}

// endErr is why the service ended st.
func (q *Service) endErr(st *quotaStream) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return st.endErr
}

// leave unsubscribes sb, a bucket of stream st, from its pool.
func (q *Service) leave(now time.Time, st *quotaStream, k poolKey, sb *streamBucket) {
	qp := sb.pool
	sb.pool = nil
	delete(st.buckets, k.bucket)
	if q.pools[k] != qp {
		return
	}
	if qp.sh != nil {
		q.sharedLeave(qp, sb.stream)
		return
	}
	before := qp.p.Len()
	changes := qp.p.Leave(now, sb.stream)
	q.subs += qp.p.Len() - before
	q.deliver(k, qp, changes)
	if qp.p.Empty() {
		delete(q.pools, k)
	}
}

// report handles one message of a stream.
func (q *Service) report(st *quotaStream, m *rlqsv3.RateLimitQuotaUsageReports) error {
	if err := validateReport(st, m); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	now := q.cfg.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	cfg := q.rules.Load()
	st.domain = cmp.Or(st.domain, m.GetDomain())
	if n, why := wire.Dropped(m); n > 0 {
		// Buckets whose ids are not valid UTF-8 (header bytes an end
		// user chose) cannot be answered: no proto library encodes
		// such an id, and Envoy would refuse the whole response. They
		// are dropped alone; Envoy's no_assignment_behavior decides
		// their requests.
		q.badBuckets.Add(uint64(n))
		if ok, held := q.badLog.Allow(now); ok {
			q.cfg.Log.Warn("quota report: buckets dropped; the stream goes on",
				"reason", why, "domain", m.GetDomain(), "peer", st.peer, "held_back", held)
		}
	}
	shed := q.toShed(m)
	for i, u := range m.GetBucketQuotaUsages() {
		q.reports.Inc()
		if why := checkBucket(u.GetBucketId().GetBucket()); why != "" {
			q.refuseBucket(now, st, u.GetBucketId(), fmt.Sprintf("bucket %d: %s", i, why))
			continue
		}
		if shed[i] {
			q.shedBucket(now, st, u)
			continue
		}
		q.reportBucket(now, cfg, st, u)
	}
	cost := 1 + len(m.GetBucketQuotaUsages())
	own, all := st.pace.spend(now, cost), q.pace.spend(now, cost)
	st.hold = max(own, all)
	if st.hold > 0 {
		q.paced.Inc()
		if ok, held := q.paceLog.Allow(now); ok {
			why := "quota client reports more buckets a second than its share: its next report waits"
			if all > own {
				why = "quota clients together report more buckets a second than RLQS_MAX_BUCKETS/4: their next reports wait"
			}
			q.cfg.Log.Warn(why, "wait", st.hold, "domain", st.domain, "peer", st.peer, "held_back", held)
		}
	}
	if len(shed) > 0 {
		q.shedBuckets.Add(uint64(len(shed)))
		if ok, held := q.shedLog.Allow(now); ok {
			q.cfg.Log.Warn("quota report near GRPC_MAX_RECV_MSG_SIZE: the least busy buckets are abandoned so that the stream goes on; raise GRPC_MAX_RECV_MSG_SIZE for Envoys with this many buckets",
				"report_bytes", proto.Size(m), "limit", q.cfg.MaxReportBytes, "buckets", len(m.GetBucketQuotaUsages()),
				"abandoned", len(shed), "domain", st.domain, "peer", st.peer, "held_back", held)
		}
	}
	return nil
}

// toShed returns the buckets of a report to abandon, by index, when the
// report takes more than three quarters of MaxReportBytes: the least
// busy first (the fewest requests in this report), until what is left
// takes half. Envoy sends every bucket it holds in every report, the new
// ones included, so without this its reports grow with its buckets until
// the server refuses them, and the stream with them, at every report;
// abandoned buckets leave Envoy's reports, and come back at their next
// request.
func (q *Service) toShed(m *rlqsv3.RateLimitQuotaUsageReports) map[int]bool {
	limit := q.cfg.MaxReportBytes
	size := proto.Size(m)
	if limit <= 0 || size <= limit/4*3 {
		return nil
	}
	us := m.GetBucketQuotaUsages()
	order := make([]int, len(us))
	for i := range order {
		order[i] = i
	}
	busy := func(i int) uint64 { return us[i].GetNumRequestsAllowed() + us[i].GetNumRequestsDenied() }
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(busy(a), busy(b)) })
	shed := map[int]bool{}
	for _, i := range order {
		if size <= limit/2 {
			break
		}
		shed[i] = true
		// The field's tag and length prefix, at most 4 bytes here.
		size -= proto.Size(us[i]) + 4
	}
	return shed
}

// shedBucket abandons a bucket of an oversized report (see toShed): it
// leaves its pool, if it had one. q.mu is held.
func (q *Service) shedBucket(now time.Time, st *quotaStream, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	key := bucketKey(u.GetBucketId().GetBucket())
	if sb := st.buckets[key]; sb != nil {
		q.leave(now, st, poolKey{st.domain, key}, sb)
	}
	q.queue(st, key, assignment(u.GetBucketId(), quota.Grant{Abandon: true}, nil))
}

// refuse answers a bucket past RLQS_MAX_BUCKETS or
// RLQS_MAX_BUCKETS_PER_STREAM with an abandon: its requests follow Envoy's
// no_assignment_behavior, and Envoy drops it rather than resending it in
// every report, which would grow Envoy's reports past
// GRPC_MAX_RECV_MSG_SIZE with buckets never answered. q.mu is held.
func (q *Service) refuse(st *quotaStream, key string, id *rlqsv3.BucketId) {
	q.refused.Inc()
	q.queue(st, key, assignment(id, quota.Grant{Abandon: true}, nil))
}

// refuseBucket answers a bucket whose id breaks a bound with an abandon,
// alone: Envoy drops the bucket, so that its id leaves Envoy's reports,
// and its requests follow Envoy's no_assignment_behavior until the next
// one creates it again. The stream and its other buckets go on: a
// request header that an end user chose must not end enforcement for
// everyone behind the same Envoy. q.mu is held.
func (q *Service) refuseBucket(now time.Time, st *quotaStream, id *rlqsv3.BucketId, why string) {
	q.badBuckets.Inc()
	if ok, held := q.badLog.Allow(now); ok {
		q.cfg.Log.Warn("quota report: bucket abandoned for breaking a bound; the stream goes on",
			"reason", why, "domain", st.domain, "peer", st.peer, "held_back", held)
	}
	if len(id.GetBucket()) == 0 {
		return // nothing Envoy could match an answer with
	}
	q.queue(st, bucketKey(id.GetBucket()), assignment(id, quota.Grant{Abandon: true}, nil))
}

// reportBucket handles the report of one bucket of stream st: its
// subscription, within the bounds, and its usage. q.mu is held.
func (q *Service) reportBucket(now time.Time, cfg *rules.Config, st *quotaStream, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	id := u.GetBucketId().GetBucket()
	key := bucketKey(id)
	pk := poolKey{st.domain, key}
	sb := st.buckets[key]
	r := cfg.MatchQuota(st.domain, id)
	switch {
	case sb == nil:
	case q.pools[pk] != sb.pool:
		// Its pool ended (abandoned, then dropped): subscribing again
		// is a new subscription, within the bounds.
		sb.pool = nil
		delete(st.buckets, key)
		sb = nil
	case r == nil || sb.pool.rule != r:
		q.leave(now, st, pk, sb)
		sb = nil
	}
	allowed := min(u.GetNumRequestsAllowed(), maxReportedRequests)
	denied := min(u.GetNumRequestsDenied(), maxReportedRequests)
	var totals *ruleTotals
	if r != nil {
		totals = q.totals(r)
		totals.allowed.Add(allowed)
		totals.denied.Add(denied)
	}
	switch {
	case r == nil:
		// No answer: Envoy's no_assignment_behavior decides, as while
		// the service is unreachable.
		q.noRule.Inc()
		return
	case !r.Policy.Limited():
		q.queue(st, key, q.blanket(u.GetBucketId(), r.Policy))
		return
	}
	if sb == nil && (len(st.buckets) >= q.cfg.MaxBucketsPerStream || (st.host != "" && q.peerSubs(st) >= q.cfg.MaxBucketsPerPeer)) {
		q.refuse(st, key, u.GetBucketId())
		return
	}
	qp := q.pools[pk]
	if qp == nil {
		if q.subs >= q.cfg.MaxBuckets {
			q.refuse(st, key, u.GetBucketId())
			return
		}
		qp = &quotaPool{id: id, rule: r}
		if q.share != nil {
			qp.sh = newSharedPool(q.cfg.Scope + "\x00" + st.domain + "\x00" + key)
			q.share.tags[qp.sh.tag] = pk
		} else {
			qp.p = quota.NewPool(limitOf(r), q.cfg.Pool)
		}
		q.pools[pk] = qp
	}
	if sb == nil {
		if q.subs >= q.cfg.MaxBuckets {
			q.refuse(st, key, u.GetBucketId())
			return
		}
		sb = &streamBucket{stream: st.id, key: key, id: u.GetBucketId()}
		st.buckets[key] = sb
	}
	sb.pool = qp
	if qp.sh != nil {
		// Answered at a tick, once the pool's owner has run it.
		q.sharedReport(now, qp, st, sb, allowed, denied, elapsedOf(u))
		return
	}
	before, beyond := qp.p.Len(), qp.p.Beyond()
	changes := qp.p.Report(now, st.id, quota.Usage{Allowed: allowed, Denied: denied, Elapsed: elapsedOf(u)})
	q.subs += qp.p.Len() - before
	totals.beyond.Add(qp.p.Beyond() - beyond)
	q.deliver(pk, qp, changes)
	if !qp.p.Subscribed(st.id) {
		// A report Envoy sent before it had its abandon: the bucket
		// is gone from Envoy, and from the stream.
		sb.pool = nil
		delete(st.buckets, key)
	}
}

// ruleLabel names a quota rule in statistics and the live view: its name,
// or its place in its domain's list.
func ruleLabel(r *rules.QuotaRule) string {
	if r.Name != "" {
		return r.Name
	}
	return "quota_buckets[" + strconv.Itoa(r.Index) + "]"
}

// totals returns the counters of rule r, made on first use: one set per
// rule of the rules, so they are bounded as the rules are.
func (q *Service) totals(r *rules.QuotaRule) *ruleTotals {
	k := r.Domain + "\x00" + ruleLabel(r)
	t := q.ruleStats[k]
	if t == nil {
		tags := []stats.Label{{Name: "domain", Value: r.Domain}, {Name: "rule", Value: ruleLabel(r)}}
		t = &ruleTotals{
			allowed: q.reg.TaggedCounter("ratelimit.rlqs.rule.allowed", tags...),
			denied:  q.reg.TaggedCounter("ratelimit.rlqs.rule.denied", tags...),
			beyond:  q.reg.TaggedCounter("ratelimit.rlqs.rule.beyond_share", tags...),
		}
		q.ruleStats[k] = t
	}
	return t
}

func elapsedOf(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) time.Duration {
	e := u.GetTimeElapsed()
	if e == nil || e.GetSeconds() < 0 || e.GetNanos() < 0 {
		return 0
	}
	if e.GetSeconds() >= int64(maxElapsed/time.Second) {
		return maxElapsed
	}
	return e.AsDuration()
}

// validateReport checks a message's own bounds: its decoding and its
// domain, which Envoy's configuration sets, not its requests. A message
// past one ends its stream. Each bucket's id is checked alone
// (checkBucket).
func validateReport(st *quotaStream, m *rlqsv3.RateLimitQuotaUsageReports) error {
	if msg, bad := wire.Malformed(m); bad {
		return fmt.Errorf("invalid RateLimitQuotaUsageReports: %s", msg)
	}
	d := m.GetDomain()
	switch {
	case d == "":
		return fmt.Errorf("quota report: domain must not be empty")
	case len(d) > wire.MaxDomainLen:
		return fmt.Errorf("quota report: domain is %d bytes long, the limit is %d", len(d), wire.MaxDomainLen)
	case st.domain != "" && d != st.domain:
		return fmt.Errorf("quota report: domain %q on a stream of domain %q; open a stream per domain", d, st.domain)
	}
	return nil
}

// checkBucket says which bound a bucket id breaks, if any: its entries
// come from request headers, which end users choose. The time_elapsed of
// 0 Envoy sends for a new bucket, which the proto's own rules refuse, is
// accepted.
func checkBucket(id map[string]string) string {
	if len(id) == 0 {
		return "empty bucket id"
	}
	if len(id) > MaxBucketEntries {
		return fmt.Sprintf("id has %d entries, the limit is %d", len(id), MaxBucketEntries)
	}
	for k, v := range id {
		switch {
		case k == "":
			return "id has an empty key"
		case len(k) > wire.MaxKeyLen:
			return fmt.Sprintf("key is %d bytes long, the limit is %d", len(k), wire.MaxKeyLen)
		case len(v) > wire.MaxValueLen:
			return fmt.Sprintf("value of %q is %d bytes long, the limit is %d", k, len(v), wire.MaxValueLen)
		}
	}
	return ""
}

// deliver queues the grants of changes to their streams; a change for a
// stream that ended is dropped (the pool was told).
func (q *Service) deliver(k poolKey, qp *quotaPool, changes []quota.Change) {
	ttl := q.ttl()
	for _, c := range changes {
		st := q.streams[c.Sub]
		if st == nil || st.domain != k.domain {
			continue
		}
		sb := st.buckets[k.bucket]
		if sb == nil || sb.pool != qp {
			continue
		}
		q.queue(st, k.bucket, assignment(sb.id, c.Grant, ttl))
		if c.Grant.Abandon {
			// Envoy drops the bucket: the stream holds it no more.
			delete(st.buckets, k.bucket)
		}
	}
}

// queue puts an action in a stream's outbox, replacing any older one for
// the same bucket, and wakes its handler.
func (q *Service) queue(st *quotaStream, key string, a *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	st.pending[key] = a
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

func (q *Service) ttl() *durationpb.Duration { return durationpb.New(q.cfg.Pool.TTL) }

// blanket is the action of a deny_all or allow_all rule.
func (q *Service) blanket(id *rlqsv3.BucketId, p rules.Policy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	rule := typev3.RateLimitStrategy_ALLOW_ALL
	if p == rules.DenyAll {
		rule = typev3.RateLimitStrategy_DENY_ALL
	}
	return quotaAction(id, q.ttl(), &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
}

// assignment is the action of a grant.
func assignment(id *rlqsv3.BucketId, g quota.Grant, ttl *durationpb.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	switch {
	case g.Abandon:
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{
			BucketId: id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
				AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{},
			},
		}
	case g.Deny():
		return quotaAction(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}})
	}
	return quotaAction(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     g.MaxTokens,
		TokensPerFill: wrapperspb.UInt32(g.TokensPerFill),
		FillInterval:  durationpb.New(g.FillInterval),
	}}})
}

func quotaAction(id *rlqsv3.BucketId, ttl *durationpb.Duration, s *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl,
				RateLimitStrategy:    s,
			},
		},
	}
}

// bucketKey is a bucket id as one string, the same for the same entries
// in any order: each key and value, sorted by key, prefixed by its length.
func bucketKey(id map[string]string) string {
	keys := slices.SortedFunc(maps.Keys(id), strings.Compare)
	var b strings.Builder
	for _, k := range keys {
		for _, s := range [2]string{k, id[k]} {
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	return b.String()
}
