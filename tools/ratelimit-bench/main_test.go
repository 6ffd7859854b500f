package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/loadgen"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// TestCalibrateWithAddr measures a no-op server as the target, paired with
// the in-process ceiling, and reports the fraction in text and JSON.
func TestCalibrateWithAddr(t *testing.T) {
	target, err := loadgen.StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Stop()
	args := []string{"-calibrate", "-addr", target.Addr(), "-c", "4", "-n", "200", "-warmup", "0"}

	var out, errOut bytes.Buffer
	if err := run(args, &out, &errOut); err != nil {
		t.Fatalf("run: %v (stderr %s)", err, errOut.String())
	}
	for _, want := range []string{"requests     200 ", "ceiling      in-process no-op RLS v3 server with the service's gRPC tuning", "of ceiling   ", "untuned      "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := run(append(args, "-json"), &out, &errOut); err != nil {
		t.Fatalf("run -json: %v", err)
	}
	var p struct {
		Result       struct{ Requests uint64 } `json:"result"`
		Ceiling      struct{ Requests uint64 } `json:"ceiling"`
		Untuned      struct{ Requests uint64 } `json:"untuned_ceiling"`
		OfCeilingRPS float64                   `json:"of_ceiling_rps"`
		P99OfCeiling float64                   `json:"p99_of_ceiling"`
		OfUntuned    float64                   `json:"of_untuned_ceiling_rps"`
	}
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out.String())
	}
	if p.Result.Requests != 200 || p.Ceiling.Requests != 200 || p.Untuned.Requests != 200 ||
		p.OfCeilingRPS <= 0 || p.P99OfCeiling <= 0 || p.OfUntuned <= 0 {
		t.Errorf("paired JSON = %+v, want 200 requests each and positive ratios", p)
	}
}

// TestCalibrateAlone measures only the ceiling when -addr is not given.
func TestCalibrateAlone(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"-calibrate", "-c", "2", "-n", "50", "-warmup", "0"}, &out, &errOut); err != nil {
		t.Fatalf("run: %v", err)
	}
	if s := out.String(); !strings.HasPrefix(s, "calibrate    in-process no-op") || !strings.Contains(s, "\nuntuned      ") ||
		strings.Contains(s, "of ceiling") {
		t.Errorf("output:\n%s", s)
	}
}

// TestServiceTuning holds the tuned no-op server to the service's default
// GRPC_NUM_STREAM_WORKERS, so that the ceiling follows the service.
func TestServiceTuning(t *testing.T) {
	t.Setenv("GRPC_NUM_STREAM_WORKERS", "")
	os.Unsetenv("GRPC_NUM_STREAM_WORKERS")
	set, err := settings.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := loadgen.ServiceTuning.StreamWorkers; int(got) != set.GRPCNumStreamWorkers {
		t.Errorf("loadgen.ServiceTuning.StreamWorkers = %d, want the service's default %d", got, set.GRPCNumStreamWorkers)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-c", "0"}, {"-hits", "99999999999"}, {"extra"}, {"-override", "5"}, {"-override", "5/fortnight"}, {"-override", "x/hour"}} {
		var out, errOut bytes.Buffer
		if err := run(args, &out, &errOut); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
}

func TestParseOverride(t *testing.T) {
	o, err := parseOverride("100/Hour")
	if err != nil || o.GetRequestsPerUnit() != 100 || o.GetUnit().String() != "HOUR" {
		t.Errorf("parseOverride(100/Hour) = %v, %v", o, err)
	}
	if o, err := parseOverride(""); o != nil || err != nil {
		t.Errorf("parseOverride(\"\") = %v, %v, want none", o, err)
	}
}
