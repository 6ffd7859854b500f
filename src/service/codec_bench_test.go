package service_test

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimit/src/wire"
)

// codecMessages returns a request with n descriptors as Envoy sends them
// (remote_address, path, user), encoded, and a response as the service
// gives it.
func codecMessages(n int) ([]byte, *rlsv3.RateLimitResponse) {
	keys := []string{"remote_address", "path", "user"}
	vals := []string{"203.0.113.42", "/api/v1/orders/12345", "user-7f3a9c"}
	req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for i := range n {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: keys[i%3], Value: vals[i%3]}},
		})
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "limit_" + strconv.Itoa(i), RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining:     987,
			DurationUntilReset: durationpb.New(42 * time.Second),
		})
	}
	data, err := proto.Marshal(req)
	if err != nil {
		panic(err)
	}
	return data, resp
}

// BenchmarkCodec measures the server's codec against grpc-go's proto codec
// alone: decoding a request and encoding its response ("call"), as the
// server does once a call, and encoding alone ("encode"). Issue 15's
// vtprotobuf trial runs it in two builds taken in turn, the plain one and
// one with tools/libtrial/vtcodec (docs/BENCHMARKS.md, "Library trials").
func BenchmarkCodec(b *testing.B) {
	codecs := []struct {
		name  string
		codec encoding.CodecV2
	}{
		{"grpc-proto", encoding.GetCodecV2("proto")},
		{"service", wire.Codec()},
	}
	for _, n := range []int{1, 3} {
		data, resp := codecMessages(n)
		for _, c := range codecs {
			b.Run("call/"+strconv.Itoa(n)+"desc/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					var req rlsv3.RateLimitRequest
					if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &req); err != nil {
						b.Fatal(err)
					}
					out, err := c.codec.Marshal(resp)
					if err != nil {
						b.Fatal(err)
					}
					out.Free()
				}
			})
			b.Run("encode/"+strconv.Itoa(n)+"desc/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					out, err := c.codec.Marshal(resp)
					if err != nil {
						b.Fatal(err)
					}
					out.Free()
				}
			})
		}
	}
}

// TestCodecEncodesAsGRPC checks that the server's codec encodes a response
// byte for byte as grpc-go's proto codec does, whatever encoder a build
// gives it.
func TestCodecEncodesAsGRPC(t *testing.T) {
	for _, n := range []int{0, 1, 3} {
		_, resp := codecMessages(n)
		want, err := encoding.GetCodecV2("proto").Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire.Codec().Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want.Materialize()) {
			t.Errorf("%d statuses: the codec encodes the response differently from grpc-go's", n)
		}
	}
}
