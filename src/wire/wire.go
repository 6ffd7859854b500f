// Package wire holds what the two gRPC fronts, the rate-limit service
// (src/service) and the quota service (src/rlqs), share on the wire: the
// codec that marks a message that does not decode instead of failing the
// call, and the bounds on the strings a request may carry. It imports
// nothing of ours, and neither front imports the other.
package wire

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"slices"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Codec returns the gRPC codec the server must use (grpc.ForceServerCodecV2):
// grpc-go's proto codec, except that a RateLimitRequest or a quota report
// that does not decode (a string field holding invalid UTF-8, a truncated
// field) reaches its handler marked as malformed (Malformed), and is answered
// InvalidArgument with the reason, where grpc-go answers Internal from
// inside its own receive path — which Envoy's default failure_mode_deny:
// false turns into an admitted request. A RateLimitRequest as Envoy sends
// it decodes, and a usual RateLimitResponse encodes, in code of our own
// (rls.go); other messages as usual.
func Codec() encoding.CodecV2 {
	return codec{encoding.GetCodecV2("proto")}
}

type codec struct{ encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*rlsv3.RateLimitResponse); ok {
		if b := encodeResponse(m); b != nil {
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	return c.CodecV2.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*rlsv3.RateLimitRequest); ok && len(data) == 1 && decodeRequest(data[0].ReadOnlyData(), m) {
		return nil
	}
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	switch m := v.(type) {
	case *rlsv3.RateLimitRequest:
		proto.Reset(m)
		mark(m, kindMalformed, err.Error())
		return nil
	case *rlqsv3.RateLimitQuotaUsageReports:
		proto.Reset(m)
		if n, ok := salvageReport(data.Materialize(), m); ok {
			mark(m, kindDropped, string(protowire.AppendVarint(nil, uint64(n)))+fmt.Sprintf("%d bucket(s) that do not decode: %v", n, err))
		} else {
			mark(m, kindMalformed, err.Error())
		}
		return nil
	}
	return err
}

// salvageReport decodes a quota report that did not decode whole, bucket
// by bucket: a bucket id's values come from request headers, so one
// bucket of invalid UTF-8 (bytes that an end user put in a header) must
// not cost the report's other buckets. It returns how many buckets it
// dropped, and false if the message's own fields do not decode.
func salvageReport(b []byte, m *rlqsv3.RateLimitQuotaUsageReports) (dropped int, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, false
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 1 {
			if !utf8.Valid(v) {
				return 0, false
			}
			m.Domain = string(v)
			continue
		}
		u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}
		if proto.Unmarshal(v, u) != nil {
			dropped++
			continue
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, u)
	}
	return dropped, true
}

// malformedField is the field number of the mark: the largest valid one,
// so that no version of the proto will ever use it.
const malformedField = 536870911

// malformedNonce makes the mark unforgeable: a client may send field
// 536870911 itself, but not with this process's random prefix.
var malformedNonce = func() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}()

// The kinds of mark: the message did not decode, or only some of its
// parts did (Dropped).
const (
	kindMalformed = 'M'
	kindDropped   = 'D'
)

// mark records a kind and a reason in r's unknown fields, behind the nonce.
func mark(r proto.Message, kind byte, reason string) {
	var b []byte
	b = protowire.AppendTag(b, malformedField, protowire.BytesType)
	b = protowire.AppendBytes(b, append(append(slices.Clip(malformedNonce), kind), reason...))
	r.ProtoReflect().SetUnknown(b)
}

// marked returns the reason of a mark of the kind, if r has one.
func marked(r proto.Message, kind byte) (string, bool) {
	u := r.ProtoReflect().GetUnknown()
	if len(u) == 0 {
		return "", false
	}
	num, typ, n := protowire.ConsumeTag(u)
	if n < 0 || num != malformedField || typ != protowire.BytesType {
		return "", false
	}
	v, m := protowire.ConsumeBytes(u[n:])
	if m < 0 || !bytes.HasPrefix(v, malformedNonce) || len(v) == len(malformedNonce) || v[len(malformedNonce)] != kind {
		return "", false
	}
	return string(v[len(malformedNonce)+1:]), true
}

// Malformed returns the decoding error Codec recorded in r, if any.
func Malformed(r proto.Message) (string, bool) { return marked(r, kindMalformed) }

// Dropped says how many buckets of a quota report that did not decode
// whole Codec dropped, and why; 0 when it dropped none. The report holds
// the others.
func Dropped(r *rlqsv3.RateLimitQuotaUsageReports) (n int, reason string) {
	body, ok := marked(r, kindDropped)
	if !ok {
		return 0, ""
	}
	v, k := protowire.ConsumeVarint([]byte(body))
	if k < 0 {
		return 0, ""
	}
	return int(v), body[k:]
}

// Bounds on the strings of a request, shared by descriptor entries and
// quota bucket ids. Envoy sends a few short ones; a request past one is
// refused with InvalidArgument and the reason (docs/SECURITY.md, "Limits
// and hostile input", lists them).
const (
	MaxDomainLen = 256
	MaxKeyLen    = 256
	MaxValueLen  = 4096
)

// PeerHost is the IP address of a client address that per-client shares
// count by, or "" when it has none: a unix socket, an in-process caller,
// or a loopback address, which is a proxy on the same host (a service
// mesh's sidecar connects from 127.0.0.6 for every client it forwards),
// whose clients cannot be told apart.
func PeerHost(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || ip.IsLoopback() {
		return ""
	}
	return host
}
