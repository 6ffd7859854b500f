package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/wire"
	"github.com/ratelimitd/ratelimit/src/wire/wiretest"
)

func withHits(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

func withOverride(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult uint32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	if mult > 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

// A hits_addend past what every store counts exactly is refused with a
// reason; the largest accepted one is counted and leaves the key spent.
func TestHitsAddendBound(t *testing.T) {
	f := newFixture(t, service.Config{})
	for _, hits := range []uint64{service.MaxHitsAddend + 1, math.MaxUint64} {
		_, err := f.svc.ShouldRateLimit(t.Context(), req(withHits(desc("user", "a"), hits)))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "hits_addend") {
			t.Errorf("hits_addend %d: %v, want InvalidArgument naming hits_addend", hits, err)
		}
	}
	resp := f.call(t, req(withHits(desc("user", "a"), service.MaxHitsAddend)))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("hits_addend MaxHitsAddend: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	for i := range 3 {
		if got := f.call(t, req(desc("user", "a"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("hit %d after the maximal one: %v, want OVER_LIMIT (the key stays spent)", i, got)
		}
	}
}

func TestOverrideWindowBound(t *testing.T) {
	f := newFixture(t, service.Config{})
	tests := []struct {
		name string
		unit typev3.RateLimitUnit
		mult uint32
		ok   bool
	}{
		{"one_year", typev3.RateLimitUnit_YEAR, 1, true},
		{"365_days", typev3.RateLimitUnit_DAY, 365, true},
		{"366_days", typev3.RateLimitUnit_DAY, 366, false},
		{"two_years", typev3.RateLimitUnit_YEAR, 2, false},
		{"centuries", typev3.RateLimitUnit_YEAR, math.MaxUint32, false},
		{"max_seconds", typev3.RateLimitUnit_SECOND, math.MaxUint32, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.svc.ShouldRateLimit(t.Context(), req(withOverride(desc("user", "o-"+tt.name), 5, tt.unit, tt.mult)))
			if tt.ok && err != nil {
				t.Errorf("%v × %d: %v, want accepted", tt.unit, tt.mult, err)
			}
			if !tt.ok && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "YEAR")) {
				t.Errorf("%v × %d: %v, want InvalidArgument naming the one-YEAR limit", tt.unit, tt.mult, err)
			}
		})
	}
}

// An override applies only in a configured domain, as in the anchor.
func TestOverrideInUnconfiguredDomainIsIgnored(t *testing.T) {
	f := newFixture(t, service.Config{})
	r := &rlsv3.RateLimitRequest{Domain: "nowhere", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		withOverride(desc("k", "v"), 1, typev3.RateLimitUnit_HOUR, 0),
	}}
	for i := range 3 {
		resp := f.call(t, r)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("request %d: %v, want OK without a limit", i, resp)
		}
	}
	// Only the anchor's count of requests for a domain no rule names.
	for name, v := range f.reg.Snapshot() {
		switch {
		case name == "ratelimit.service.rate_limit.nowhere.domain_not_found":
			if v != 3 {
				t.Errorf("%s = %d, want 3", name, v)
			}
		case strings.Contains(name, "nowhere"):
			t.Errorf("statistic %s created for an unconfigured domain", name)
		}
	}
}

func TestEmptyDescriptorIsOK(t *testing.T) {
	f := newFixture(t, service.Config{})
	resp := f.call(t, req(&ratelimitv3.RateLimitDescriptor{}, desc("user", "e")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 {
		t.Fatalf("%v, want OK with two statuses", resp)
	}
	if st := resp.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
		t.Errorf("empty descriptor: %v, want OK without a limit", st)
	}
	if st := resp.GetStatuses()[1]; st.GetCurrentLimit().GetRequestsPerUnit() != 3 {
		t.Errorf("the other descriptor: %v, want its rule's limit", st)
	}
	// An override on an empty descriptor has nothing to count on.
	resp = f.call(t, req(withOverride(&ratelimitv3.RateLimitDescriptor{}, 1, typev3.RateLimitUnit_HOUR, 0)))
	if st := resp.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
		t.Errorf("empty descriptor with an override: %v, want OK without a limit", st)
	}
}

const detailedRules = `
domain: d
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func newDetailedFixture(t *testing.T, cfg service.Config) *fixture {
	t.Helper()
	f := newFixture(t, cfg)
	rc, err := rules.Parse([]rules.File{{Name: "d.yaml", Data: []byte(detailedRules)}, {Name: "test.yaml", Data: []byte(testRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	return f
}

func dreq(kv ...string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kv...)}}
}

func scrapeMetrics(t *testing.T, reg *stats.Registry) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

// Values that differ only in characters a metric name cannot hold used to
// turn into one metric name twice, and /metrics answered 500 until restart.
func TestDetailedValuesCannotBreakTheScrape(t *testing.T) {
	f := newDetailedFixture(t, service.Config{})
	for _, v := range []string{"1.2.3.4", "1.2.3-4", "1.2.3_4", "a\nb", "x y"} {
		f.call(t, dreq("remote_address", v))
	}
	code, body := scrapeMetrics(t, f.reg)
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="remote_address_1.2.3.4"} 1`,
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="remote_address_1.2.3-4"} 1`,
		`ratelimit_service_rate_limit_total_hits{domain="d",key1="remote_address_a\nb"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var b strings.Builder
	if err := f.reg.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if !strings.Contains(line, ": ") {
			t.Errorf("/stats line %q is not a statistic: a value split a line", line)
		}
	}
}

// Statistics never grow with the values a client invents: detailed keys
// stop at the bound and overflow into one key per domain; overrides count
// per key path.
func TestStatisticsAreBounded(t *testing.T) {
	f := newDetailedFixture(t, service.Config{MaxDynamicStatKeys: 10})
	for i := range 50 {
		f.call(t, dreq("remote_address", fmt.Sprintf("10.0.0.%d", i)))
		f.call(t, req(withOverride(desc("user", fmt.Sprintf("u%d", i)), 1000, typev3.RateLimitUnit_HOUR, 0)))
	}
	snap := f.reg.Snapshot()
	detailed := 0
	for name := range snap {
		if strings.HasPrefix(name, "ratelimit.service.rate_limit.d.remote_address_") && strings.HasSuffix(name, ".total_hits") {
			detailed++
		}
	}
	// One key of the bound went to the override's key path.
	if detailed != 9 {
		t.Errorf("%d detailed keys, want 9 (bound 10, one taken by the override key path)", detailed)
	}
	if got := snap["ratelimit.service.rate_limit.d._overflow.total_hits"]; got != 41 {
		t.Errorf("overflow total_hits = %d, want 41", got)
	}
	if got := snap["ratelimit.service.rate_limit.test.user.total_hits"]; got != 50 {
		t.Errorf("override key path total_hits = %d, want 50 (one key for every value)", got)
	}
	if got := snap["ratelimit.service.stats_keys_overflow"]; got != 41 {
		t.Errorf("stats_keys_overflow = %d, want 41", got)
	}
	if n := len(snap); n > 100 {
		t.Errorf("%d statistics after 100 requests with invented values", n)
	}
}

// blockingStore holds every batch until release is closed or ctx ends.
type blockingStore struct {
	entered chan struct{}
	release chan struct{}
}

func (s *blockingStore) Do(ctx context.Context, b *limiter.Batch) error {
	s.entered <- struct{}{}
	select {
	case <-s.release:
		b.SizeResults()
		for i := range b.Results {
			b.Results[i] = limiter.Result{Allowed: true, Remaining: 1}
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("blocking: %w: %w", limiter.ErrUnavailable, ctx.Err())
	}
}

// waitingStore waits for ctx to end, as a store that never answers, and
// reports how long that took.
type waitingStore struct {
	calls  int
	waited time.Duration
}

func (s *waitingStore) Do(ctx context.Context, b *limiter.Batch) error {
	s.calls++
	start := time.Now()
	<-ctx.Done()
	s.waited = time.Since(start)
	return fmt.Errorf("waiting: %w: %w", limiter.ErrUnavailable, ctx.Err())
}

// TestRequestBudget: the store's budget is the caller's deadline less a
// margin, bounded by Ceiling (REQUEST_TIMEOUT when the operator sets it),
// and Timeout only for a caller without a deadline; a caller whose
// deadline leaves no time is shed without asking the store. On a fake
// clock (testing/synctest), so that the budgets are exact.
func TestRequestBudget(t *testing.T) {
	tests := []struct {
		name     string
		cfg      service.Config
		deadline time.Duration // the caller's; 0: none, -1: passed already
		want     codes.Code
		waited   time.Duration // by the store; 0: never asked
	}{
		{"no_deadline", service.Config{Timeout: 15 * time.Millisecond}, 0, codes.DeadlineExceeded, 15 * time.Millisecond},
		{"envoy_default", service.Config{Timeout: 15 * time.Millisecond}, 20 * time.Millisecond, codes.DeadlineExceeded, 18 * time.Millisecond},
		{"generous_deadline", service.Config{Timeout: 15 * time.Millisecond}, 2 * time.Second, codes.DeadlineExceeded, 2*time.Second - 5*time.Millisecond},
		{"short_deadline", service.Config{Timeout: 15 * time.Millisecond}, 5 * time.Millisecond, codes.DeadlineExceeded, 4500 * time.Microsecond},
		{"ceiling", service.Config{Timeout: 15 * time.Millisecond, Ceiling: 100 * time.Millisecond}, 2 * time.Second, codes.DeadlineExceeded, 100 * time.Millisecond},
		{"ceiling_without_deadline", service.Config{Timeout: 15 * time.Millisecond, Ceiling: 10 * time.Millisecond}, 0, codes.DeadlineExceeded, 10 * time.Millisecond},
		{"no_time_left", service.Config{Timeout: 15 * time.Millisecond}, -1, codes.ResourceExhausted, 0},
		// The server's defaults for Redis and Memcached (REQUEST_TIMEOUT
		// unset): the caller's deadline, less the margin, and no more.
		{"defaults_envoy", service.Config{Deadlines: true}, 20 * time.Millisecond, codes.DeadlineExceeded, 18 * time.Millisecond},
		{"defaults_generous", service.Config{Deadlines: true}, time.Hour, codes.DeadlineExceeded, time.Hour - 5*time.Millisecond},
		{"defaults_no_time_left", service.Config{Deadlines: true}, -1, codes.ResourceExhausted, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &waitingStore{}
				f := newFixtureWithStore(t, tt.cfg, st)
				ctx := t.Context()
				switch {
				case tt.deadline > 0:
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				case tt.deadline < 0:
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, time.Now())
					defer cancel()
				}
				_, err := f.svc.ShouldRateLimit(ctx, req(desc("user", "a")))
				if status.Code(err) != tt.want {
					t.Errorf("ShouldRateLimit = %v, want %v", err, tt.want)
				}
				if tt.deadline > 0 && ctx.Err() != nil {
					t.Errorf("answered after the caller's deadline")
				}
				switch {
				case tt.waited == 0 && st.calls != 0:
					t.Errorf("the store was asked %d times, want none", st.calls)
				case tt.waited != 0 && st.waited != tt.waited:
					t.Errorf("the store waited %v, want %v", st.waited, tt.waited)
				}
				if shed := f.reg.Snapshot()["ratelimit.service.call.should_rate_limit.load_shed"]; (tt.want == codes.ResourceExhausted) != (shed == 1) {
					t.Errorf("load_shed = %d with %v", shed, tt.want)
				}
			})
		})
	}
}

// slowStore answers every batch, allowed, after a fake minute (run it
// under testing/synctest), and records whether the context it got had a
// deadline.
type slowStore struct{ hadDeadline bool }

func (s *slowStore) Do(ctx context.Context, b *limiter.Batch) error {
	_, s.hadDeadline = ctx.Deadline()
	select {
	case <-time.After(time.Minute):
	case <-ctx.Done():
		return fmt.Errorf("slow: %w: %w", limiter.ErrUnavailable, ctx.Err())
	}
	b.SizeResults()
	for i := range b.Results {
		b.Results[i] = limiter.Result{Allowed: true, Remaining: 1}
	}
	return nil
}

// TestNoDeadlineNoFixedBound: with the server's defaults for Redis and
// Memcached (REQUEST_TIMEOUT unset: Deadlines alone), a call without a
// deadline gets no budget, so that a healthy store that answers late (a
// busy host) answers it, as in the anchor; issue 36: it failed after a
// fixed 15 ms. Set, REQUEST_TIMEOUT still bounds it.
func TestNoDeadlineNoFixedBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowStore{}
		f := newFixtureWithStore(t, service.Config{Deadlines: true}, st)
		resp, err := f.svc.ShouldRateLimit(t.Context(), req(desc("user", "a")))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.hadDeadline {
			t.Errorf("ShouldRateLimit without a deadline = %v, %v (the store's context had a deadline: %v); want OK after the store's minute, no deadline",
				resp.GetOverallCode(), err, st.hadDeadline)
		}
		f = newFixtureWithStore(t, service.Config{Deadlines: true, Ceiling: time.Second}, st)
		if _, err := f.svc.ShouldRateLimit(t.Context(), req(desc("user", "a"))); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("ShouldRateLimit without a deadline, REQUEST_TIMEOUT 1s = %v, want DeadlineExceeded", err)
		}
	})
}

// TestNoBudget: without Timeout, Ceiling or Deadlines (the memory store)
// the store gets the caller's context as it is.
func TestNoBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &waitingStore{}
		f := newFixtureWithStore(t, service.Config{}, st)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := f.svc.ShouldRateLimit(ctx, req(desc("user", "a")))
		if status.Code(err) != codes.DeadlineExceeded || st.waited != time.Second {
			t.Errorf("ShouldRateLimit = %v after the store waited %v, want DeadlineExceeded after 1s", err, st.waited)
		}
	})
}

// serve runs svc on a real gRPC server on loopback, as the server wires it.
func serve(t *testing.T, svc *service.Service) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.InTapHandle(svc.Tap), grpc.ForceServerCodecV2(wire.Codec()))
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func invokeRaw(ctx context.Context, cc *grpc.ClientConn, msg []byte) error {
	var out []byte
	return cc.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &msg, &out, grpc.ForceCodec(wiretest.Raw{}))
}

// rawRequest encodes a request with domain "test" and one entry, without
// the UTF-8 check a proto library would do.
func rawRequest(key, value string) []byte {
	entry := wiretest.Field(1, wiretest.Field(1, []byte(key)), wiretest.Field(2, []byte(value)))
	return slices.Concat(wiretest.Field(1, []byte("test")), wiretest.Field(2, entry))
}

// Invalid UTF-8 and malformed messages are the client's fault:
// InvalidArgument, never Internal (which fail-open Envoy admits).
func TestMalformedMessagesAreInvalidArgument(t *testing.T) {
	f := newFixture(t, service.Config{MaxConcurrent: 8})
	cc := serve(t, f.svc)
	if err := invokeRaw(t.Context(), cc, rawRequest("user", "ok")); err != nil {
		t.Fatalf("a valid raw request: %v", err)
	}
	for name, msg := range map[string][]byte{
		"invalid_utf8_value": rawRequest("user", "a\xff\xfeb"),
		"invalid_utf8_key":   rawRequest("us\xc0er", "a"),
		"truncated":          rawRequest("user", "abc")[:10],
		"garbage":            {0xff, 0xff, 0xff, 0xff},
	} {
		err := invokeRaw(t.Context(), cc, msg)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// A client cannot forge the mark of a malformed message.
	forged := protowire.AppendTag(rawRequest("user", "ok"), 536870911, protowire.BytesType)
	forged = protowire.AppendString(forged, "0123456789abcdef: forged")
	if err := invokeRaw(t.Context(), cc, forged); err != nil {
		t.Errorf("a request with an unknown field 536870911: %v, want answered", err)
	}
	harness.WaitFor(t, 10*time.Second, "in-flight count back to 0 after malformed requests", func() bool { return f.svc.InFlight() == 0 })

	rec := httptest.NewRecorder()
	f.svc.ServeJSON(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader("{\"domain\":\"test\",\"descriptors\":[{\"entries\":[{\"key\":\"user\",\"value\":\"a\xffb\"}]}]}")))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("/json with invalid UTF-8: %d %s, want 400", rec.Code, rec.Body)
	}
}

// Past MaxConcurrent decisions in flight, requests are shed at once, over
// gRPC (before their message is read) and /json, and counted; the places
// come back however the requests end.
func TestConcurrencyBoundSheds(t *testing.T) {
	st := &blockingStore{entered: make(chan struct{}, 16), release: make(chan struct{})}
	f := newFixtureWithStore(t, service.Config{MaxConcurrent: 3}, st)
	cc := serve(t, f.svc)
	client := rlsv3.NewRateLimitServiceClient(cc)

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Go(func() {
			_, err := client.ShouldRateLimit(context.Background(), req(desc("user", "held")))
			errs <- err
		})
	}
	for range 3 {
		<-st.entered
	}
	start := time.Now()
	_, err := client.ShouldRateLimit(t.Context(), req(desc("user", "more")))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("4th concurrent request: %v, want ResourceExhausted", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("shedding took %v, want at once", d)
	}
	rec := httptest.NewRecorder()
	f.svc.ServeJSON(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`)))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/json at the bound: %d, want 503", rec.Code)
	}
	if got := f.reg.Snapshot()["ratelimit.service.call.should_rate_limit.load_shed"]; got != 2 {
		t.Errorf("load_shed = %d, want 2", got)
	}

	// A request canceled by its client gives its place back too.
	ctx, cancel := context.WithCancel(context.Background())
	close(st.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("held request: %v", err)
		}
	}
	harness.WaitFor(t, 10*time.Second, "in-flight count back to 0", func() bool { return f.svc.InFlight() == 0 })
	cancel()
	_, err = client.ShouldRateLimit(ctx, req(desc("user", "canceled")))
	if status.Code(err) != codes.Canceled {
		t.Errorf("canceled call: %v", err)
	}
	harness.WaitFor(t, 10*time.Second, "in-flight count back to 0 after a canceled call", func() bool { return f.svc.InFlight() == 0 })
	if _, err := client.ShouldRateLimit(t.Context(), req(desc("user", "after"))); err != nil {
		t.Errorf("after the held requests ended: %v", err)
	}
}

// TestBoundFreedBeforeTheAnswer: a call gives its place among
// MaxConcurrent back before its answer is written, so that a client that
// sends its next call as soon as it has the answer, at exactly the bound,
// is never shed: the closed loop of a load generator at
// MAX_CONCURRENT_REQUESTS calls in flight.
func TestBoundFreedBeforeTheAnswer(t *testing.T) {
	f := newFixture(t, service.Config{MaxConcurrent: 1})
	client := rlsv3.NewRateLimitServiceClient(serve(t, f.svc))
	for i := range 500 {
		if _, err := client.ShouldRateLimit(t.Context(), req(desc("user", fmt.Sprint("seq", i)))); err != nil {
			t.Fatalf("call %d, one at a time at a bound of 1: %v", i, err)
		}
	}
}

// An outage, or a client whose every request fails, logs one line a second
// per kind, not one per request; the counters still count every request.
func TestErrorLogsAreRateLimited(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	f := newFixtureWithStore(t, service.Config{Log: log}, failingStore{fmt.Errorf("redis: %w", limiter.ErrUnavailable)})
	for range 500 {
		f.svc.ShouldRateLimit(t.Context(), req(desc("user", "a")))
	}
	mu.Lock()
	lines := strings.Count(logs.String(), "store unavailable")
	mu.Unlock()
	if lines < 1 || lines > 3 {
		t.Errorf("%d log lines for 500 failed requests, want about one a second", lines)
	}
	if got := f.reg.Snapshot()["ratelimit.service.call.should_rate_limit.redis_error"]; got != 500 {
		t.Errorf("redis_error = %d, want 500", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// A request may write at most MaxSlidingLogHits timestamps to sliding logs,
// all its descriptors together.
func TestSlidingLogHitsPerRequest(t *testing.T) {
	f := newFixture(t, service.Config{})
	rc, err := rules.Parse([]rules.File{{Name: "s.yaml", Data: []byte(`
domain: test
descriptors:
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: sliding_log}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(rc)
	var descs []*ratelimitv3.RateLimitDescriptor
	for i := range 3 {
		descs = append(descs, withHits(desc("log", fmt.Sprint(i)), 5000))
	}
	_, err = f.svc.ShouldRateLimit(t.Context(), req(descs...))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "sliding_log") {
		t.Errorf("3 × 5000 sliding-log hits: %v, want InvalidArgument", err)
	}
	if _, err := f.svc.ShouldRateLimit(t.Context(), req(descs[:2]...)); err != nil {
		t.Errorf("2 × 5000 sliding-log hits: %v, want answered", err)
	}
}

// A refused request is logged at debug level with its reason, and never
// at the default level (warn): no line per request an attacker sends.
func TestRefusedRequestsLogAtDebug(t *testing.T) {
	for _, tt := range []struct {
		level slog.Level
		want  bool
	}{{slog.LevelDebug, true}, {slog.LevelWarn, false}} {
		var logs strings.Builder
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(b)
		}), &slog.HandlerOptions{Level: tt.level}))
		f := newFixture(t, service.Config{Log: log})
		f.svc.ShouldRateLimit(t.Context(), req(withHits(desc("user", "a"), math.MaxUint64)))
		f.call(t, req(desc("user", "ok")))
		mu.Lock()
		got := logs.String()
		mu.Unlock()
		if has := strings.Contains(got, "request refused") && strings.Contains(got, "hits_addend"); has != tt.want {
			t.Errorf("level %v: logged %q, want a refusal line: %v", tt.level, got, tt.want)
		}
		if strings.Count(got, "\n") > 1 {
			t.Errorf("level %v: %d lines for one refused and one allowed request:\n%s", tt.level, strings.Count(got, "\n"), got)
		}
	}
}
