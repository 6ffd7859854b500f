package service_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// FuzzRequest feeds arbitrary bytes through the server's codec to the
// service, as a hostile gRPC client would: it never panics, and answers
// either a decision or InvalidArgument (never Internal, which fail-open
// Envoy would admit); Explain refuses the same requests.
func FuzzRequest(f *testing.F) {
	for _, r := range []*rlsv3.RateLimitRequest{
		req(desc("user", "a")),
		req(desc("path", "/a", "method", "GET")),
		req(withHits(desc("ip", "1"), 1<<40)),
		req(withOverride(desc("user", "o"), 5, 6, 2)),
		{Domain: "test"},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(rawRequest("user", "a\xffb"))
	f.Add([]byte{0xff, 0x01})
	fx := newFixture(f, service.Config{})
	codec := wire.Codec()
	f.Fuzz(func(t *testing.T, b []byte) {
		var r rlsv3.RateLimitRequest
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &r); err != nil {
			t.Fatalf("codec refused a RateLimitRequest: %v", err)
		}
		_, err := fx.svc.ShouldRateLimit(t.Context(), &r)
		if c := status.Code(err); c != codes.OK && c != codes.InvalidArgument {
			t.Fatalf("ShouldRateLimit = %v, want a decision or InvalidArgument", err)
		}
		// Explain refuses exactly what a decision refuses.
		if x, xerr := fx.svc.Explain(t.Context(), &r); (xerr == nil) != (err == nil) || (xerr == nil && len(x.Descriptors) != len(r.GetDescriptors())) {
			t.Fatalf("Explain = %v, %v; ShouldRateLimit = %v", x, xerr, err)
		}
	})
}

// FuzzJSON posts arbitrary bodies to /json: it never panics and answers a
// decision (200, 429) or 400.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{
		`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`,
		`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}],"hitsAddend":"99999999999"}]}`,
		`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}],"limit":{"requestsPerUnit":1,"unit":"YEAR","unitMultiplier":9}}]}`,
		`{"domain":"test","descriptors":[{}]}`,
		`{"domain":`,
		"{\"domain\":\"\xff\"}",
	} {
		f.Add(s)
	}
	fx := newFixture(f, service.Config{})
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		fx.svc.ServeJSON(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("/json %q = %d %s", body, rec.Code, rec.Body)
		}
	})
}
