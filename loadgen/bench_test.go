package loadgen

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func startNoop(t *testing.T) string {
	t.Helper()
	srv, err := StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv.Addr()
}

func checkOrdered(t *testing.T, l Latency) {
	t.Helper()
	seq := []time.Duration{l.Min, l.P50, l.P90, l.P99, l.P999, l.Max}
	for i := 1; i < len(seq); i++ {
		if seq[i] < seq[i-1] || seq[i] <= 0 {
			t.Fatalf("latency min,p50,p90,p99,p99.9,max = %v: want positive and ordered", seq)
		}
	}
	if l.Mean < l.Min || l.Mean > l.Max {
		t.Fatalf("mean %v outside [%v, %v]", l.Mean, l.Min, l.Max)
	}
}

func TestRunNoop(t *testing.T) {
	t.Parallel()
	addr := startNoop(t)
	res, err := Run(t.Context(), addr, 2, Load{
		Domain:      "bench",
		Descriptors: []string{"user_id=user-{0..9999}", "a=x,b=y-{0..9},c=z"},
		Concurrency: 8,
		Requests:    500,
		Warmup:      0,
		Timeout:     10 * time.Second,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Requests != 500 || res.OK != 500 || res.OverLimit != 0 || res.Unknown != 0 || res.ErrorCount() != 0 {
		t.Fatalf("requests %d = OK %d + OVER_LIMIT %d + UNKNOWN %d + errors %v; want 500 OK",
			res.Requests, res.OK, res.OverLimit, res.Unknown, res.Errors)
	}
	if res.Elapsed <= 0 || res.RPS() <= 0 {
		t.Fatalf("elapsed %v, rps %v: want positive", res.Elapsed, res.RPS())
	}
	if res.KeySpace != 100000 || res.Conns != 2 || res.Concurrency != 8 {
		t.Errorf("key space %d, conns %d, c %d; want 100000, 2, 8", res.KeySpace, res.Conns, res.Concurrency)
	}
	checkOrdered(t, res.Latency)
}

// sorter answers by the value of the first entry: "0" OK, "1" OVER_LIMIT,
// "2" a ResourceExhausted error, so a run exercises every tally.
type sorter struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (sorter) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch req.GetDescriptors()[0].GetEntries()[0].GetValue() {
	case "0":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	case "1":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	}
	return nil, status.Error(codes.ResourceExhausted, "no")
}

func TestRunCountsAddUp(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, sorter{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	c, err := Dial(t.Context(), lis.Addr().String(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	load := Load{Domain: "d", Descriptors: []string{"k={0..2}"}, Concurrency: 5, Requests: 600}
	// Two runs on one client: the second must not see the first's counts.
	for run := range 2 {
		res, err := c.Run(t.Context(), load)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		errs := res.Errors[codes.ResourceExhausted]
		if res.Requests != 600 || res.OK+res.OverLimit+res.Unknown+res.ErrorCount() != 600 || errs != res.ErrorCount() {
			t.Fatalf("run %d: requests %d = OK %d + OVER_LIMIT %d + UNKNOWN %d + errors %v; want 600 in total",
				run, res.Requests, res.OK, res.OverLimit, res.Unknown, res.Errors)
		}
		if res.OK == 0 || res.OverLimit == 0 || errs == 0 {
			t.Fatalf("run %d: OK %d, OVER_LIMIT %d, ResourceExhausted %d: want each drawn", run, res.OK, res.OverLimit, errs)
		}
		checkOrdered(t, res.Latency)

		var j map[string]any
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &j); err != nil {
			t.Fatal(err)
		}
		if j["requests"] != 600.0 || j["errors"].(map[string]any)["ResourceExhausted"] != float64(errs) {
			t.Fatalf("JSON = %s: want requests 600 and errors by code name", b)
		}
		var text strings.Builder
		if err := res.WriteText(&text); err != nil || !strings.Contains(text.String(), "ResourceExhausted") {
			t.Fatalf("WriteText = %q, %v: want errors by code", text.String(), err)
		}
	}
}

// TestRunDurationBounded checks that a warm-up and a duration end the run;
// it asserts on counts only, not on timing.
func TestRunDurationBounded(t *testing.T) {
	t.Parallel()
	addr := startNoop(t)
	res, err := Run(t.Context(), addr, 1, Load{
		Domain:      "bench",
		Descriptors: []string{"hot=1"},
		Concurrency: 2,
		Duration:    200 * time.Millisecond,
		Warmup:      10 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Requests == 0 || res.OK != res.Requests {
		t.Fatalf("requests %d, OK %d: want some, all OK", res.Requests, res.OK)
	}
	if res.Window != 200*time.Millisecond || res.InWindow > res.Requests || math.Abs(res.RPS()-float64(res.InWindow)/0.2) > 1e-6 {
		t.Fatalf("window %v, in window %d of %d, rps %v: want the rate over the 200ms window",
			res.Window, res.InWindow, res.Requests, res.RPS())
	}
}

func TestRunRejectsUnboundedLoad(t *testing.T) {
	t.Parallel()
	addr := startNoop(t)
	_, err := Run(t.Context(), addr, 1, Load{Domain: "d", Descriptors: []string{"k=v"}})
	if err == nil || !strings.Contains(err.Error(), "number of requests or a duration") {
		t.Fatalf("Run without a bound: error %v, want one asking for a bound", err)
	}
}
