package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/replay"
)

// replayRules use every algorithm, windows of a second and a minute, a
// list with a shadow twin, a rule that replaces a limit of it, and a
// wildcard shared by its values.
const replayRules = `domain: rp
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 8}
      - {unit: minute, requests_per_unit: 4, shadow_mode: true}
      - {unit: hour, requests_per_unit: 30, algorithm: sliding_window, name: hourly}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_log}
  - key: path
    value: /img/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: token_bucket, burst: 3}
  - key: tier
    value: free
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: hourly}]}
`

// replayTraffic is n seeded random requests over replayRules' keys, with
// hits_addend and limit overrides now and then.
func replayTraffic(n int) []*rlsv3.RateLimitRequest {
	rng := rand.New(rand.NewPCG(29, 3))
	d := func(k, v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	reqs := make([]*rlsv3.RateLimitRequest, n)
	for i := range reqs {
		r := &rlsv3.RateLimitRequest{Domain: "rp"}
		for range 1 + rng.IntN(3) {
			var desc *ratelimitv3.RateLimitDescriptor
			switch rng.IntN(5) {
			case 0, 1:
				desc = d("user", fmt.Sprint("u", rng.IntN(12)))
			case 2:
				desc = d("ip", fmt.Sprint("10.0.0.", rng.IntN(3)))
			case 3:
				desc = d("path", fmt.Sprint("/img/", rng.IntN(50), ".png"))
			default:
				desc = d("api_key", fmt.Sprint("k", rng.IntN(3)))
				if rng.IntN(4) == 0 {
					desc.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_MINUTE}
				}
			}
			if rng.IntN(10) == 0 {
				desc.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(3)))
			}
			r.Descriptors = append(r.Descriptors, desc)
		}
		if rng.IntN(7) == 0 {
			r.Descriptors = append(r.Descriptors, d("tier", "free"))
		}
		if rng.IntN(8) == 0 {
			r.HitsAddend = uint32(1 + rng.IntN(3))
		}
		reqs[i] = r
	}
	return reqs
}

// TestReplayOfTheRunningService: a capture taken from the built binary, on
// the memory store, holds every request it decided with the answer its
// client got, and ratelimit-check's replay of it against the same rules
// (the built command, on the capture saved to a file) decides every
// descriptor as the service did; against stricter rules it reports what
// they change.
func TestReplayOfTheRunningService(t *testing.T) {
	slow(t)
	p := start(t, map[string]string{"rp.yaml": replayRules}, "USE_STATSD=false")
	c := p.client(t)
	reqs := replayTraffic(1500)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/api/v1/capture?seconds=600&requests=%d&domain=rp", p.debug, len(reqs)), nil)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	header, err := br.ReadString('\n')
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("capture: %s %q %v", resp.Status, header, err)
	}
	// The header is written once the recording runs: every request from
	// now on is captured. One at a time, so that the service decides them
	// in the order of their times.
	answers := make([]*rlsv3.RateLimitResponse, len(reqs))
	for i, r := range reqs {
		if answers[i], err = c.ShouldRateLimit(callCtx(t), r); err != nil {
			t.Fatal(err)
		}
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	data := append([]byte(header), rest...)

	// The capture holds each request with the answer its client got.
	rd, err := capture.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for i, a := range answers {
		var got capture.Request
		if err := rd.Next(&got); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if len(got.Codes) != len(a.GetStatuses()) || got.Descriptors[0].Entries[0].Value != reqs[i].GetDescriptors()[0].GetEntries()[0].GetValue() {
			t.Fatalf("request %d recorded as %+v, sent %v", i, got, reqs[i])
		}
		for k, st := range a.GetStatuses() {
			over := st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
			if got.Codes[k] != over {
				t.Errorf("request %d descriptor %d: recorded over %t, answered %v", i, k, got.Codes[k], st.GetCode())
			}
			if over {
				refused++
			}
		}
	}
	if err := rd.Next(new(capture.Request)); err != io.EOF || rd.Summary() == nil || rd.Summary().Reason != "requests" {
		t.Fatalf("after the requests: %v, summary %+v", err, rd.Summary())
	}
	if refused < 150 {
		t.Fatalf("the service refused %d descriptors of %d requests: the traffic tests too little", refused, len(reqs))
	}

	// ratelimit-check -replay, as an operator runs it, on the capture
	// saved to a file.
	dir := t.TempDir()
	checker := checkerBinary(t)
	file := filepath.Join(dir, "rp.ndjson")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rulesDir := func(name, yaml string) string {
		writeRules(t, filepath.Join(dir, name), "rp.yaml", yaml)
		return filepath.Join(dir, name, "config")
	}
	same, stricterDir := rulesDir("same", replayRules), rulesDir("stricter", strings.Replace(replayRules, "requests_per_unit: 8}", "requests_per_unit: 5}", 1))
	replayed := func(wantExit int, args ...string) *replay.Report {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(checker, append([]string{"-replay", file, "-json"}, args...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if code := exitCode(cmd.Run()); code != wantExit {
			t.Fatalf("ratelimit-check %s: exit %d, want %d\n%s", strings.Join(args, " "), code, wantExit, stderr.String())
		}
		var rep replay.Report
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("ratelimit-check %s -json: %v\n%s", strings.Join(args, " "), err, stdout.String())
		}
		return &rep
	}
	// Against the service's rules, compared with the answers in the
	// capture: every descriptor answered as the service answered it.
	if rep := replayed(0, "-config_dir", same); rep.Requests != int64(len(reqs)) || rep.DescriptorsDiffer != 0 {
		t.Fatalf("replayed %d of %d requests against the service's rules: %d descriptors answered otherwise than the service did",
			rep.Requests, len(reqs), rep.DescriptorsDiffer)
	}
	stricter := replayed(1, "-config_dir", stricterDir, "-against", same)
	if stricter.RefusedByNewOnly == 0 || stricter.RefusedByOtherOnly != 0 {
		t.Errorf("stricter rules: %d descriptors differ, %d refused by them only, %d by the service's rules only; want some, some, none",
			stricter.DescriptorsDiffer, stricter.RefusedByNewOnly, stricter.RefusedByOtherOnly)
	}
	t.Logf("%d requests, %d descriptors refused; the stricter rules refuse %d requests more", len(reqs), refused, stricter.RefusedByNewOnly)
}
