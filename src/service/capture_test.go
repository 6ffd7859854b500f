package service_test

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
)

// runCapture runs a capture on rec until stop is called, and returns what
// it wrote.
func runCapture(t testing.TB, rec *capture.Recorder) (stop func() []byte) {
	t.Helper()
	var buf bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := rec.Run(t.Context(), capture.Options{Seconds: capture.MaxSeconds, Requests: capture.MaxRequests}, &buf, nil); err != nil {
			t.Error(err)
		}
	})
	harness.WaitFor(t, 10*time.Second, "the capture started", rec.Active)
	return func() []byte {
		rec.Close()
		wg.Wait()
		return buf.Bytes()
	}
}

// TestCaptureRecordsDecisions: while a capture runs, every request the
// service decides is recorded with the time it was decided at, what it
// carried (hits_addend, overrides) and the answer; requests refused as
// invalid are not.
func TestCaptureRecordsDecisions(t *testing.T) {
	rec := capture.New(capture.Config{})
	f := newFixture(t, service.Config{Capture: rec})
	f.call(t, req(desc("user", "before")))
	stop := runCapture(t, rec)

	override := desc("user", "bob")
	override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2, UnitMultiplier: wrapperspb.UInt32(2)}
	override.HitsAddend = wrapperspb.UInt64(0)
	sent := []*rlsv3.RateLimitRequest{
		req(desc("user", "alice"), desc("ip", "10.0.0.1")),
		req(override),
	}
	sent[0].HitsAddend = 2
	var answers []*rlsv3.RateLimitResponse
	for i := range 4 { // alice's limit is 3 a minute: the second is over
		r := sent[i%2]
		answers = append(answers, f.call(t, r))
		f.advance(time.Millisecond)
	}
	if _, err := f.svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("an empty request was answered")
	}
	rd, err := capture.NewReader(bytes.NewReader(stop()))
	if err != nil {
		t.Fatal(err)
	}
	var got capture.Request
	for i, a := range answers {
		if err := rd.Next(&got); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want := epoch.Add(time.Duration(i) * time.Millisecond); !got.Time.Equal(want) {
			t.Errorf("request %d: time %v, want %v", i, got.Time, want)
		}
		if got.OverLimit != (a.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Errorf("request %d: over %t, answered %v", i, got.OverLimit, a.GetOverallCode())
		}
		for k, st := range a.GetStatuses() {
			if got.Codes[k] != (st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT) {
				t.Errorf("request %d descriptor %d: over %t, answered %v", i, k, got.Codes[k], st.GetCode())
			}
		}
	}
	// The last one read carries the override.
	d := got.Descriptors[0]
	if d.Entries[0] != (rules.Entry{Key: "user", Value: "bob"}) || !d.HasHits || d.Hits != 0 ||
		d.Limit == nil || *d.Limit != (capture.Override{RequestsPerUnit: 5, Unit: rules.Minute, UnitMultiplier: 2}) {
		t.Errorf("override recorded as %+v %+v", d, d.Limit)
	}
	if err := rd.Next(&got); err != io.EOF {
		t.Errorf("more recorded than decided: %+v, %v", got, err)
	}
	if answers[2].GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("alice's second request: %v, want over the limit (a capture must see both answers)", answers[2].GetOverallCode())
	}
}

// BenchmarkShouldRateLimitCapture is BenchmarkShouldRateLimit without a
// capture recorder ("off", CAPTURE_ENABLED=false), with one while no
// capture runs ("idle", the default: one atomic load a decision), and
// while one runs ("capturing").
func BenchmarkShouldRateLimitCapture(b *testing.B) {
	for _, mode := range []string{"off", "idle", "capturing"} {
		b.Run(mode, func(b *testing.B) {
			var rec *capture.Recorder
			if mode != "off" {
				rec = capture.New(capture.Config{MaxBytes: 64 << 30})
			}
			f := newFixture(b, service.Config{Capture: rec})
			if mode == "capturing" {
				stop := runCapture(b, rec)
				defer stop()
			}
			decideAll(b, f.svc, userRequests(10_000))
		})
	}
}

// TestCaptureIdleAllocs: a capture recorder with no capture running
// (CAPTURE_ENABLED, the default) adds no allocation to a decision.
func TestCaptureIdleAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race; make allocs runs this test")
	}
	measure := func(rec *capture.Recorder) float64 {
		f := newFixture(t, service.Config{Capture: rec})
		reqs := userRequests(300)
		i := 0
		return testing.AllocsPerRun(3000, func() {
			if _, err := f.svc.ShouldRateLimit(t.Context(), reqs[i%len(reqs)]); err != nil {
				t.Fatal(err)
			}
			i++
		})
	}
	if off, idle := measure(nil), measure(capture.New(capture.Config{})); idle != off {
		t.Errorf("a decision allocates %v times with an idle capture recorder, %v without", idle, off)
	}
}
