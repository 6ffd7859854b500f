package replay_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/replay"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// mixRules use every algorithm, a list with a shadow limit, a rule that
// replaces a limit of it, a wildcard shared by its values, and a value
// matched exactly.
const mixRules = `domain: web
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 20, algorithm: sliding_window, name: hourly}
      - {unit: minute, requests_per_unit: 2, algorithm: token_bucket, shadow_mode: true, name: strict}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_log}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /img/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 4}
  - key: tier
    value: free
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: hourly}]}
`

func parse(t testing.TB, yaml string) *rules.Config {
	t.Helper()
	c, err := rules.Parse([]rules.File{{Name: "web.yaml", Data: []byte(yaml)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mix returns n requests of seeded random traffic over mixRules' keys,
// with hits_addend, descriptors' own hits, limit overrides and refunds
// (is_negative_hits) now and then, and the time step before each (0 to
// 400 ms, often 0).
func mix(n int, seed uint64) ([]*rlsv3.RateLimitRequest, []time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 1))
	d := func(kv ...string) *ratelimitv3.RateLimitDescriptor {
		out := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i < len(kv); i += 2 {
			out.Entries = append(out.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	reqs := make([]*rlsv3.RateLimitRequest, n)
	steps := make([]time.Duration, n)
	for i := range reqs {
		r := &rlsv3.RateLimitRequest{Domain: "web"}
		for range 1 + rng.IntN(3) {
			var desc *ratelimitv3.RateLimitDescriptor
			switch rng.IntN(6) {
			case 0, 1:
				desc = d("user", fmt.Sprint("u", rng.IntN(8)))
			case 2:
				desc = d("ip", fmt.Sprint("10.0.0.", rng.IntN(4)))
			case 3:
				desc = d("path", []string{"/login", "/img/a.png", "/img/b.png", "/other"}[rng.IntN(4)])
			case 4:
				desc = d("api_key", fmt.Sprint("k", rng.IntN(3)))
				if rng.IntN(5) == 0 {
					desc.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}
				}
			default:
				desc = d("tier", "free")
			}
			if rng.IntN(10) == 0 {
				desc.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(3)))
			}
			desc.IsNegativeHits = rng.IntN(12) == 0
			r.Descriptors = append(r.Descriptors, desc)
		}
		if rng.IntN(8) == 0 {
			r.HitsAddend = uint32(1 + rng.IntN(3))
		}
		reqs[i] = r
		if rng.IntN(3) > 0 {
			steps[i] = time.Duration(rng.IntN(400)) * time.Millisecond
		}
	}
	return reqs, steps
}

// serveAndCapture decides reqs one at a time with the service on the
// memory store (its clock stepped by steps), captures them, and returns
// the capture and the service's answers.
func serveAndCapture(t *testing.T, c *rules.Config, stop bool, reqs []*rlsv3.RateLimitRequest, steps []time.Duration) ([]byte, []*rlsv3.RateLimitResponse) {
	t.Helper()
	now := time.Unix(1_764_246_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memory.New(memory.Config{Now: clock})
	t.Cleanup(store.Close)
	rec := capture.New(capture.Config{})
	svc := service.New(limiter.New(store, limiter.Config{NearLimitRatio: 0.8, KeyFormat: limiter.EscapedKeys, StopIncrementWhenOverLimit: stop}),
		stats.NewRegistry(), service.Config{Now: clock, Capture: rec})
	svc.SetRules(c)
	var buf bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := rec.Run(t.Context(), capture.Options{Seconds: capture.MaxSeconds, Requests: capture.MaxRequests}, &buf, nil); err != nil {
			t.Error(err)
		}
	})
	harness.WaitFor(t, 10*time.Second, "the capture started", rec.Active)
	answers := make([]*rlsv3.RateLimitResponse, len(reqs))
	for i, r := range reqs {
		mu.Lock()
		now = now.Add(steps[i])
		mu.Unlock()
		resp, err := svc.ShouldRateLimit(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		answers[i] = resp
	}
	rec.Close()
	wg.Wait()
	return buf.Bytes(), answers
}

func run(t *testing.T, data []byte, cfg replay.Config) *replay.Report {
	t.Helper()
	rd, err := capture.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := replay.Run(t.Context(), rd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestReplayDecidesAsTheService: a capture of the service replayed against
// the same rules gives every descriptor the answer the service gave, in
// both modes of STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT; the answers
// include refusals of every kind of rule, so the agreement is not that of
// a service that refuses nothing.
func TestReplayDecidesAsTheService(t *testing.T) {
	t.Parallel()
	c := parse(t, mixRules)
	reqs, steps := mix(3000, 1)
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("stop_increment=%t", stop), func(t *testing.T) {
			data, answers := serveAndCapture(t, c, stop, reqs, steps)
			refused := 0
			for _, a := range answers {
				for _, st := range a.GetStatuses() {
					if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
						refused++
					}
				}
			}
			if refused < 100 {
				t.Fatalf("the service refused %d descriptors of 3000 requests: the traffic tests too little", refused)
			}
			rep := run(t, data, replay.Config{New: c, NewName: "same", StopIncrementWhenOverLimit: stop})
			if rep.Requests != int64(len(reqs)) || rep.Differs() || rep.RefusedByNewOnly+rep.RefusedByOtherOnly != 0 {
				t.Fatalf("replayed %d requests of %d: %d descriptors answered otherwise than the service did",
					rep.Requests, len(reqs), rep.DescriptorsDiffer)
			}
			for _, r := range rep.Rules {
				if r.Shadow {
					// What it would refuse, against what was refused.
					continue
				}
				if r.Refused == 0 || r.RefusedOtherAdmitted+r.AdmittedOtherRefused != 0 {
					t.Errorf("rule %s: %+v, want refusals, and no difference", r.ID, r)
				}
			}
			// And against the same rules as "old": the same again, on
			// both sides.
			if rep := run(t, data, replay.Config{New: c, Old: c, NewName: "a", OldName: "b", StopIncrementWhenOverLimit: stop}); rep.Differs() {
				t.Errorf("the same rules against themselves: %d descriptors differ", rep.DescriptorsDiffer)
			}
		})
	}
}

// TestReplayReportsWhatChanges: a stricter limit is reported with the
// requests it refuses that the current rules admit, its keys most refused
// and their first refusals; the looser one the reverse.
func TestReplayReportsWhatChanges(t *testing.T) {
	t.Parallel()
	old := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	stricter := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	start := time.Unix(1_764_246_000, 0)
	var b []byte
	b = append(b, `{"capture":1,"ns":1,"values":"plain","seconds":60,"requests":100}`+"\n"...)
	add := func(at time.Duration, user string) {
		r := capture.Request{Time: start.Add(at), Domain: "web",
			Descriptors: []capture.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: user}}}}, Codes: []bool{false}}
		b = capture.AppendRequest(b, &r, nil)
	}
	// alice: 4 in the first minute; bob: 3; carol: 1. Written out of
	// time order by a little, as concurrent requests are.
	add(3*time.Second, "alice")
	add(1*time.Second, "alice")
	add(2*time.Second, "bob")
	add(4*time.Second, "alice")
	add(5*time.Second, "bob")
	add(6*time.Second, "alice")
	add(7*time.Second, "bob")
	add(8*time.Second, "carol")
	rep := run(t, b, replay.Config{New: stricter, Old: old, NewName: "new", OldName: "old", Top: 1})
	// The stricter limit refuses alice's 3rd and 4th and bob's 3rd; the
	// current one alice's 4th only.
	if rep.Requests != 8 || !rep.Differs() || rep.RefusedByNewOnly != 2 || rep.RefusedByOtherOnly != 0 || rep.DescriptorsDiffer != 2 {
		t.Fatalf("report %+v, want 2 requests refused by the stricter rules only", rep)
	}
	if !rep.From.Equal(start.Add(time.Second)) || !rep.To.Equal(start.Add(8*time.Second)) {
		t.Errorf("From, To = %v, %v; want the first and last times, in order", rep.From, rep.To)
	}
	want := replay.RuleReport{ID: "web.user", Source: "web.yaml:3", Requests: 8, Refused: 3, RefusedOtherAdmitted: 2,
		Keys: []replay.KeyReport{{Key: `user="alice"`, Refused: 2, First: start.Add(4 * time.Second)}}}
	if got := rep.Rules; len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(want) {
		t.Errorf("new rules: %+v\nwant %+v", got, want)
	}
	if got := rep.OldRules; len(got) != 1 || got[0].Refused != 1 || got[0].AdmittedOtherRefused != 2 || got[0].Keys[0].Key != `user="alice"` {
		t.Errorf("old rules: %+v, want alice's one refusal, and 2 admitted that the new ones refuse", got)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"replayed 8 requests", "2 descriptors answered differently", "web.user", `user="alice"`, "2025-11-27T12:20:04.000Z",
		"warning: the capture has no last line"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("the text report lacks %q:\n%s", s, text.String())
		}
	}
}

// TestReplayShadowLimits: a shadow limit in the new rules is reported
// with what it would refuse, none of which changes an answer.
func TestReplayShadowLimits(t *testing.T) {
	t.Parallel()
	old := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10}\n")
	tried := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10}\n      - {unit: hour, requests_per_unit: 2, shadow_mode: true, name: strict}\n")
	var b []byte
	b = append(b, `{"capture":1,"ns":1,"values":"plain","seconds":60,"requests":100}`+"\n"...)
	for i := range 5 {
		r := capture.Request{Time: time.Unix(1_764_246_000+int64(i), 0), Domain: "web",
			Descriptors: []capture.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: "dave"}}}}, Codes: []bool{false}}
		b = capture.AppendRequest(b, &r, nil)
	}
	rep := run(t, b, replay.Config{New: tried, Old: old, NewName: "new", OldName: "old"})
	if rep.Differs() {
		t.Errorf("a shadow limit changed %d answers", rep.DescriptorsDiffer)
	}
	for _, r := range rep.Rules {
		if r.ID == "web.user.strict" && (!r.Shadow || r.Requests != 5 || r.Refused != 3 || r.RefusedOtherAdmitted != 3) {
			t.Errorf("the shadow limit: %+v, want 3 of 5 it would refuse, that the old rules admit", r)
		}
	}
}

// TestReplayErrors: a capture out of time order beyond the reorder bound,
// or with a request the service refuses, stops the replay at its line.
func TestReplayErrors(t *testing.T) {
	t.Parallel()
	c := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	head := `{"capture":1,"ns":1,"values":"plain","seconds":60,"requests":100}` + "\n"
	line := func(ns int64, domain string) string {
		r := capture.Request{Time: time.Unix(0, ns), Domain: domain,
			Descriptors: []capture.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: "x"}}}}, Codes: []bool{false}}
		return string(capture.AppendRequest(nil, &r, nil))
	}
	tests := []struct {
		name         string
		data         string
		reorder      int
		reorderBytes int64
		line         int
		is           error
		msg          string
	}{
		{"out_of_order", head + line(3e9, "web") + line(2e9, "web") + line(1e9, "web"), 1, 0, 4, replay.ErrOrder, "before the request of line 3"},
		// A window of one byte holds no request: the second is out.
		{"out_of_order_bytes", head + line(3e9, "web") + line(2e9, "web") + line(1e9, "web"), 0, 1, 3, replay.ErrOrder, "window of 4096 requests or 1 bytes"},
		{"refused_by_the_service", head + line(1e9, "web") + line(2e9, "") + line(3e9, "web"), 0, 0, 3, nil, "the service refuses the request"},
		{"not_a_request", head + line(1e9, "web") + "{}\n", 0, 0, 3, nil, `no "ns"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rd, err := capture.NewReader(strings.NewReader(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			_, err = replay.Run(t.Context(), rd, replay.Config{New: c, Reorder: tt.reorder, ReorderBytes: tt.reorderBytes})
			var le *capture.LineError
			if !errors.As(err, &le) || le.Line != tt.line || !strings.Contains(err.Error(), tt.msg) || tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Run: %v, want line %d: %q", err, tt.line, tt.msg)
			}
		})
	}
}

// TestReplaySkipsLinesTooLong: a line longer than capture.MaxLine is
// skipped and counted, the report naming it, and the replay goes on.
func TestReplaySkipsLinesTooLong(t *testing.T) {
	t.Parallel()
	c := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	var b []byte
	b = append(b, `{"capture":1,"ns":1,"values":"plain","seconds":60,"requests":100}`+"\n"...)
	for i := range 4 {
		if i == 1 {
			b = append(b, `{"ns":1,"domain":"`+strings.Repeat("a", capture.MaxLine)+`"}`+"\n"...)
		}
		r := capture.Request{Time: time.Unix(1_764_246_000+int64(i), 0), Domain: "web",
			Descriptors: []capture.Descriptor{{Entries: []rules.Entry{{Key: "user", Value: "eve"}}}}, Codes: []bool{false}}
		b = capture.AppendRequest(b, &r, nil)
	}
	rep := run(t, b, replay.Config{New: c, NewName: "new"})
	if rep.Requests != 4 || rep.TooLong != 1 || fmt.Sprint(rep.TooLongAt) != "[3]" {
		t.Fatalf("replayed %d requests, %d lines too long at %v; want 4, and line 3", rep.Requests, rep.TooLong, rep.TooLongAt)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("warning: lines longer than %d bytes, skipped (their requests are not replayed): 1, at line 3\n", capture.MaxLine); !strings.Contains(text.String(), want) {
		t.Errorf("the report lacks %q:\n%s", want, text.String())
	}
}
