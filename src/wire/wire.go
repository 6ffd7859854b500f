// Package wire holds what the two gRPC fronts, the rate-limit service
// (src/service) and the quota service (src/rlqs), share on the wire: the
// codec that marks a message that does not decode instead of failing the
// call, and the bounds on the strings a request may carry. It imports
// nothing of ours, and neither front imports the other.
package wire

import (
	"bytes"
	"crypto/rand"
	"slices"

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
// false turns into an admitted request. Other messages decode as usual.
func Codec() encoding.CodecV2 {
	return codec{encoding.GetCodecV2("proto")}
}

type codec struct{ encoding.CodecV2 }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	switch m := v.(type) {
	case *rlsv3.RateLimitRequest:
		proto.Reset(m)
		markMalformed(m, err)
		return nil
	case *rlqsv3.RateLimitQuotaUsageReports:
		proto.Reset(m)
		markMalformed(m, err)
		return nil
	}
	return err
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

// markMalformed records err in r's unknown fields, behind the nonce.
func markMalformed(r proto.Message, err error) {
	var b []byte
	b = protowire.AppendTag(b, malformedField, protowire.BytesType)
	b = protowire.AppendBytes(b, append(slices.Clip(malformedNonce), err.Error()...))
	r.ProtoReflect().SetUnknown(b)
}

// Malformed returns the decoding error Codec recorded in r, if any.
func Malformed(r proto.Message) (string, bool) {
	u := r.ProtoReflect().GetUnknown()
	if len(u) == 0 {
		return "", false
	}
	num, typ, n := protowire.ConsumeTag(u)
	if n < 0 || num != malformedField || typ != protowire.BytesType {
		return "", false
	}
	v, m := protowire.ConsumeBytes(u[n:])
	if m < 0 || !bytes.HasPrefix(v, malformedNonce) {
		return "", false
	}
	return string(v[len(malformedNonce):]), true
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
