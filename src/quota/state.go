package quota

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// A pool's state can be written out and read back, so that replicas that
// share pools can hand one over: the replica that takes a pool over
// resumes from the state its previous owner wrote with its last grants,
// every lease and held decrease included, rather than learning. The state
// is everything the pool knows but its limit (the rules') and its Config
// (but for Start, which is the pool's own learning period).

// stateVersion is the first byte of a state; a state of another version
// is refused.
const stateVersion = 1

// MaxStateSubscribers bounds the subscribers a state read back may hold,
// so that a state from a store cannot make the reader allocate without
// bound. An owner holds the subscribers of every replica in its pool: at
// most the replicas' RLQS_MAX_BUCKETS together.
const MaxStateSubscribers = 1 << 20

// ErrBadState is wrapped by the errors of RestorePool for a state that is
// not one AppendState wrote.
var ErrBadState = errors.New("quota: bad pool state")

// Has reports whether the pool counts a subscriber by the id its reports
// carry: reporting, gone with a share still counted, or abandoned.
func (p *Pool) Has(id uint64) bool { return p.subs[id] != nil }

// AppendState appends the pool's state to b and returns the result; the
// same state gives the same bytes.
func (p *Pool) AppendState(b []byte) []byte {
	b = append(b, stateVersion)
	b = appendTime(b, p.cfg.Start)
	b = binary.AppendUvarint(b, p.beyond)
	b = binary.AppendUvarint(b, uint64(len(p.subs)))
	for _, key := range slices.Sorted(maps.Keys(p.subs)) {
		s := p.subs[key]
		b = binary.AppendUvarint(b, key)
		b = binary.AppendUvarint(b, s.id)
		var flags byte
		for bit, f := range []bool{s.gone, s.abandoned, s.known, s.hasEvidence, s.fresh, s.granted, s.grant.Abandon, s.pending} {
			if f {
				flags |= 1 << bit
			}
		}
		b = append(b, flags)
		b = appendFloat(b, s.demand)
		b = binary.AppendUvarint(b, s.count)
		b = binary.AppendUvarint(b, s.allowed)
		b = appendTime(b, s.since)
		b = appendTime(b, s.reported)
		b = appendTime(b, s.active)
		b = appendFloat(b, s.evidence)
		b = binary.AppendUvarint(b, uint64(s.grant.TokensPerFill))
		b = binary.AppendUvarint(b, uint64(s.grant.FillInterval))
		b = binary.AppendUvarint(b, uint64(s.grant.MaxTokens))
		b = appendFloat(b, s.rate)
		b = binary.AppendUvarint(b, uint64(s.burst))
		b = appendFloat(b, s.holdRate)
		b = binary.AppendUvarint(b, uint64(s.holdBurst))
		b = appendTime(b, s.holdUntil)
		b = appendTime(b, s.leaseUntil)
	}
	return b
}

// RestorePool returns the pool whose state AppendState wrote, with limit l
// and cfg but for cfg.Start, which is the state's. A state that is not one
// AppendState wrote, or one past MaxStateSubscribers, is refused with an
// error wrapping ErrBadState; whatever its bytes, reading it allocates at
// most in proportion to its length.
func RestorePool(l Limit, cfg Config, state []byte) (*Pool, error) {
	r := stateReader{b: state}
	r.version()
	cfg.Start = r.time()
	p := NewPool(l, cfg)
	p.beyond = r.uvarint(math.MaxUint64)
	// A subscriber takes at least minSubBytes: a count above what the
	// bytes can hold is refused before anything is allocated for it.
	n := r.uvarint(uint64(min(MaxStateSubscribers, len(state)/minSubBytes)))
	for i := uint64(0); i < n && r.err == nil; i++ {
		key := r.uvarint(math.MaxUint64)
		s := &sub{id: r.uvarint(math.MaxUint64)}
		flags := r.byte()
		for bit, f := range []*bool{&s.gone, &s.abandoned, &s.known, &s.hasEvidence, &s.fresh, &s.granted, &s.grant.Abandon, &s.pending} {
			*f = flags&(1<<bit) != 0
		}
		s.demand = r.float()
		s.count = r.uvarint(math.MaxInt64)
		s.allowed = r.uvarint(s.count)
		s.since, s.reported, s.active = r.time(), r.time(), r.time()
		s.evidence = r.float()
		s.grant.TokensPerFill = uint32(r.uvarint(math.MaxUint32))
		s.grant.FillInterval = time.Duration(r.uvarint(uint64((maxFillSeconds + 1) * time.Second)))
		s.grant.MaxTokens = uint32(r.uvarint(math.MaxUint32))
		s.rate = r.float()
		s.burst = uint32(r.uvarint(math.MaxUint32))
		s.holdRate = r.float()
		s.holdBurst = uint32(r.uvarint(math.MaxUint32))
		s.holdUntil, s.leaseUntil = r.time(), r.time()
		if r.err == nil && p.subs[key] != nil {
			r.fail("subscriber %d twice", key)
		}
		p.subs[key] = s
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return p, nil
}

// minSubBytes is the fewest bytes a subscriber's state takes: a byte per
// varint and time, 8 per float, and its flags.
const minSubBytes = 15 + 4*8

func appendFloat(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

// appendTime writes a time as nanoseconds since 1970, the zero Time as 0.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(b, 0)
	}
	return binary.AppendVarint(b, t.UnixNano())
}

// stateReader reads a state; its first error stops it, and every later
// read returns zero values.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrBadState, fmt.Sprintf(format, args...))
	}
	r.b = nil
}

func (r *stateReader) version() {
	if v := r.byte(); v != stateVersion && r.err == nil {
		r.fail("version %d, want %d", v, stateVersion)
	}
}

// flags reads a byte of one flag.
func (r *stateReader) flags() bool {
	f := r.byte()
	if f > 1 {
		r.fail("unknown flags %#x", f)
	}
	return f == 1
}

// done fails a read that left bytes.
func (r *stateReader) done() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes too many", len(r.b))
	}
	return r.err
}

func (r *stateReader) byte() byte {
	if len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// uvarint reads a number of at most limit.
func (r *stateReader) uvarint(limit uint64) uint64 {
	v, n := binary.Uvarint(r.b)
	switch {
	case n <= 0:
		r.fail("truncated or overlong number")
		return 0
	case v > limit:
		r.fail("%d is above %d", v, limit)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// float reads a share or a demand: finite, and neither negative nor
// above any rate a grant can carry.
func (r *stateReader) float() float64 {
	if len(r.b) < 8 {
		r.fail("truncated")
		return 0
	}
	f := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
	r.b = r.b[8:]
	if !(f >= 0 && f <= math.MaxUint64) {
		r.fail("rate %v out of range", f)
		return 0
	}
	return f
}

func (r *stateReader) time() time.Time {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong time")
		return time.Time{}
	}
	r.b = r.b[n:]
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v).UTC()
}
