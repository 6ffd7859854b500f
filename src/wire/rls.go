package wire

import (
	"hash/maphash"
	"sync/atomic"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// decodeRequest decodes b into m when it holds only what Envoy sends on
// every call (the domain, descriptors of key/value entries, hits_addend,
// is_negative_hits), and reports whether it did. protobuf-go's decoding
// was the largest single cost of a call with three descriptors after
// grpc-go's own (two allocations per entry and per descriptor, slices
// grown, every string copied): this one reads b twice, to count and then
// to fill, allocates the descriptors and entries four slices in all, and
// interns domains and keys. Anything else (an override, a descriptor's own
// hits_addend, an unknown field or wire type, invalid UTF-8, a truncated
// field) leaves m alone for protobuf-go, so that what it accepts decodes as
// proto.Unmarshal decodes it (FuzzDecodeRequest). Measured in
// docs/BENCHMARKS.md, "An RLS codec of our own".
func decodeRequest(b []byte, m *rlsv3.RateLimitRequest) bool {
	nd, ne, ok := walkRequest(b, nil)
	if !ok {
		return false
	}
	m.Reset()
	f := &requestFill{m: m, entries: make([]ratelimitv3.RateLimitDescriptor_Entry, ne), entryPtrs: make([]*ratelimitv3.RateLimitDescriptor_Entry, ne)}
	if nd > 0 {
		f.descs = make([]ratelimitv3.RateLimitDescriptor, nd)
		m.Descriptors = make([]*ratelimitv3.RateLimitDescriptor, nd)
	}
	walkRequest(b, f)
	return true
}

// requestFill is where walkRequest's second reading puts what it reads.
type requestFill struct {
	m         *rlsv3.RateLimitRequest
	descs     []ratelimitv3.RateLimitDescriptor
	entries   []ratelimitv3.RateLimitDescriptor_Entry
	entryPtrs []*ratelimitv3.RateLimitDescriptor_Entry
}

// walkRequest counts a RateLimitRequest's descriptors and entries, checking
// b; given f, it fills f from a b it checked before (no UTF-8 checked again).
func walkRequest(b []byte, f *requestFill) (nd, ne int, ok bool) {
	for len(b) > 0 {
		num, typ, v, x, n := field(b)
		b = b[max(n, 0):]
		switch {
		case n < 0:
			return 0, 0, false
		case num == 1 && typ == protowire.BytesType && (f != nil || utf8.Valid(v)):
			if f != nil {
				f.m.Domain = intern(v)
			}
		case num == 2 && typ == protowire.BytesType:
			k, ok := walkDescriptor(v, f, nd, ne)
			if !ok {
				return 0, 0, false
			}
			nd, ne = nd+1, ne+k
		case num == 3 && typ == protowire.VarintType:
			if f != nil {
				f.m.HitsAddend = uint32(x)
			}
		default:
			return 0, 0, false
		}
	}
	return nd, ne, true
}

// walkDescriptor reads descriptor d, whose entries start at entry e, and
// returns how many entries it holds.
func walkDescriptor(b []byte, f *requestFill, d, e int) (k int, ok bool) {
	for len(b) > 0 {
		num, typ, v, x, n := field(b)
		b = b[max(n, 0):]
		switch {
		case n < 0:
			return 0, false
		case num == 1 && typ == protowire.BytesType:
			if !walkEntry(v, f, e+k) {
				return 0, false
			}
			k++
		case num == 4 && typ == protowire.VarintType:
			if f != nil {
				f.descs[d].IsNegativeHits = x != 0
			}
		default:
			return 0, false
		}
	}
	if f != nil {
		if k > 0 {
			f.descs[d].Entries = f.entryPtrs[e : e+k : e+k]
		}
		f.m.Descriptors[d] = &f.descs[d]
	}
	return k, true
}

// walkEntry reads entry e: a key and a value.
func walkEntry(b []byte, f *requestFill, e int) bool {
	for len(b) > 0 {
		num, typ, v, _, n := field(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) || (f == nil && !utf8.Valid(v)) {
			return false
		}
		b = b[n:]
		if f != nil && num == 1 {
			f.entries[e].Key = intern(v)
		} else if f != nil {
			f.entries[e].Value = string(v)
		}
	}
	if f != nil {
		f.entryPtrs[e] = &f.entries[e]
	}
	return true
}

// field reads the field at the start of b: a length-delimited one's bytes
// in v, a varint's value in x, and its length in n, which is negative if
// it does not decode or is of another wire type.
func field(b []byte) (num protowire.Number, typ protowire.Type, v []byte, x uint64, n int) {
	num, typ, t := protowire.ConsumeTag(b)
	switch {
	case t >= 0 && typ == protowire.BytesType:
		v, n = protowire.ConsumeBytes(b[t:])
	case t >= 0 && typ == protowire.VarintType:
		x, n = protowire.ConsumeVarint(b[t:])
	default:
		n = -1
	}
	if n < 0 {
		return 0, 0, nil, 0, -1
	}
	return num, typ, v, x, t + n
}

// interned holds domains and descriptor keys that requests carried, so
// that a request repeating them (as every request Envoy sends does) takes
// no allocation for them. A string takes the slot its hash picks; a client
// that sends ever new ones costs one allocation more each, and the table
// never grows.
var (
	interned     [256]atomic.Pointer[string]
	internedSeed = maphash.MakeSeed()
)

func intern(b []byte) string {
	if len(b) == 0 || len(b) > 64 {
		return string(b)
	}
	slot := &interned[maphash.Bytes(internedSeed, b)%uint64(len(interned))]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}

// encodeResponse encodes m as proto.Marshal does, when it holds only what
// the service answers on every call (the overall code, and statuses of a
// code, a limit, what remains and when it resets), and small enough that
// grpc-go would not pool its buffer; else it returns nil and protobuf-go
// encodes m. protobuf-go sizes each message by reflection before encoding
// it; a status here is sized by arithmetic (TestCodecEncodesAsGRPC checks
// the bytes).
func encodeResponse(m *rlsv3.RateLimitResponse) []byte {
	if m.ResponseHeadersToAdd != nil || m.RequestHeadersToAdd != nil || m.RawBody != nil || m.DynamicMetadata != nil || m.Quota != nil || m.ProtoReflect().GetUnknown() != nil {
		return nil
	}
	size := varintSize(uint64(m.OverallCode))
	for _, st := range m.Statuses {
		if !plainStatus(st) {
			return nil
		}
		n, _, _ := statusSize(st)
		size += 1 + protowire.SizeBytes(n)
	}
	if !mem.IsBelowBufferPoolingThreshold(size) {
		return nil
	}
	b := make([]byte, 0, size)
	b = appendVarintField(b, 1, uint64(m.OverallCode))
	for _, st := range m.Statuses {
		n, limit, reset := statusSize(st)
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(n))
		b = appendVarintField(b, 1, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(limit))
			b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, 2, uint64(l.Unit))
			if l.Name != "" {
				b = protowire.AppendString(protowire.AppendTag(b, 3, protowire.BytesType), l.Name)
			}
		}
		b = appendVarintField(b, 3, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.BytesType), uint64(reset))
			b = appendVarintField(b, 1, uint64(d.Seconds))
			b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
		}
	}
	return b
}

// plainStatus reports whether st holds only what encodeResponse encodes.
func plainStatus(st *rlsv3.RateLimitResponse_DescriptorStatus) bool {
	if st == nil || st.Quota != nil || st.ProtoReflect().GetUnknown() != nil {
		return false
	}
	if l := st.CurrentLimit; l != nil && (l.UnitMultiplier != nil || l.ProtoReflect().GetUnknown() != nil || !utf8.ValidString(l.Name)) {
		return false
	}
	return st.DurationUntilReset == nil || st.DurationUntilReset.ProtoReflect().GetUnknown() == nil
}

// statusSize returns the encoded size of a plain status, of its limit and
// of its reset.
func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) (n, limit, reset int) {
	n = varintSize(uint64(st.Code)) + varintSize(uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		limit = varintSize(uint64(l.RequestsPerUnit)) + varintSize(uint64(l.Unit))
		if l.Name != "" {
			limit += 1 + protowire.SizeBytes(len(l.Name))
		}
		n += 1 + protowire.SizeBytes(limit)
	}
	if d := st.DurationUntilReset; d != nil {
		reset = varintSize(uint64(d.Seconds)) + varintSize(uint64(int64(d.Nanos)))
		n += 1 + protowire.SizeBytes(reset)
	}
	return n, limit, reset
}

// varintSize is the size of a proto3 varint field of value v (field
// numbers under 16): nothing when v is 0.
func varintSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// appendVarintField appends a proto3 varint field unless v is 0.
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}
