package wire

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type entry = ratelimitv3.RateLimitDescriptor_Entry

// envoyRequests are requests as Envoy sends them, which decodeRequest must
// decode itself.
func envoyRequests() []*rlsv3.RateLimitRequest {
	return []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*entry{{Key: "remote_address", Value: "203.0.113.42"}}}}},
		{Domain: "edge", HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*entry{{Key: "remote_address", Value: "203.0.113.42"}, {Key: "path", Value: "/login"}}},
			{Entries: []*entry{{Key: "user", Value: "ü"}}, IsNegativeHits: true},
			{},
			{Entries: []*entry{{Key: "", Value: ""}, {}}},
		}},
		{Domain: "edge"},
		{},
	}
}

// otherRequests carry what decodeRequest leaves to protobuf-go.
func otherRequests() []*rlsv3.RateLimitRequest {
	d := func() *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*entry{{Key: "user", Value: "a"}}}
	}
	override, hits := d(), d()
	override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	hits.HitsAddend = wrapperspb.UInt64(3)
	unknown := &rlsv3.RateLimitRequest{Domain: "edge"}
	unknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	return []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{override}},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d(), hits}},
		unknown,
	}
}

// TestDecodeRequest checks that what Envoy sends is decoded by
// decodeRequest, what else a client may send by protobuf-go, and both as
// proto.Unmarshal decodes them.
func TestDecodeRequest(t *testing.T) {
	for i, want := range append(envoyRequests(), otherRequests()...) {
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var fast rlsv3.RateLimitRequest
		if ok := decodeRequest(b, &fast); ok != (i < len(envoyRequests())) {
			t.Errorf("request %d: decodeRequest = %v", i, ok)
		}
		var got rlsv3.RateLimitRequest
		if err := Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil || !proto.Equal(&got, want) {
			t.Errorf("request %d: the codec decodes %v, %v; want %v", i, &got, err, want)
		}
	}
	// A field repeated: the last one counts, as in protobuf-go.
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "first")
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "second")
	var r rlsv3.RateLimitRequest
	if !decodeRequest(b, &r) || r.Domain != "second" {
		t.Errorf("domain twice: %q", r.Domain)
	}
	// Invalid UTF-8 is left to protobuf-go, which refuses it.
	b = protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "a\xffb")
	if decodeRequest(b, &r) {
		t.Error("invalid UTF-8 decoded")
	}
}

// FuzzDecodeRequest checks that whatever decodeRequest decodes,
// proto.Unmarshal decodes to the same message.
func FuzzDecodeRequest(f *testing.F) {
	for _, r := range append(envoyRequests(), otherRequests()...) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x03, 0x0a, 0x01, 0x0a})
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast, want rlsv3.RateLimitRequest
		if !decodeRequest(b, &fast) {
			return
		}
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatalf("decodeRequest decoded what proto.Unmarshal refuses (%v): %v", err, &fast)
		}
		if !proto.Equal(&fast, &want) {
			t.Fatalf("decodeRequest = %v, proto.Unmarshal = %v", &fast, &want)
		}
	})
}

// BenchmarkDecodeRequest compares decodeRequest with proto.Unmarshal on a
// request of three descriptors as Envoy sends it.
func BenchmarkDecodeRequest(b *testing.B) {
	data := threeDescriptors(b)
	b.Run("decodeRequest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m rlsv3.RateLimitRequest
			if !decodeRequest(data, &m) {
				b.Fatal("not decoded")
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m rlsv3.RateLimitRequest
			if err := proto.Unmarshal(data, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDecodeRequestAllocs: a request of three descriptors as Envoy sends
// it decodes in seven allocations, four slices and the three values
// (protobuf-go takes 20), once its domain and keys are interned.
func TestDecodeRequestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race; make allocs runs this test")
	}
	data := threeDescriptors(t)
	var m rlsv3.RateLimitRequest
	decodeRequest(data, &m)
	if allocs := testing.AllocsPerRun(1000, func() { decodeRequest(data, &m) }); allocs > 7 {
		t.Errorf("decoding three descriptors allocates %v times, want at most 7", allocs)
	}
}

// threeDescriptors is a request of Envoy's usual address / path / user
// descriptors, encoded.
func threeDescriptors(tb testing.TB) []byte {
	r := &rlsv3.RateLimitRequest{Domain: "edge"}
	for _, kv := range [][2]string{{"remote_address", "203.0.113.42"}, {"path", "/api/v1/orders/12345"}, {"user", "user-7f3a9c"}} {
		r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*entry{{Key: kv[0], Value: kv[1]}}})
	}
	data, err := proto.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}
