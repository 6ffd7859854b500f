package integration

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/harness"
)

const hostileRules = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func (p *proc) get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The hostile cases of the service, against the built binary on the
// memory store and on Redis: each was a way to beat a limit, break the
// metrics or grow the process (docs/RELIABILITY.md), or a way we differed
// from the anchor where a deployment can see it (an override in a domain
// without rules, a descriptor without entries).
func TestHostileRequestsOverTheWire(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testHostileRequests(t) })
	t.Run("redis", func(t *testing.T) {
		testHostileRequests(t, redisEnv(harness.StartRedis(t, harness.RedisOptions{}))...)
	})
}

func testHostileRequests(t *testing.T, env ...string) {
	p := start(t, map[string]string{"web.yaml": hostileRules}, append([]string{"STATS_MAX_DYNAMIC_KEYS=20"}, env...)...)
	rls := p.client(t)
	ctx := callCtx(t)

	t.Run("huge_hits_addend", func(t *testing.T) {
		r := request("web", "user", "spent")
		for range 3 {
			if _, err := rls.ShouldRateLimit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		huge := request("web", "user", "spent")
		huge.Descriptors[0].HitsAddend = wrapperspb.UInt64(math.MaxUint64)
		_, err := rls.ShouldRateLimit(ctx, huge)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "hits_addend") {
			t.Errorf("hits_addend 2^64-1: %v, want InvalidArgument naming hits_addend", err)
		}
		resp, err := rls.ShouldRateLimit(ctx, r)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("after the huge hits_addend: %v %v, want OVER_LIMIT (the budget stays spent)", resp.GetOverallCode(), err)
		}
	})

	t.Run("override_of_centuries", func(t *testing.T) {
		r := request("web", "user", "o")
		r.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
			RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32),
		}
		if _, err := rls.ShouldRateLimit(ctx, r); status.Code(err) != codes.InvalidArgument {
			t.Errorf("YEAR × 4294967295: %v, want InvalidArgument", err)
		}
	})

	t.Run("override_in_unconfigured_domain", func(t *testing.T) {
		r := request("elsewhere", "k", "v")
		r.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		for range 3 {
			resp, err := rls.ShouldRateLimit(ctx, r)
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
				t.Fatalf("%v %v, want OK without a limit, as the anchor", resp, err)
			}
		}
	})

	t.Run("empty_descriptor", func(t *testing.T) {
		r := request("web", "user", "e")
		r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{})
		resp, err := rls.ShouldRateLimit(ctx, r)
		if err != nil || len(resp.GetStatuses()) != 2 || resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("%v %v, want the empty descriptor answered OK", resp, err)
		}
	})

	t.Run("invalid_utf8", func(t *testing.T) {
		cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		var entry, d, msg []byte
		entry = protowire.AppendTag(entry, 1, protowire.BytesType)
		entry = protowire.AppendString(entry, "user")
		entry = protowire.AppendTag(entry, 2, protowire.BytesType)
		entry = protowire.AppendString(entry, "a\xffb")
		d = protowire.AppendTag(d, 1, protowire.BytesType)
		d = protowire.AppendBytes(d, entry)
		msg = protowire.AppendTag(msg, 1, protowire.BytesType)
		msg = protowire.AppendString(msg, "web")
		msg = protowire.AppendTag(msg, 2, protowire.BytesType)
		msg = protowire.AppendBytes(msg, d)
		var out []byte
		err = cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &msg, &out, grpc.ForceCodec(rawBytes{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("invalid UTF-8 value: %v, want InvalidArgument (Internal is admitted by fail-open Envoy)", err)
		}
	})

	t.Run("metrics_survive_request_values", func(t *testing.T) {
		values := []string{"1.2.3.4", "1.2.3-4", "1.2.3_4", "a\nratelimit.fake: 1"}
		for i := range 60 {
			values = append(values, fmt.Sprintf("10.0.%d.1", i))
		}
		for _, v := range values {
			if _, err := rls.ShouldRateLimit(ctx, request("web", "remote_address", v)); err != nil {
				t.Fatal(err)
			}
			r := request("web", "user", v)
			r.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_HOUR}
			if _, err := rls.ShouldRateLimit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		code, body := p.get(t, "http://"+p.debug+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics = %d:\n%s", code, body)
		}
		for _, want := range []string{
			`ratelimit_service_rate_limit_total_hits{domain="web",key1="remote_address_1.2.3.4"} 1`,
			`ratelimit_service_rate_limit_total_hits{domain="web",key1="remote_address_1.2.3-4"} 1`,
			`ratelimit_service_rate_limit_total_hits{domain="web",key1="_overflow"}`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
		if n := strings.Count(body, "\nratelimit_service_rate_limit_total_hits{"); n > 25 {
			t.Errorf("%d total_hits series after %d invented values, want at most the bound (20) and a few rules", n, len(values))
		}
		_, text := p.get(t, "http://"+p.debug+"/stats")
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			if strings.HasPrefix(line, "ratelimit.fake") {
				t.Errorf("/stats line %q was injected by a request value", line)
			}
		}
	})
}

// rawBytes sends a message's bytes as they are.
type rawBytes struct{}

func (rawBytes) Marshal(v any) ([]byte, error)      { return *v.(*[]byte), nil }
func (rawBytes) Unmarshal(data []byte, v any) error { *v.(*[]byte) = data; return nil }
func (rawBytes) Name() string                       { return "proto" }

// What a limited client can act on, over the wire: the IETF header pair,
// Retry-After, the 429 body and the headers for the upstream.
func TestAnswersOverTheWire(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": hostileRules},
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_RESPONSE_HEADERS_STYLE=IETF", "LIMIT_REQUEST_HEADERS_ENABLED=true",
		"LIMIT_RESPONSE_RETRY_AFTER_ENABLED=true", "LIMIT_RESPONSE_BODY_ENABLED=true")
	rls := p.client(t)
	ctx := callCtx(t)
	headers := func(hs []*corev3.HeaderValue) map[string]string {
		m := map[string]string{}
		for _, h := range hs {
			m[h.GetKey()] = h.GetValue()
		}
		return m
	}
	for i := range 3 {
		resp, err := rls.ShouldRateLimit(ctx, request("web", "user", "ietf"))
		if err != nil {
			t.Fatal(err)
		}
		h := headers(resp.GetResponseHeadersToAdd())
		if h["RateLimit-Policy"] != `"user";q=3;w=3600` || !strings.HasPrefix(h["RateLimit"], fmt.Sprintf(`"user";r=%d;t=`, 2-i)) {
			t.Errorf("hit %d: headers %v", i, h)
		}
		if up := headers(resp.GetRequestHeadersToAdd()); up["RateLimit"] != h["RateLimit"] {
			t.Errorf("hit %d: upstream headers %v, want the client's", i, up)
		}
	}
	resp, err := rls.ShouldRateLimit(ctx, request("web", "user", "ietf"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th hit: %v %v, want OVER_LIMIT", resp, err)
	}
	h := headers(resp.GetResponseHeadersToAdd())
	if h["Retry-After"] == "" || h["Retry-After"] == "0" || h["Content-Type"] != "application/json" {
		t.Errorf("over limit: headers %v, want Retry-After and a JSON Content-Type", h)
	}
	if body := string(resp.GetRawBody()); !strings.Contains(body, `"rule":"user"`) || !strings.Contains(body, `"retry_after_seconds":`+h["Retry-After"]) {
		t.Errorf("over limit: body %s", body)
	}
}
