package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// The exit codes of -explain: the answer the request would get, as
// -diff's "same" and "changed" (scripts test them), or trouble.
const (
	explainOK      = 0
	explainOver    = 1
	explainTrouble = 2
)

// Bounds of -explain's input and of a running instance's answer.
const (
	maxExplainRequest = service.DefaultMaxJSONBody
	maxExplainAnswer  = 4 << 20
	explainTimeout    = 10 * time.Second
)

// explainFlags are -explain's.
type explainFlags struct {
	request   string
	debugAddr string
	json      bool
}

func (f *explainFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.request, "explain", "", `explain a request: a RateLimitRequest as JSON, as POST /json takes it ({"domain":"web","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}); - reads it from stdin`)
	fs.StringVar(&f.debugAddr, "debug_addr", "", "with -explain: ask the running instance whose debug listener is HOST:PORT (its rules and its counters now), instead of -config_dir")
}

// runExplain explains f.request with the rules of dir (counters of an
// empty store), or asks the instance at f.debugAddr, and prints it.
func runExplain(f explainFlags, dir string, load func(string) (int, *rules.Config, error), stdin io.Reader, stdout, stderr io.Writer) int {
	body := []byte(f.request)
	if f.request == "-" {
		var err error
		if body, err = io.ReadAll(io.LimitReader(stdin, maxExplainRequest+1)); err != nil {
			fmt.Fprintln(stderr, err)
			return explainTrouble
		}
	}
	if len(body) > maxExplainRequest {
		fmt.Fprintf(stderr, "-explain: the request is over %d bytes, the bound of /json\n", maxExplainRequest)
		return explainTrouble
	}
	var x *service.Explanation
	var err error
	if f.debugAddr != "" {
		x, err = askExplain(f.debugAddr, body)
	} else {
		x, err = explainOffline(dir, load, body, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return explainTrouble
	}
	if err := writeOut(x, f.json, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return explainTrouble
	}
	if x.OverallCode == "OVER_LIMIT" {
		return explainOver
	}
	return explainOK
}

// explainOffline explains body with the rules of dir, on a memory store
// of its own: the counters are those of keys no request has touched.
func explainOffline(dir string, load func(string) (int, *rules.Config, error), body []byte, stderr io.Writer) (*service.Explanation, error) {
	_, c, err := load(dir)
	if err != nil {
		printProblems(stderr, err)
		return nil, fmt.Errorf("invalid rules in %s", dir)
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("-explain: invalid request: %w", err)
	}
	store := memory.New(memory.Config{SweepInterval: -1})
	defer store.Close()
	svc := service.New(limiter.New(store, limiter.Config{KeyFormat: limiter.EscapedKeys}), stats.NewRegistry(), service.Config{})
	svc.SetRules(c)
	x, err := svc.Explain(context.Background(), &req)
	if err != nil {
		return nil, fmt.Errorf("-explain: %w", err)
	}
	x.Counters = "not read: ratelimit-check has no store; these are of keys no request has touched. " +
		"For a running instance's: -debug_addr, or POST the request to its /api/v1/explain"
	return x, nil
}

// askExplain posts body to the /api/v1/explain of the instance whose
// debug listener is addr.
func askExplain(addr string, body []byte) (*service.Explanation, error) {
	ctx, cancel := context.WithTimeout(context.Background(), explainTimeout)
	defer cancel()
	url := "http://" + addr + "/api/v1/explain"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxExplainAnswer))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(answer)))
	}
	var x service.Explanation
	if err := json.Unmarshal(answer, &x); err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return &x, nil
}

// explainStdin is where -explain - reads; tests replace it.
var explainStdin io.Reader = os.Stdin
