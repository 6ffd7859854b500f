package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

func TestParseH2load(t *testing.T) {
	tests := []struct {
		name     string
		give     string
		wantRate float64
		wantBad  int
		wantErr  bool
	}{
		{name: "all_2xx", give: "finished in 5.00s, 12345.67 req/s, 1.2MB/s\nrequests: 61728 total, 61728 started, 61728 done, 61728 succeeded, 0 failed, 0 errored, 0 timeout\nstatus codes: 61728 2xx, 0 3xx, 0 4xx, 0 5xx\n",
			wantRate: 12345.67},
		{name: "milliseconds_and_failures", give: "finished in 43.37ms, 461.13 req/s, 42.15KB/s\nrequests: 20 total, 20 started, 20 done, 15 succeeded, 2 failed, 1 errored, 1 timeout\nstatus codes: 15 2xx, 0 3xx, 1 4xx, 3 5xx\n",
			wantRate: 461.13, wantBad: 2 + 1 + 1 + 1 + 3},
		{name: "not_a_report", give: "connect: Connection refused\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rate, bad, err := parseH2load(tt.give)
			if (err != nil) != tt.wantErr || rate != tt.wantRate || bad != tt.wantBad {
				t.Errorf("parseH2load = %v, %d, %v; want %v, %d, error %v", rate, bad, err, tt.wantRate, tt.wantBad, tt.wantErr)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	var xs []float64
	for i := 1; i <= 1000; i++ {
		xs = append(xs, float64(i))
	}
	for _, tt := range []struct{ q, want float64 }{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}} {
		if got := percentile(xs, tt.q); got != tt.want {
			t.Errorf("percentile(1..1000, %v) = %v, want %v", tt.q, got, tt.want)
		}
	}
}

// TestEnvoyBootstrapLoads runs real Envoy with the benchmark's bootstrap:
// every target's listener binds, and the no-filter listener reaches the
// upstream.
func TestEnvoyBootstrapLoads(t *testing.T) {
	bin, err := harness.FindEnvoy()
	if err != nil {
		t.Fatalf("%v; %s", err, harness.EnvoyInstall)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	up, upAddr, err := startUpstreamProcess(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer up.stop()
	rls := &service{grpcAddr: "127.0.0.1:1"}
	targets := []*envoyTarget{{name: "no_filter"},
		{name: "ratelimit_memory_1", impl: "ratelimit", store: "memory", descs: 1, svc: rls},
		{name: "ratelimit_memory_3", impl: "ratelimit", store: "memory", descs: 3, svc: rls}}
	e, err := startBenchEnvoy(ctx, bin, filepath.Join(t.TempDir(), "envoy"), envoyBootstrap(targets, upAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	for _, tg := range targets {
		addr, err := e.Listener(tg.name)
		if err != nil {
			t.Fatal(err)
		}
		if tg.svc == nil {
			if err := httpOK("http://" + addr + "/"); err != nil {
				t.Errorf("through the no-filter listener: %v", err)
			}
		}
	}
	if n, err := e.requests("no_filter"); err != nil || n != 1 {
		t.Errorf("requests(no_filter) = %v, %v; want 1", n, err)
	}
}
