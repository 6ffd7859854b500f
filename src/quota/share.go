package quota

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// What replicas that share pools exchange through a shared store, once a
// tick and per pool (docs/RLQS.md, "Several replicas"). Every replica
// hands over the reports of its own subscribers and reads the grants
// written for them; the one replica that holds the pool's lease (its
// owner) takes every report, runs the Pool, and writes its state and the
// grants together. The store moves these values; it does not read the
// reports, grants or states, which are opaque bytes to it.

// SyncRequest is a replica's exchange of one tick with the store for one
// pool: in one atomic step, it hands over reports, then takes or renews
// the pool's lease if it is free or already the replica's; the owner then
// takes every report handed over, and another replica reads its grants.
type SyncRequest struct {
	// Pool names the pool (its domain and bucket id); the store derives
	// its keys from it.
	Pool string
	// Replica names the replica, the same for its whole life.
	Replica string
	// Now is the replica's clock; a lease is free once Now passes its end.
	Now time.Time
	// Lease is how long a lease taken or renewed lasts; Keep how long the
	// store keeps a pool nobody writes to (longer than any grant lives).
	Lease, Keep time.Duration
	// State asks for the pool's state even when the lease was the
	// replica's already (an owner whose last commit failed).
	State bool
	// Dead names a replica the caller saw stop beating (see Beat): a
	// lease it holds is free, whatever its end.
	Dead string
	// Push are the reports of the replica's subscribers: each is written
	// as Merged when the store holds a report of that subscriber not
	// taken yet (Merged adds it up with the new one), else as Alone.
	Push []Push
	// Want are the grants to read, by subscriber, when the lease is
	// another replica's.
	Want []string
}

// Push is a subscriber's report handed over (see SyncRequest.Push).
type Push struct {
	Sub           string
	Merged, Alone []byte
}

// SyncReply is the store's answer to a SyncRequest.
type SyncReply struct {
	// Err is set when the exchange failed: nothing of it is known to
	// have happened, or not.
	Err error
	// Owner is set when the replica holds the lease (Epoch counts the
	// lease's changes of hands); Fresh when it has just taken it, or the
	// lease's previous holder is not known.
	Owner, Fresh bool
	Epoch        uint64
	// Holder names the replica that holds the lease, for another.
	Holder string
	// Merged tells, for each Push, whether it was written as Merged.
	Merged []bool
	// Reports are the reports taken by the owner, by subscriber (every
	// replica's, Push included): the store holds them no more.
	Reports []Field
	// State is the pool's state, for an owner with Fresh or that asked
	// for it; nil when the store holds none. Stored are the grants the
	// store holds, by subscriber, for the same owner.
	State  []byte
	Stored []Field
	// Grants are, for another replica, the grant of each Want; nil for
	// none.
	Grants [][]byte
}

// Field is a subscriber's value in a pool.
type Field struct {
	Sub   string
	Value []byte
}

// CommitRequest is an owner's write of one pool after a tick: its state
// and the grants that changed, together, and only while the lease it took
// (Epoch) is still its own.
type CommitRequest struct {
	Pool, Replica string
	Epoch         uint64
	// Now and Lease renew the lease, as a SyncRequest's do.
	Now         time.Time
	Lease, Keep time.Duration
	State       []byte
	Grants      []Field
	// Drop are the subscribers whose grants are gone from the pool.
	Drop []string
}

// Note asks a replica to exchange a pool at its next tick: an owner that
// wrote grants for its subscribers leaves it one, and so does a replica
// that handed over reports to the pool's owner. Tag names the pool (see
// Beat); Scope is the replicas' (CACHE_KEY_PREFIX).
type Note struct {
	Scope, Replica, Tag string
}

// Beat is a replica's call at each tick: it says the replica is alive,
// and takes the notes left for it.
type Beat struct {
	Scope, Replica string
	Now            time.Time
	// Alive is how long a replica that stopped beating still counts as
	// alive; Keep how long the store keeps what nobody writes to.
	Alive, Keep time.Duration
	// Max bounds the replicas and the notes read.
	Max int
	// NotesOnly takes the notes without a beat.
	NotesOnly bool
}

// BeatReply is the store's answer to a Beat.
type BeatReply struct {
	// Alive are the replicas that beat within Alive, the caller
	// included.
	Alive []string
	// Tags are the pools noted for the caller since its last beat; the
	// store holds them no more.
	Tags []string
}

// ErrNotOwner is the error of a CommitRequest whose lease has changed
// hands: nothing was written.
var ErrNotOwner = errors.New("quota: the pool's lease is another replica's")

// ErrStoreFull is wrapped by a Share error that means the store answers
// but refuses writes for lack of memory (Redis's noeviction at maxmemory).
var ErrStoreFull = errors.New("quota: the shared store is full")

// Handover is the reports of one subscriber that a replica hands over to
// the pool's owner: those received since its last handover, added up (see
// Merge). The zero Handover holds none.
type Handover struct {
	// Reports counts the reports in it.
	Reports         uint64
	Allowed, Denied uint64
	// Elapsed is the first report's time_elapsed; First and At are when
	// the first and the last were received.
	Elapsed   time.Duration
	First, At time.Time
	// Left: the subscriber's stream closed after them.
	Left bool
}

// Bounds of a Handover read back: counts are capped where they are
// received (2^40 requests a report), and add up to at most maxHandover.
const (
	maxHandover        = 1 << 50
	maxHandoverElapsed = 24 * time.Hour
)

// Empty reports whether h holds neither a report nor a leave.
func (h Handover) Empty() bool { return h.Reports == 0 && !h.Left }

// Add returns h with one more report, received at at.
func (h Handover) Add(at time.Time, allowed, denied uint64, elapsed time.Duration) Handover {
	return h.Merge(Handover{Reports: 1, Allowed: allowed, Denied: denied, Elapsed: elapsed, First: at, At: at})
}

// Merge returns h followed by v.
func (h Handover) Merge(v Handover) Handover {
	if h.Reports == 0 {
		v.Left = v.Left || h.Left
		return v
	}
	if v.Reports > 0 {
		h.Reports += v.Reports
		h.Allowed = min(h.Allowed+v.Allowed, maxHandover)
		h.Denied = min(h.Denied+v.Denied, maxHandover)
		h.At = v.At
	}
	h.Left = h.Left || v.Left
	return h
}

// Usage is what the pool is told of h's reports: their counts, as one
// report received at the last one's time that covers the time since the
// first one's predecessor. A new bucket's first report (time_elapsed 0)
// stays one, whatever followed it.
func (h Handover) Usage() Usage {
	e := h.Elapsed
	if e > 0 {
		e = min(e+h.At.Sub(h.First), maxHandoverElapsed)
	}
	return Usage{Allowed: h.Allowed, Denied: h.Denied, Elapsed: e, At: h.At}
}

// Append appends h's encoding to b.
func (h Handover) Append(b []byte) []byte {
	b = append(b, stateVersion, flagsOf(h.Left))
	b = binary.AppendUvarint(b, h.Reports)
	b = binary.AppendUvarint(b, h.Allowed)
	b = binary.AppendUvarint(b, h.Denied)
	b = binary.AppendUvarint(b, uint64(h.Elapsed))
	b = appendTime(b, h.First)
	return appendTime(b, h.At)
}

// ReadHandover reads what Append wrote; anything else is refused with an
// error wrapping ErrBadState.
func ReadHandover(b []byte) (Handover, error) {
	r := stateReader{b: b}
	var h Handover
	r.version()
	h.Left = r.flags()
	h.Reports = r.uvarint(math.MaxInt64)
	h.Allowed = r.uvarint(maxHandover)
	h.Denied = r.uvarint(maxHandover)
	h.Elapsed = time.Duration(r.uvarint(uint64(maxHandoverElapsed)))
	h.First, h.At = r.time(), r.time()
	return h, r.done()
}

// Issued is a grant the owner of a pool wrote for a subscriber.
type Issued struct {
	// At is when the owner decided it (its clock), Expires when the
	// Envoy must stop using it: the owner counts it until a little later.
	At, Expires time.Time
	// Epoch and Seq tell grants apart: the owner's lease, and a count of
	// the grants it wrote under it.
	Epoch, Seq uint64
	Grant      Grant
}

// Append appends g's encoding to b.
func (g Issued) Append(b []byte) []byte {
	b = append(b, stateVersion, flagsOf(g.Grant.Abandon))
	b = appendTime(b, g.At)
	b = appendTime(b, g.Expires)
	b = binary.AppendUvarint(b, g.Epoch)
	b = binary.AppendUvarint(b, g.Seq)
	b = binary.AppendUvarint(b, uint64(g.Grant.TokensPerFill))
	b = binary.AppendUvarint(b, uint64(g.Grant.FillInterval))
	return binary.AppendUvarint(b, uint64(g.Grant.MaxTokens))
}

// ReadIssued reads what Append wrote; anything else, a token bucket Envoy
// cannot use included, is refused with an error wrapping ErrBadState.
func ReadIssued(b []byte) (Issued, error) {
	r := stateReader{b: b}
	var g Issued
	r.version()
	g.Grant.Abandon = r.flags()
	g.At, g.Expires = r.time(), r.time()
	g.Epoch, g.Seq = r.uvarint(math.MaxUint64), r.uvarint(math.MaxUint64)
	g.Grant.TokensPerFill = uint32(r.uvarint(math.MaxUint32))
	g.Grant.FillInterval = time.Duration(r.uvarint(uint64((maxFillSeconds + 1) * time.Second)))
	g.Grant.MaxTokens = uint32(r.uvarint(math.MaxUint32))
	if g.Grant.TokensPerFill > 0 && (g.Grant.FillInterval < time.Second || g.Grant.MaxTokens == 0) {
		r.fail("a token bucket Envoy cannot use: %+v", g.Grant)
	}
	return g, r.done()
}

func flagsOf(b bool) byte {
	if b {
		return 1
	}
	return 0
}
