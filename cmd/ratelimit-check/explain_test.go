package main

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// userRequest is a request of one descriptor user=value with hits.
func userRequest(key, value, hits string) string {
	return `{"domain":"web","descriptors":[{"entries":[{"key":"` + key + `","value":"` + value + `"}],"hitsAddend":"` + hits + `"}]}`
}

// TestExplainOffline: -explain with -config_dir says which rule each
// descriptor matches or why none does, with the counters of an untouched
// key, and exits with the answer: 0 OK, 1 OVER_LIMIT, 2 trouble.
func TestExplainOffline(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "web.yaml", webV1)
	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"matched", []string{"-explain", userRequest("user", "alice", "1")}, explainOK,
			[]string{"user=alice matched user by key (web.yaml:3)", "limit web.user: 10 / MINUTE", "10 left", "overall: OK", "ratelimit-check has no store"}},
		{"hits_over", []string{"-explain", userRequest("user", "alice", "11")}, explainOver, []string{"answer: OVER_LIMIT", "overall: OVER_LIMIT"}},
		{"value_not_matched", []string{"-explain", userRequest("path", "/other", "1")}, explainOK,
			[]string{`why: entry 1: the value "/other" of key "path" matches no rule`, `"/login"`}},
		{"json", []string{"-explain", userRequest("usr", "alice", "1"), "-json"}, explainOK, []string{`"why": "entry 1: no rule has the key \"usr\"`}},
		{"invalid_request", []string{"-explain", `{"domain":""}`}, explainTrouble, nil},
		{"not_json", []string{"-explain", `{"domain":`}, explainTrouble, nil},
		{"no_rules_nor_instance", []string{"-explain", userRequest("user", "a", "1")}, explainTrouble, nil},
		{"both", []string{"-explain", userRequest("user", "a", "1"), "-debug_addr", "127.0.0.1:1"}, explainTrouble, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.name != "no_rules_nor_instance" {
				args = append(args, "-config_dir", dir)
			}
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != tt.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}

// TestExplainFromInstance: -explain with -debug_addr asks a running
// instance's /api/v1/explain, whose counters are its own.
func TestExplainFromInstance(t *testing.T) {
	c, err := rules.Parse([]rules.File{{Name: "web.yaml", Data: []byte(webV1)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New(memory.Config{})
	t.Cleanup(store.Close)
	svc := service.New(limiter.New(store, limiter.Config{}), stats.NewRegistry(), service.Config{})
	svc.SetRules(c)
	for range 4 {
		r := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
		}}}
		if _, err := svc.ShouldRateLimit(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(svc.ExplainHandler(service.DefaultMaxJSONBody))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	old := explainStdin
	explainStdin = strings.NewReader(userRequest("user", "alice", "7"))
	t.Cleanup(func() { explainStdin = old })
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-explain", "-", "-debug_addr", addr}, &stdout, &stderr); code != explainOver {
		t.Fatalf("exit %d, want %d (6 left, 7 hits)\n%s%s", code, explainOver, stdout.String(), stderr.String())
	}
	for _, w := range []string{"now 6 left", "counters: read", "overall: OVER_LIMIT"} {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, stdout.String())
		}
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"-explain", `{"domain":""}`, "-debug_addr", addr}, &stdout, &stderr); code != explainTrouble || !strings.Contains(stderr.String(), "400 Bad Request") {
		t.Errorf("an invalid request: exit %d, %s", code, stderr.String())
	}
}
