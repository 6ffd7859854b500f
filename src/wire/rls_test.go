package wire

import (
	"bytes"
	"testing"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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
// (protobuf-go takes 20), once its domain and keys are interned; its
// response encodes in one.
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
	resp := &rlsv3.RateLimitResponse{}
	for range 3 {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "per_ip", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining:     42,
			DurationUntilReset: durationpb.New(7e9),
		})
	}
	if allocs := testing.AllocsPerRun(1000, func() { encodeResponse(resp) }); allocs > 1 {
		t.Errorf("encoding three statuses allocates %v times, want 1", allocs)
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

// FuzzEncodeResponse checks that whatever encodeResponse encodes,
// proto.Marshal encodes to the same bytes, and that it leaves what it
// does not know to protobuf-go.
func FuzzEncodeResponse(f *testing.F) {
	f.Add(int32(1), int32(2), uint32(10), int32(3), "per_minute", uint32(9), int64(42), int32(5), uint8(0))
	f.Add(int32(-1), int32(0), uint32(0), int32(0), "", uint32(0), int64(-3), int32(-7), uint8(0xff))
	f.Fuzz(func(t *testing.T, overall, code int32, rpu uint32, unit int32, name string, remaining uint32, secs int64, nanos int32, shape uint8) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(code), LimitRemaining: remaining}
		if shape&1 != 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit), Name: name}
		}
		if shape&2 != 0 {
			st.DurationUntilReset = &durationpb.Duration{Seconds: secs, Nanos: nanos}
		}
		m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(overall), Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st, {}, st}}
		other := shape&4 != 0
		switch {
		case !other:
		case shape&8 != 0 && st.CurrentLimit != nil:
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(2)
		case shape&16 != 0:
			m.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "x-ratelimit-limit", Value: "1"}}
		case shape&32 != 0:
			st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 1}
		default:
			m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
		}
		want, err := proto.Marshal(m)
		got := encodeResponse(m)
		if err != nil && got != nil {
			t.Fatalf("encodeResponse encoded what proto.Marshal refuses (%v): %v", err, m)
		}
		// A name of invalid UTF-8 (refused), or a response grpc-go pools
		// the buffer of.
		other = other || err != nil || !mem.IsBelowBufferPoolingThreshold(len(want))
		if other && got != nil {
			t.Fatalf("encodeResponse encoded %v, which protobuf-go must", m)
		}
		if got == nil && !other {
			t.Fatalf("encodeResponse left %v to protobuf-go", m)
		}
		if got != nil && !bytes.Equal(got, want) {
			t.Fatalf("encodeResponse = %x, proto.Marshal = %x", got, want)
		}
	})
}

// TestInternIsBounded: the intern table (an array of 256 slots) keeps
// what requests repeat, and never a string over 64 bytes.
func TestInternIsBounded(t *testing.T) {
	long := []byte("k" + string(make([]byte, 64)))
	if a, b := intern(long), intern(long); unsafe.StringData(a) == unsafe.StringData(b) {
		t.Error("a string of 65 bytes was interned")
	}
	if a, b := intern([]byte("remote_address")), intern([]byte("remote_address")); unsafe.StringData(a) != unsafe.StringData(b) {
		t.Error("a key repeated was not interned")
	}
}
