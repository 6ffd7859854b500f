package rlqs

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimit/src/quota"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// Several replicas of the service share their pools through a store
// (Redis), as docs/RLQS.md ("Several replicas") describes:
//
//   - a report is not answered at once: its replica keeps it and hands
//     it over to the store at its next tick (every second), with every
//     report of its streams for that pool since; a subscriber that reports
//     more often than Envoy does has its reports added up for a report
//     period (less a second) before they are handed over;
//   - one replica, the pool's owner, holds a lease on it in the store,
//     renewed at each of its exchanges. At each tick it runs the pool
//     (quota.Pool), on the reports every replica handed over when there
//     are some, and writes the pool's state and the grants that changed,
//     together, and only while the lease is still its own;
//   - every replica reads the grants written for its own streams'
//     subscribers, and sends those it has not sent yet;
//   - a replica exchanges a pool with the store only when there is
//     something to exchange: reports of another replica's subscribers to
//     hand over, or a note another replica left it (an owner that wrote
//     grants for its subscribers; a replica that handed over reports to
//     a pool it owns, at each handover, so that a note lost costs a
//     report period at most), or a pool whose owner stopped beating, and
//     besides every pool it neither exchanged nor wrote for shareSweep:
//     an owner's own reports need no exchange;
//   - every replica beats at each tick: a replica that has not beaten for
//     shareAlive is dead. Its leases are free at once, and the owners of
//     its subscribers take them as gone (their streams closed with it);
//   - a replica that takes a pool over (its owner died, or lost the
//     store) resumes from the state its previous owner wrote: every grant
//     any replica sent was written there first.
//
// No library shares RLQS pools between replicas (Envoy's API leaves it to
// the service), so this protocol is written here, over go-redis and a few
// Lua scripts: about one script per bucket report, and 14.5 % of a Redis
// core for three replicas at 10,000 buckets (docs/BENCHMARKS.md, "A quota
// client beside ShouldRateLimit"; docs/RLQS.md, rlqssim's table).
//
// A grant reaches its Envoy up to a tick and two round trips later than
// on one replica, so the pools count a decrease as settled only after
// sharedSettle, and a grant's lease accordingly.

// Share is what the service needs of a store to share its pools
// with the other replicas: see quota.SyncRequest and quota.CommitRequest.
// The Redis store has it.
type Share interface {
	// SyncQuota makes each request's exchange; each reply has its error.
	SyncQuota(ctx context.Context, reqs []quota.SyncRequest) []quota.SyncReply
	// CommitQuota makes each owner's write, and leaves the notes; each
	// write has its error, quota.ErrNotOwner when its lease changed hands.
	CommitQuota(ctx context.Context, reqs []quota.CommitRequest, notes []quota.Note) []error
	// QuotaStarted returns when the shared pools of scope started, now
	// when they had not (the store is new, or lost its data).
	QuotaStarted(ctx context.Context, scope string, now time.Time) (time.Time, error)
	// BeatQuota records the replica's beat, and returns the replicas
	// alive and the notes left for it.
	BeatQuota(ctx context.Context, b quota.Beat) (quota.BeatReply, error)
}

// SharedSettle is the pools' Settle with replicas (see sharedSettle).
const SharedSettle = sharedSettle

const (
	// sharedSettle is a pool's Settle with replicas: the time a grant may
	// take to be in force at its Envoy, from the owner's decision to the
	// write (a round trip), to the next tick of the stream's replica (a
	// second) and its read (a round trip), then on the stream
	// (quota.DefaultSettle). The round trips, and what the ticks take,
	// have half a second.
	sharedSettle = quota.DefaultSettle + time.Second + 500*time.Millisecond
	// shareAlive is how long a replica that stopped beating counts as
	// alive: three ticks. An owner that stops (or loses the store) is
	// replaced within it and a tick.
	shareAlive = 3 * time.Second
	// shareSweep is how often a replica exchanges a pool with nothing to
	// exchange: what a lost note can delay (see Share).
	shareSweep = 5 * time.Second
	// shareLease is how long a pool's lease lasts without a renewal; an
	// owner renews it at every exchange, every shareSweep at least. A
	// lease ends before that when its owner stops beating (shareAlive).
	shareLease = shareSweep + shareAlive
	// shareMaxReplicas bounds the replicas a beat reads: past it, the
	// others would be taken for dead.
	shareMaxReplicas = 4096
	// sharePoll is how often a replica takes its notes between ticks, and
	// serves its new subscribers: a new bucket's first grant takes a few
	// polls, not a few ticks.
	sharePoll = 100 * time.Millisecond
	// shareDownAfter is how long a replica that cannot reach the store
	// keeps its streams: then it ends them with Unavailable, and refuses
	// new ones until the store answers again, so that Envoys open theirs
	// to a replica that can, before their assignments expire.
	shareDownAfter = 3 * time.Second
	// shareCallBudget bounds each of a tick's calls to the store, the
	// exchange and the owners' writes: a store that stops answering (a
	// frozen process, a blackholed network) costs a tick that long, not
	// the store's own timeout (REDIS_TIMEOUT, 10 s by default), so that
	// shareDownAfter holds (issue 35: streams ended after 10 s, not 3).
	shareCallBudget = time.Second
	// shareChunk is how many pools a tick exchanges with the store in
	// one round trip, each within shareCallBudget: a store slowed by the
	// work (many pools) answers each chunk in time, while one that stopped
	// answering fails the first.
	shareChunk = 512
	// shareTickBudget is how long a tick starts new chunks for: the pools
	// it did not reach are exchanged first at the next tick. It bounds
	// the store's time the quota pools take, whatever the clients report,
	// so that the store keeps its time for ShouldRateLimit (issue 35: 20,000
	// buckets' exchanges took every second of Redis's time).
	shareTickBudget = 400 * time.Millisecond
)

// sharedPool is what a replica holds of a shared pool, guarded by
// Service.mu. Its maps are bounded: local by RLQS_MAX_BUCKETS (they count
// in Service.subs), grants and stored by the pool's subscribers, which are
// those of every replica's streams, each within its RLQS_MAX_BUCKETS.
type sharedPool struct {
	// name is the pool's name in the store: the scope (CACHE_KEY_PREFIX),
	// the domain and the bucket id; tag names it in notes.
	name, tag string
	// holder is the replica that held its lease at the last exchange
	// ("" until one); synced is when that was, or when its owner (this
	// replica) last wrote it, which renews the lease too.
	holder string
	synced time.Time
	// local are the subscribers of this replica's streams, by id.
	local map[uint64]*localSub

	// The owner's side, while owned: the pool runs in quotaPool.p.
	owned bool
	epoch uint64
	// reload: the last commit failed, so what the store holds is not
	// known; the next sync asks for the state.
	reload bool
	// seq counts the grants written under the lease.
	seq uint64
	// grants are the grant records in force, by subscriber; stored what
	// the store holds (nil values: held there, but not known here), and
	// state the state it holds.
	grants, stored map[uint64][]byte
	state          []byte
}

// localSub is a subscriber of this replica: one of its streams reporting
// the pool's bucket.
type localSub struct {
	id uint64
	st *quotaStream
	sb *streamBucket
	// pending are its reports not handed over yet; sent those in the
	// sync in flight; held those handed over that the owner may not have
	// taken yet (a new report is written merged with them).
	pending, sent, held quota.Handover
	// left: its stream closed (or its bucket left the pool); it goes once
	// that is handed over.
	left bool
	// delivered is the last grant record sent to its stream.
	delivered []byte
	grant     quota.Grant
	// handed is when its reports were last handed over.
	handed time.Time
}

func newSharedPool(name string) *sharedPool {
	sum := sha256.Sum256([]byte(name))
	return &sharedPool{name: name, tag: hex.EncodeToString(sum[:12]), local: map[uint64]*localSub{}}
}

// shareState is the replica's side of sharing, guarded by Service.mu.
type shareState struct {
	// replica names this replica in the store (its ids' top half).
	replica string
	keep    time.Duration
	// started is when the shared pools started, as last read.
	started time.Time
	// lastOK is when a sync last succeeded; down is set while none did
	// for shareDownAfter, and the replica has ended its streams.
	lastOK time.Time
	down   bool
	// downErr is what streams are told while down.
	downErr error
	// resume is the first pool the next tick exchanges, when the last
	// one ran out of its budget (resuming: set).
	resume   poolKey
	resuming bool
	// chunk and budget are shareChunk and shareTickBudget; tests lower
	// them.
	chunk  int
	budget time.Duration
	// alive are the replicas that beat lately, as last read (nil: not
	// known), by name and by number (the top half of their ids); noted
	// the pools noted for this replica and not exchanged yet, by tag
	// (nil: not known, every pool is exchanged).
	alive, noted map[string]bool
	aliveIDs     map[uint64]bool
	// beaten is when this replica's last beat was written.
	beaten time.Time
	// tags are the shared pools by tag; urgent those with a new
	// subscriber here since the last poll.
	tags   map[string]poolKey
	urgent map[poolKey]bool
	// wakes are the pools owned here to run at the first poll after a
	// time, by tag: when a lease a reconnect ended is over (quota.Pool.Wake).
	wakes map[string]time.Time

	// Counters (docs/RLQS.md, "Observing it").
	errors, takeovers, late, badRecords *stats.Counter
	exchanges, notes                    *stats.Counter
}

// newReplica returns a replica number: random, so that replicas need not
// agree on one, of 31 bits, so that its ids (replica<<32 | stream) stay
// below the pool's ghost ids (1<<63).
func newReplica() uint32 { return 1 + rand.Uint32N(1<<31-1) }

func subField(id uint64) string { return strconv.FormatUint(id, 10) }

// sharedReport records a report of a stream's bucket in a shared pool.
func (q *Service) sharedReport(now time.Time, qp *quotaPool, st *quotaStream, sb *streamBucket, allowed, denied uint64, elapsed time.Duration) {
	ls := qp.sh.local[st.id]
	if ls != nil && ls.left {
		// Its bucket left the pool and came back (the rules changed
		// twice) before the leave was handed over: this report is
		// dropped, and the next one subscribes again.
		return
	}
	if ls == nil {
		ls = &localSub{id: st.id, st: st, sb: sb}
		qp.sh.local[st.id] = ls
		q.subs++
		q.share.urgent[poolKey{domain: st.domain, bucket: sb.key}] = true
	}
	ls.pending = ls.pending.Add(now, allowed, denied, elapsed)
}

// sharedLeave records that a stream's bucket left a shared pool: the
// owner is told at the next tick.
func (q *Service) sharedLeave(qp *quotaPool, stream uint64) {
	if ls := qp.sh.local[stream]; ls != nil {
		ls.left = true
		ls.pending.Left = true
	}
}

// syncing is one pool's part of a tick.
type syncing struct {
	k      poolKey
	qp     *quotaPool
	pushed []*localSub
	want   []*localSub
	// commit is the pool's write in the tick's, -1 for none; fresh: when
	// the shared pools started could not be read for it.
	commit int
	fresh  bool
	// local: an owned pool run without an exchange, on the reports of
	// its own subscribers.
	local   bool
	reports []quota.Field
}

// tickShared is Tick with a shared store: an exchange with the store for
// every pool with a subscriber here or owned here, then the owners run
// their pools and write them, then grants are sent; shareChunk pools at a
// time, for shareTickBudget.
func (q *Service) tickShared(ctx context.Context) {
	q.tickMu.Lock()
	defer q.tickMu.Unlock()
	start := time.Now()
	if !q.beat(ctx) {
		return
	}
	keys := q.rotatedPoolKeys()
	chunk, budget := q.share.chunk, q.share.budget
	for i := 0; i < len(keys); i += chunk {
		if i > 0 && time.Since(start) >= budget {
			q.mu.Lock()
			q.share.resume, q.share.resuming = keys[i], true
			q.mu.Unlock()
			return
		}
		if !q.syncChunk(ctx, keys[i:min(i+chunk, len(keys))], false) {
			return
		}
	}
	q.mu.Lock()
	q.share.resuming = false
	q.mu.Unlock()
}

// rotatedPoolKeys returns the keys of the pools, sorted, from the one the
// last tick stopped before (see shareTickBudget).
func (q *Service) rotatedPoolKeys() []poolKey {
	keys := q.poolKeys()
	q.mu.Lock()
	resume, resuming := q.share.resume, q.share.resuming
	q.mu.Unlock()
	if !resuming {
		return keys
	}
	i, _ := slices.BinarySearchFunc(keys, resume, comparePoolKeys)
	return append(keys[i:len(keys):len(keys)], keys[:i]...)
}

// beat records this replica's beat in the store, and reads which
// replicas are alive and the notes left for it. It returns whether the
// store answered.
func (q *Service) beat(ctx context.Context) bool {
	now := q.cfg.Now()
	sh := q.share
	ctx, cancel := context.WithTimeout(ctx, shareCallBudget)
	rep, err := q.cfg.Share.BeatQuota(ctx, quota.Beat{
		Scope: q.cfg.Scope, Replica: sh.replica, Now: now,
		Alive: shareAlive, Keep: sh.keep, Max: max(q.cfg.MaxBuckets, shareMaxReplicas),
	})
	cancel()
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		sh.errors.Inc()
		sh.alive, sh.aliveIDs, sh.noted = nil, nil, nil
		q.noteShareReached(false, err)
		return false
	}
	q.noteShareReached(true, nil)
	sh.beaten = now
	sh.alive, sh.aliveIDs = nil, nil
	if len(rep.Alive) < shareMaxReplicas {
		sh.alive = make(map[string]bool, len(rep.Alive))
		sh.aliveIDs = make(map[uint64]bool, len(rep.Alive))
		for _, r := range rep.Alive {
			sh.alive[r] = true
			if n, err := strconv.ParseUint(r, 10, 32); err == nil {
				sh.aliveIDs[n] = true
			}
		}
	}
	if sh.noted == nil {
		sh.noted = map[string]bool{}
	}
	q.takeNotes(rep.Tags)
	return true
}

// takeNotes records the notes read, of the pools this replica has. q.mu
// is held.
func (q *Service) takeNotes(tags []string) {
	sh := q.share
	if sh.noted == nil {
		return // every pool is exchanged at the next tick
	}
	for _, t := range tags {
		if _, ok := sh.tags[t]; ok {
			sh.noted[t] = true
		}
	}
}

// Poll, with replicas, serves what cannot wait for the next tick: the
// pools with a new subscriber here, and those another replica noted since
// (a report handed over to a pool this replica owns, a grant written for
// its subscribers). Run calls it every sharePoll: a new bucket's first
// grant takes a few polls and round trips, not a few ticks.
func (q *Service) Poll() { q.poll(context.Background()) }

func (q *Service) poll(ctx context.Context) {
	if q.share == nil {
		return
	}
	q.tickMu.Lock()
	defer q.tickMu.Unlock()
	sh := q.share
	q.mu.Lock()
	beaten := !sh.beaten.IsZero() && q.cfg.Now().Sub(sh.beaten) < shareAlive/2
	q.mu.Unlock()
	if !beaten {
		// Not before this replica's beat is in the store (at its first
		// tick, or after one failed): another replica would take a pool
		// it took here, or the subscribers it handed over, for a dead
		// replica's.
		return
	}
	pctx, cancel := context.WithTimeout(ctx, shareCallBudget)
	rep, err := q.cfg.Share.BeatQuota(pctx, quota.Beat{Scope: q.cfg.Scope, Replica: sh.replica, NotesOnly: true, Max: max(q.cfg.MaxBuckets, shareMaxReplicas)})
	cancel()
	q.mu.Lock()
	if err != nil {
		// Left to the tick, which tells whether the store is gone.
		sh.noted = nil
		q.mu.Unlock()
		return
	}
	tags := rep.Tags
	for tag, at := range sh.wakes {
		if !q.cfg.Now().Before(at) {
			delete(sh.wakes, tag)
			tags = append(tags, tag)
		}
	}
	q.takeNotes(tags)
	keys := slices.Collect(maps.Keys(sh.urgent))
	clear(sh.urgent)
	for t := range sh.noted {
		keys = append(keys, sh.tags[t])
	}
	q.mu.Unlock()
	slices.SortFunc(keys, comparePoolKeys)
	keys = slices.Compact(keys)
	if len(keys) > sh.chunk {
		// One chunk a poll, so that a flood of new buckets takes a
		// bounded part of the store's time: the rest wait for the
		// next poll, or the tick.
		q.mu.Lock()
		for _, k := range keys[sh.chunk:] {
			if qp := q.pools[k]; qp != nil && qp.sh != nil && !sh.noted[qp.sh.tag] {
				sh.urgent[k] = true
			}
		}
		q.mu.Unlock()
		keys = keys[:sh.chunk]
	}
	if len(keys) > 0 {
		q.syncChunk(ctx, keys, true)
	}
}

// forgetShared forgets a shared pool. q.mu is held.
func (q *Service) forgetShared(k poolKey, qp *quotaPool) {
	delete(q.pools, k)
	delete(q.share.tags, qp.sh.tag)
	delete(q.share.noted, qp.sh.tag)
	delete(q.share.urgent, k)
}

// syncChunk exchanges the pools of keys with the store: hands over their
// reports, runs those this replica owns and writes them, then sends the
// grants. It returns whether the store answered. In a poll (fast) only
// what cannot wait is done: new subscribers, and the pools noted.
func (q *Service) syncChunk(ctx context.Context, keys []poolKey, fast bool) bool {
	now := q.cfg.Now()
	work, reqs, local := q.syncRequests(now, keys, fast)
	var replies []quota.SyncReply
	var startErr error
	if len(reqs) > 0 {
		syncCtx, cancel := context.WithTimeout(ctx, shareCallBudget)
		replies = q.cfg.Share.SyncQuota(syncCtx, reqs)
		startErr = q.readStarted(syncCtx, now, reqs, replies)
		cancel()
	}
	commits, notes, ok := q.runReplies(work, replies, startErr)
	q.mu.Lock()
	q.share.exchanges.Add(uint64(len(reqs)))
	if len(reqs) > 0 {
		q.noteShareReached(ok > 0, replies[0].Err)
	}
	q.mu.Unlock()
	commits, notes = q.runLocal(local, commits, notes)
	work = append(work, local...)
	if len(commits) == 0 && len(notes) == 0 {
		return len(reqs) == 0 || ok > 0
	}
	commitCtx, cancel := context.WithTimeout(ctx, shareCallBudget)
	defer cancel()
	q.share.notes.Add(uint64(len(notes)))
	errs := q.cfg.Share.CommitQuota(commitCtx, commits, notes)
	for _, w := range work {
		if w.commit < 0 {
			continue
		}
		q.mu.Lock()
		if q.pools[w.k] == w.qp {
			q.committed(q.cfg.Now(), w, commits[w.commit], errs[w.commit])
		}
		q.mu.Unlock()
	}
	return true
}

// syncRequests returns what to hand over and to ask for, pool by pool,
// and the pools this replica owns that run without an exchange. The lock
// is taken pool by pool, so that a report waits for one pool at most, and
// the store is called without it.
func (q *Service) syncRequests(now time.Time, keys []poolKey, fast bool) (work []*syncing, reqs []quota.SyncRequest, local []*syncing) {
	for _, k := range keys {
		q.mu.Lock()
		switch w, req, ok := q.syncRequest(now, k, fast); {
		case !ok:
		case w.local:
			local = append(local, w)
		default:
			work = append(work, w)
			reqs = append(reqs, req)
		}
		q.mu.Unlock()
	}
	return work, reqs, local
}

// readStarted reads when the shared pools started, once a pool the store
// holds no state of starts now, or learns while the shared pools are new
// (the store lost its data). It returns the error of that read: the new
// pools then learn.
func (q *Service) readStarted(ctx context.Context, now time.Time, reqs []quota.SyncRequest, replies []quota.SyncReply) error {
	for i, rep := range replies {
		if rep.Err != nil || !rep.Owner || rep.State != nil || (!rep.Fresh && !reqs[i].State) {
			continue
		}
		t, err := q.cfg.Share.QuotaStarted(ctx, q.cfg.Scope, now)
		if err != nil {
			q.cfg.Log.Warn("quota: reading when the shared pools started; new pools learn", "err", err)
			return err
		}
		q.mu.Lock()
		q.share.started = t
		q.mu.Unlock()
		return nil
	}
	return nil
}

// runReplies applies the store's replies pool by pool, the owner running
// its pools; it returns what the owned pools write back, the notes to
// leave, and how many replies came.
func (q *Service) runReplies(work []*syncing, replies []quota.SyncReply, startErr error) (commits []quota.CommitRequest, notes []quota.Note, ok int) {
	for i, w := range work {
		rep := replies[i]
		if rep.Err == nil {
			ok++
		}
		w.fresh = startErr != nil
		q.mu.Lock()
		now := q.cfg.Now()
		// A pool dropped meanwhile (the rules changed) is left alone.
		if q.pools[w.k] == w.qp && q.syncReply(now, w, rep) {
			commits, notes = q.runOwned(now, w, rep, commits, notes)
		} else if rep.Err == nil && !rep.Owner && len(w.pushed) > 0 && rep.Holder != "" {
			// Reports handed over: their owner reads them at its next
			// tick.
			notes = append(notes, quota.Note{Scope: q.cfg.Scope, Replica: rep.Holder, Tag: w.qp.sh.tag})
		}
		q.mu.Unlock()
	}
	return commits, notes, ok
}

// runLocal runs the pools this replica owns that had nothing to exchange,
// and returns what they write, appended to commits and notes.
func (q *Service) runLocal(local []*syncing, commits []quota.CommitRequest, notes []quota.Note) ([]quota.CommitRequest, []quota.Note) {
	for _, w := range local {
		q.mu.Lock()
		rep := quota.SyncReply{Owner: true, Epoch: w.qp.sh.epoch, Reports: w.reports}
		if q.pools[w.k] == w.qp && w.qp.sh.owned && w.qp.p != nil {
			q.handedOver(w, rep)
			commits, notes = q.runOwned(q.cfg.Now(), w, rep, commits, notes)
		} else {
			// The pool changed hands, or went, since: its reports are
			// lost, as when an exchange fails.
			q.handedOver(w, quota.SyncReply{Err: errLocalLost})
		}
		q.mu.Unlock()
	}
	return commits, notes
}

// noteShareReached records whether the store answered; past
// shareDownAfter without an answer, it ends every stream, so that Envoys
// open theirs to a replica that reaches it. q.mu is held.
func (q *Service) noteShareReached(ok bool, err error) {
	sh, now := q.share, q.cfg.Now()
	switch {
	case ok:
		sh.lastOK, sh.down = now, false
	case now.Sub(sh.lastOK) >= shareDownAfter && !sh.down:
		sh.down, sh.downErr = true, errShareDown
		what := "unreachable"
		if errors.Is(err, quota.ErrStoreFull) {
			// Full (out of memory with noeviction): it answers, but
			// refuses the writes a grant needs.
			sh.downErr, what = errShareFull, "full"
		}
		q.cfg.Log.Warn("quota: the shared store is "+what+"; ending the quota streams so that Envoys open theirs to a replica that can write to it",
			"err", err, "streams", len(q.streams))
		for _, st := range q.streams {
			st.end(sh.downErr)
		}
	}
}

// syncRequest returns what to hand over and ask for of pool k at this
// tick, if anything; it forgets a pool that has nothing here any more.
// q.mu is held.
func (q *Service) syncRequest(now time.Time, k poolKey, fast bool) (*syncing, quota.SyncRequest, bool) {
	qp, sh := q.pools[k], q.share
	if qp == nil || qp.sh == nil {
		return nil, quota.SyncRequest{}, false
	}
	if len(qp.sh.local) == 0 && (!qp.sh.owned || qp.p.Empty()) {
		// Nothing of it here any more: its lease lapses.
		q.forgetShared(k, qp)
		return nil, quota.SyncRequest{}, false
	}
	w := &syncing{k: k, qp: qp, commit: -1}
	req := quota.SyncRequest{Pool: qp.sh.name, Replica: sh.replica, Now: now, Lease: shareLease, Keep: sh.keep, State: qp.sh.reload}
	due := qp.sh.reload || qp.sh.holder == "" || sh.noted == nil || sh.noted[qp.sh.tag] || (!fast && now.Sub(qp.sh.synced) >= shareSweep)
	if h := qp.sh.holder; !qp.sh.owned && h != "" && h != sh.replica && sh.alive != nil && !sh.alive[h] {
		// Its owner stopped beating: its lease is free.
		req.Dead, due = h, true
	}
	hold := max(q.cfg.Pool.ReportInterval, quota.DefaultReportInterval) - time.Second
	for _, id := range slices.Sorted(maps.Keys(qp.sh.local)) {
		ls := qp.sh.local[id]
		if !ls.pending.Empty() && (due || ls.handed.IsZero() || (!fast && (ls.pending.Left || now.Sub(ls.handed) >= hold))) {
			ls.handed = now
			ls.sent, ls.pending = ls.pending, quota.Handover{}
			req.Push = append(req.Push, quota.Push{
				Sub:    subField(id),
				Merged: ls.held.Merge(ls.sent).Append(nil),
				Alone:  ls.sent.Append(nil),
			})
			w.pushed = append(w.pushed, ls)
		}
		if !qp.sh.owned && !ls.left {
			req.Want = append(req.Want, subField(id))
			w.want = append(w.want, ls)
		}
	}
	switch {
	case fast && !due && len(req.Push) == 0:
		return nil, quota.SyncRequest{}, false
	case qp.sh.owned && !due:
		// Its own reports need no store: the pool takes them as they
		// are.
		w.local = true
		for _, p := range req.Push {
			w.reports = append(w.reports, quota.Field{Sub: p.Sub, Value: p.Alone})
		}
	case due || len(req.Push) > 0:
		delete(sh.noted, qp.sh.tag)
	default:
		return nil, quota.SyncRequest{}, false
	}
	return w, req, true
}

var errLocalLost = errors.New("quota: the pool changed hands before its reports were taken")

var errShareDown = status.Error(codes.Unavailable, "service: this replica cannot reach the store it shares quotas through (Redis); open the stream to another replica")

var errShareFull = status.Error(codes.Unavailable, "service: the store this replica shares quotas through (Redis) is full and refuses writes; open the stream to another replica")

// syncReply takes in the store's answer for one pool: the reports handed
// over, and the grants of a pool another replica owns. It reports whether
// this replica owns the pool, which then runs.
func (q *Service) syncReply(now time.Time, w *syncing, rep quota.SyncReply) bool {
	sh := w.qp.sh
	q.handedOver(w, rep)
	if rep.Err != nil {
		q.share.errors.Inc()
		return false
	}
	sh.synced, sh.holder = now, rep.Holder
	if rep.Owner {
		sh.holder = q.share.replica
		return true
	}
	if sh.owned {
		q.disown(w.qp)
	}
	for i, ls := range w.want {
		q.sendGrant(now, ls, rep.Grants[i])
	}
	return false
}

// handedOver records what became of the reports handed over, and forgets
// the subscribers that left once that is done.
func (q *Service) handedOver(w *syncing, rep quota.SyncReply) {
	sh := w.qp.sh
	for i, ls := range w.pushed {
		switch {
		case rep.Err != nil:
			// Handed over or not: it is forgotten rather than counted
			// twice. A lost report costs the demand it measured.
			ls.held = quota.Handover{}
		case rep.Owner:
			ls.held = quota.Handover{} // taken
		case rep.Merged[i]:
			ls.held = ls.held.Merge(ls.sent)
		default:
			ls.held = ls.sent
		}
		ls.sent = quota.Handover{}
	}
	for id, ls := range sh.local {
		if ls.left && ls.pending.Empty() && ls.sent.Empty() {
			delete(sh.local, id)
			q.subs--
		}
	}
}

// disown forgets a pool this replica owned: its lease is another's.
func (q *Service) disown(qp *quotaPool) {
	sh := qp.sh
	sh.owned, sh.reload, sh.holder = false, false, ""
	sh.grants, sh.stored, sh.state = nil, nil, nil
	qp.p = nil
}

// runOwned runs a pool this replica holds the lease of on the reports
// taken, and appends what to write to commits, and the notes for the
// replicas whose subscribers' grants it wrote to notes.
func (q *Service) runOwned(now time.Time, w *syncing, rep quota.SyncReply, commits []quota.CommitRequest, notes []quota.Note) ([]quota.CommitRequest, []quota.Note) {
	qp, sh := w.qp, w.qp.sh
	limit := limitOf(qp.rule)
	if !sh.owned || rep.Fresh || sh.reload || qp.p == nil {
		q.takeOwnership(now, w, rep, limit)
	}
	sh.epoch = rep.Epoch
	p := qp.p
	var changes []quota.Change
	if p.Limit() != limit {
		changes = append(changes, p.SetLimit(now, limit)...)
	}
	beyond := p.Beyond()
	for _, f := range rep.Reports {
		id, err := strconv.ParseUint(f.Sub, 10, 64)
		h, herr := quota.ReadHandover(f.Value)
		if err != nil || herr != nil || id >= 1<<63 {
			q.share.badRecords.Inc()
			continue
		}
		if h.Reports > 0 {
			changes = append(changes, p.Report(now, id, h.Usage())...)
		}
		if h.Left {
			changes = append(changes, p.Leave(now, id)...)
		}
	}
	if alive := q.share.aliveIDs; alive != nil {
		// The subscribers of a replica that died: their streams died
		// with it, and no grant reaches them any more.
		changes = append(changes, p.LeaveIf(now, func(id uint64) bool {
			return id < 1<<63 && id>>32<<32 != q.idBase && !alive[id>>32]
		})...)
	}
	changes = append(changes, p.Tick(now)...)
	if at := p.Wake(); at.After(now) {
		q.share.wakes[sh.tag] = at
	}
	q.totals(qp.rule).beyond.Add(p.Beyond() - beyond)
	if w.local && len(w.reports) == 0 && len(changes) == 0 {
		// Nothing to write: what the tick changed (leases that ended)
		// goes with the next write, and a new owner restoring the state
		// before it counts a lease that ended, which it ends at once.
		return commits, notes
	}
	for _, c := range changes {
		if c.Sub >= 1<<63 {
			continue
		}
		sh.seq++
		rec := quota.Issued{
			At: now, Expires: now.Add(q.cfg.Pool.TTL + q.cfg.Pool.Settle - quota.DefaultSettle),
			Epoch: sh.epoch, Seq: sh.seq, Grant: c.Grant,
		}
		sh.grants[c.Sub] = rec.Append(nil)
	}
	for id := range sh.grants {
		if !p.Has(id) {
			delete(sh.grants, id)
		}
	}
	c, ok := q.commitOf(now, sh, p)
	if !ok {
		return commits, notes
	}
	w.commit = len(commits)
	return append(commits, c), q.notesOf(c, sh, notes)
}

// notesOf appends, to notes, one for each other replica with a
// subscriber whose grant c writes.
func (q *Service) notesOf(c quota.CommitRequest, sh *sharedPool, notes []quota.Note) []quota.Note {
	var done []uint64
	for _, g := range c.Grants {
		id, err := strconv.ParseUint(g.Sub, 10, 64)
		r := id >> 32
		if err != nil || id>>32<<32 == q.idBase || slices.Contains(done, r) {
			continue
		}
		done = append(done, r)
		notes = append(notes, quota.Note{Scope: q.cfg.Scope, Replica: strconv.FormatUint(r, 10), Tag: sh.tag})
	}
	return notes
}

// takeOwnership starts running a pool whose lease this replica has just
// taken (or whose state it must read again): from the state the store
// holds, or new, learning from when the shared pools started.
func (q *Service) takeOwnership(now time.Time, w *syncing, rep quota.SyncReply, limit quota.Limit) {
	qp, sh := w.qp, w.qp.sh
	cfg := q.cfg.Pool
	cfg.Start = q.share.started
	if w.fresh {
		// When the shared pools started is not known: as if now.
		cfg.Start = now
	}
	qp.p = quota.NewPool(limit, cfg)
	if rep.State != nil {
		p, err := quota.RestorePool(limit, cfg, rep.State)
		if err != nil {
			// Not a state this service wrote: start again, learning.
			q.share.badRecords.Inc()
			q.cfg.Log.Warn("quota: a pool's state in the store is unreadable; the pool learns again", "err", err)
			cfg.Start = now
			p = quota.NewPool(limit, cfg)
		}
		qp.p = p
	}
	if rep.Fresh && rep.Epoch > 1 {
		// Another replica held it before.
		q.share.takeovers.Inc()
	}
	sh.owned, sh.reload, sh.seq, sh.state = true, false, 0, rep.State
	sh.grants = map[uint64][]byte{}
	sh.stored = map[uint64][]byte{}
	for _, f := range rep.Stored {
		if id, err := strconv.ParseUint(f.Sub, 10, 64); err == nil {
			sh.grants[id], sh.stored[id] = f.Value, f.Value
		}
	}
	// The state counts the grants held as sent, a lost reply's too: so are they.
	q.sendLocal(now, sh)
}

// commitOf returns what an owner writes of pool p: its state, the grants
// that changed and those to drop; false when nothing changed.
func (q *Service) commitOf(now time.Time, sh *sharedPool, p *quota.Pool) (quota.CommitRequest, bool) {
	c := quota.CommitRequest{
		Pool: sh.name, Replica: q.share.replica, Epoch: sh.epoch,
		Now: now, Lease: shareLease, Keep: q.share.keep, State: p.AppendState(nil),
	}
	for _, id := range slices.Sorted(maps.Keys(sh.grants)) {
		if g := sh.grants[id]; !bytes.Equal(g, sh.stored[id]) {
			c.Grants = append(c.Grants, quota.Field{Sub: subField(id), Value: g})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(sh.stored)) {
		if _, ok := sh.grants[id]; !ok {
			c.Drop = append(c.Drop, subField(id))
		}
	}
	if len(c.Grants) == 0 && len(c.Drop) == 0 && bytes.Equal(c.State, sh.state) {
		return c, false
	}
	return c, true
}

// committed takes in the outcome of an owner's write: the grants written
// are sent to this replica's streams; a pool whose lease changed hands is
// forgotten; a pool whose write failed is read again from the store at
// the next tick, since what it holds is not known.
func (q *Service) committed(now time.Time, w *syncing, c quota.CommitRequest, err error) {
	qp, sh := w.qp, w.qp.sh
	switch {
	case errors.Is(err, quota.ErrNotOwner):
		q.disown(qp)
		return
	case err != nil:
		q.share.errors.Inc()
		sh.reload = true
		return
	}
	for _, g := range c.Grants {
		if id, err := strconv.ParseUint(g.Sub, 10, 64); err == nil {
			sh.stored[id] = g.Value
		}
	}
	for _, d := range c.Drop {
		if id, err := strconv.ParseUint(d, 10, 64); err == nil {
			delete(sh.stored, id)
		}
	}
	sh.state, sh.synced = c.State, now
	q.sendLocal(now, sh)
}

// sendLocal sends its streams' grants of an owned pool, those not sent.
func (q *Service) sendLocal(now time.Time, sh *sharedPool) {
	for _, id := range slices.Sorted(maps.Keys(sh.local)) {
		if ls := sh.local[id]; !ls.left {
			q.sendGrant(now, ls, sh.grants[id])
		}
	}
}

// sendGrant sends a grant record to its subscriber's stream, unless it
// was sent already. The assignment's TTL is what is left of the grant's
// lease, so that a grant sent late is not in force longer than its owner
// counts it; one with less than a second left is not sent (the Envoy
// keeps the grant it has, which its owner counts too).
func (q *Service) sendGrant(now time.Time, ls *localSub, rec []byte) {
	if rec == nil || bytes.Equal(rec, ls.delivered) {
		return
	}
	ls.delivered = rec
	g, err := quota.ReadIssued(rec)
	if err != nil {
		q.share.badRecords.Inc()
		return
	}
	if now.Sub(g.At) > q.cfg.Pool.Settle-quota.DefaultSettle {
		q.share.late.Inc()
	}
	ttl := q.cfg.Pool.TTL
	if !g.Grant.Abandon {
		ttl = min(ttl, g.Expires.Sub(now).Truncate(time.Second))
		if ttl < time.Second {
			return
		}
	}
	ls.grant = g.Grant
	if ls.sb.pool == nil {
		return // its bucket left the pool (the rules changed)
	}
	q.queue(ls.st, ls.sb.key, assignment(ls.sb.id, g.Grant, durationpb.New(ttl)))
	if g.Grant.Abandon && ls.st.buckets[ls.sb.key] == ls.sb {
		// Envoy drops the bucket: the stream holds it no more.
		delete(ls.st.buckets, ls.sb.key)
	}
}

// subscribers are this replica's subscribers of a pool another owns, for
// the live view: their grants, and no demand.
func (sh *sharedPool) subscribers() []quota.Subscriber {
	out := make([]quota.Subscriber, 0, len(sh.local))
	for _, id := range slices.Sorted(maps.Keys(sh.local)) {
		g := sh.local[id].grant
		out = append(out, quota.Subscriber{ID: id, Rate: g.Rate(), Burst: g.MaxTokens, Committed: g.Rate(), Gone: sh.local[id].left})
	}
	return out
}

func comparePoolKeys(a, b poolKey) int {
	return cmp.Or(cmp.Compare(a.domain, b.domain), cmp.Compare(a.bucket, b.bucket))
}
