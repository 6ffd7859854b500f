package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// The side by side with a generator that costs little (-h2load, issue 25
// part 6): h2load, a load generator in C, sends the same pre-encoded
// ShouldRateLimit call (one descriptor, one key) over h2c, closed loop,
// to a no-op gRPC server (the ceiling), to this service on each store and
// to envoyproxy/ratelimit on Redis and Memcached when its binary is
// given. tools/ratelimit-bench, in Go, takes about as much CPU per call as
// the service, so on two cores it hides much of the difference between
// two services; h2load takes a few µs. One key is what h2load can send
// (the body is fixed), which is the hot path of a store all the same:
// one counter incremented by every call. Each round measures every
// target once; ratios are taken within a round.

// The generated part of docs/BENCHMARKS.md for -h2load sits between these.
const (
	h2grpcStartMarker = "<!-- benchrun-h2load:start -->"
	h2grpcEndMarker   = "<!-- benchrun-h2load:end -->"
)

// h2grpcPath is the method h2load calls.
const h2grpcPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// h2grpcTarget is one server h2load drives.
type h2grpcTarget struct {
	// name labels the row: "no-op", "this service" or anchorVariant.
	name, store string
	// variant, for this service, names settings beside the store's
	// ("write-behind 100ms"); "" for the defaults.
	variant string
	svc     *service
	be      *backend
}

// h2grpcRun is one measurement of one target.
type h2grpcRun struct {
	reqPerSec float64
	// rls and store are their CPU µs per call.
	rls, store float64
	// ops is the store ops per call (the service's ratelimit.redis.ops or
	// ratelimit.memcache.ops); -1 when not known.
	ops float64
	bad int
}

// h2grpcOptions are the -h2load mode's settings.
type h2grpcOptions struct {
	anchor, bin   string
	stores        []string
	runs          int
	duration      time.Duration
	conns, stream int
	out, command  string
	// descriptors is the number of descriptors of the call (default 1).
	descriptors int
	// writeBehind lists the WRITE_BEHIND_INTERVAL values to measure this
	// service with on each shared store, beside its default.
	writeBehind []string
}

// h2grpcRequest is the ShouldRateLimit request h2load sends: domain bench,
// n descriptors user_id=user-1 ... user-n (one counter each).
func h2grpcRequest(n int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "bench"}
	for i := range max(n, 1) {
		req.Descriptors = append(req.Descriptors, &commonv3.RateLimitDescriptor{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: fmt.Sprintf("user-%d", i+1)}},
		})
	}
	return req
}

// h2grpcBody is the gRPC message h2load sends: a length-prefixed
// h2grpcRequest(n).
func h2grpcBody(n int) ([]byte, error) {
	msg, err := proto.Marshal(h2grpcRequest(n))
	if err != nil {
		return nil, err
	}
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...), nil
}

// runH2grpcBench is the -h2load mode.
func runH2grpcBench(ctx context.Context, o h2grpcOptions, tmp string, logf func(string, ...any)) error {
	h2load, err := exec.LookPath("h2load")
	if err != nil {
		return errors.New("benchrun: -h2load needs h2load: apt-get install nghttp2-client (Debian/Ubuntu), brew install nghttp2 (macOS)")
	}
	body, err := h2grpcBody(o.descriptors)
	if err != nil {
		return err
	}
	bodyPath := filepath.Join(tmp, "call.bin")
	if err := os.WriteFile(bodyPath, body, 0o600); err != nil {
		return err
	}
	rulesRoot := filepath.Join(tmp, "h2load-rules")
	if err := writeRules(rulesRoot, rulesHead); err != nil {
		return err
	}
	noop, err := startNoopProcess(ctx, tunedNoop)
	if err != nil {
		return err
	}
	defer noop.stop()
	targets := []*h2grpcTarget{{name: "no-op", svc: noop, be: &backend{}}}
	for _, st := range o.stores {
		be, err := startBackend(ctx, st, filepath.Join(tmp, "h2load-"+st), logf)
		if err != nil {
			return err
		}
		if be.stop != nil {
			defer be.stop()
		}
		impls := []string{"this service"}
		if o.anchor != "" && anchorStore(st) {
			impls = append(impls, anchorVariant)
		}
		for _, impl := range impls {
			bin := o.bin
			if impl == anchorVariant {
				bin = o.anchor
			}
			// The anchor's /healthcheck stays 500 on Memcached.
			healthy := impl != anchorVariant || st != "memcache"
			svc, err := startServiceUntil(ctx, bin, impl+" ("+st+")", rulesRoot, healthy, be.env...)
			if err != nil {
				return err
			}
			defer svc.stop()
			if err := checkCall(ctx, svc.grpcAddr, o.descriptors); err != nil {
				return fmt.Errorf("benchrun: %s on %s: %w", impl, st, err)
			}
			targets = append(targets, &h2grpcTarget{name: impl, store: st, svc: svc, be: be})
		}
		for _, iv := range o.writeBehind {
			if st == "memory" {
				break
			}
			variant := "write-behind " + iv
			env := append(slices.Clone(be.env), "WRITE_BEHIND_INTERVAL="+iv)
			svc, err := startServiceUntil(ctx, o.bin, "this service ("+st+", "+variant+")", rulesRoot, true, env...)
			if err != nil {
				return err
			}
			defer svc.stop()
			if err := checkCall(ctx, svc.grpcAddr, o.descriptors); err != nil {
				return fmt.Errorf("benchrun: this service on %s, %s: %w", st, variant, err)
			}
			targets = append(targets, &h2grpcTarget{name: "this service", variant: variant, store: st, svc: svc, be: be})
		}
	}
	results := map[*h2grpcTarget][]h2grpcRun{}
	for round := range o.runs {
		for _, tg := range targets {
			logf("benchrun: h2load round %d/%d: %s %s %s", round+1, o.runs, tg.name, tg.store, tg.variant)
			run, err := measureH2grpc(ctx, o, h2load, bodyPath, tg)
			if err != nil {
				return err
			}
			results[tg] = append(results[tg], run)
			logf("benchrun: %.0f calls/s, server %.1f µs/call, store %.1f µs/call", run.reqPerSec, run.rls, run.store)
		}
	}
	doc, err := os.ReadFile(o.out)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	md := h2grpcMarkdown(o, targets, results)
	return os.WriteFile(o.out, []byte(replaceBetween(string(doc), h2grpcStartMarker, h2grpcEndMarker, md)), 0o644)
}

// checkCall makes the call h2load will make, once, with grpc-go: h2load
// counts HTTP statuses and cannot see a gRPC error in the trailers, so a
// target that does not answer it OK, under the rule's limit, is not
// measured. The standard runs check the anchor so too.
func checkCall(ctx context.Context, addr string, descriptors int) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, h2grpcRequest(descriptors))
	if err != nil {
		return fmt.Errorf("the call h2load makes: %w", err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		return fmt.Errorf("the call h2load makes: %v, want OK", resp.GetOverallCode())
	}
	// A server that loaded no rules answers OK too, without a store
	// operation: the limit must be the rule's.
	if st := resp.GetStatuses(); len(st) != max(descriptors, 1) || st[0].GetCurrentLimit().GetRequestsPerUnit() != 1000000 {
		return fmt.Errorf("the call h2load makes: statuses %v, want the limit of 1000000 a second of the rule user_id (were the rules loaded?)", st)
	}
	return nil
}

// measureH2grpc runs h2load closed loop against tg and reads the CPU its
// server (and store) used per call.
func measureH2grpc(ctx context.Context, o h2grpcOptions, h2load, bodyPath string, tg *h2grpcTarget) (h2grpcRun, error) {
	clk := clockTicks()
	cpu := func() (rls, store float64, err error) {
		t, err := cpuTicks(tg.svc.pid())
		if err != nil {
			return 0, 0, err
		}
		rls = float64(t) / float64(clk)
		switch {
		case len(tg.be.redis) > 0:
			u, err := readRedisUsage(ctx, tg.be.redis)
			if err != nil {
				return 0, 0, err
			}
			store = u.cpu
		case tg.be.proc != nil:
			t, err := cpuTicks(tg.be.proc.pid())
			if err != nil {
				return 0, 0, err
			}
			store = float64(t) / float64(clk)
		}
		return rls, store, nil
	}
	opsStat := map[string]string{"redis": "ratelimit.redis.ops", "memcache": "ratelimit.memcache.ops"}[tg.store]
	ops := func() (float64, bool) {
		if opsStat == "" || tg.name != "this service" {
			return 0, false
		}
		return fetchStat(tg.svc.statsURL, opsStat)
	}
	ops0, haveOps := ops()
	rls0, store0, err := cpu()
	if err != nil {
		return h2grpcRun{}, err
	}
	dur := strconv.Itoa(int(o.duration.Seconds())) + "s"
	out, _, err := runH2load(ctx, h2load, "-c", strconv.Itoa(o.conns), "-m", strconv.Itoa(o.stream), "-D", dur,
		"-d", bodyPath, "-H", "content-type: application/grpc", "-H", "te: trailers",
		"http://"+tg.svc.grpcAddr+h2grpcPath)
	if err != nil {
		return h2grpcRun{}, err
	}
	rls1, store1, err := cpu()
	if err != nil {
		return h2grpcRun{}, err
	}
	var run h2grpcRun
	if run.reqPerSec, run.bad, err = parseH2load(out); err != nil {
		return run, err
	}
	calls := run.reqPerSec * o.duration.Seconds()
	if calls <= 0 {
		return run, fmt.Errorf("benchrun: %s %s answered no call", tg.name, tg.store)
	}
	run.rls = (rls1 - rls0) / calls * 1e6
	run.store = (store1 - store0) / calls * 1e6
	run.ops = -1
	if ops1, ok := ops(); ok && haveOps {
		run.ops = (ops1 - ops0) / calls
	}
	return run, nil
}

// h2grpcMarkdown renders the tables: per target the medians over the
// rounds and the fraction of the no-op server's rate, then this service
// against the anchor per store, each ratio taken within a round.
func h2grpcMarkdown(o h2grpcOptions, targets []*h2grpcTarget, results map[*h2grpcTarget][]h2grpcRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n_Generated by `%s` on %s, %s; h2load (nghttp2 %s), %d connections × %d streams (h2c), closed loop, one call with %s; %d rounds of %v, each round measuring every row once; medians over the rounds._\n\n",
		o.command, time.Now().UTC().Format("2006-01-02 15:04 MST"), machineInfo(), h2loadVersion(), o.conns, o.stream, callWords(o.descriptors), o.runs, o.duration)
	b.WriteString("| server | store | calls/s | of no-op | server CPU µs/call | store CPU µs/call | store ops/call | not 200 |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|\n")
	noop := results[targets[0]]
	for _, tg := range targets {
		runs := results[tg]
		var rate, rls, store, frac, ops []float64
		bad := 0
		for i, r := range runs {
			rate, rls, store = append(rate, r.reqPerSec), append(rls, r.rls), append(store, r.store)
			if r.ops >= 0 {
				ops = append(ops, r.ops)
			}
			frac = append(frac, r.reqPerSec/noop[i].reqPerSec)
			bad += r.bad
		}
		storeCol := "–"
		if tg.store != "" && tg.store != "memory" {
			storeCol = fmt.Sprintf("%.1f", median(store))
		}
		opsCol := "–"
		if len(ops) > 0 {
			opsCol = fmt.Sprintf("%.4g", median(ops))
		}
		st := tg.store
		if st == "" {
			st = "–"
		}
		name := tg.name
		if tg.variant != "" {
			name += ", " + tg.variant
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f%% | %.1f | %s | %s | %d |\n", name, st, median(rate), 100*median(frac), median(rls), storeCol, opsCol, bad)
	}
	var pairs [][2]*h2grpcTarget
	for i, tg := range targets {
		if tg.name != anchorVariant {
			continue
		}
		for _, ours := range targets[:i] {
			if ours.name == "this service" && ours.variant == "" && ours.store == tg.store {
				pairs = append(pairs, [2]*h2grpcTarget{ours, tg})
			}
		}
	}
	if len(pairs) == 0 {
		return b.String()
	}
	b.WriteString("\nThis service against envoyproxy/ratelimit, per round (median and range of the rounds' ratios):\n\n")
	b.WriteString("| store | calls/s, ours ÷ anchor | server CPU per call, anchor ÷ ours |\n|---|--:|--:|\n")
	for _, p := range pairs {
		ours, anchor := results[p[0]], results[p[1]]
		var rate, cpu []float64
		for i := range ours {
			rate = append(rate, ours[i].reqPerSec/anchor[i].reqPerSec)
			cpu = append(cpu, anchor[i].rls/ours[i].rls)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", p[0].store, ratioRange(rate), ratioRange(cpu))
	}
	return b.String()
}

// splitList is the non-empty, trimmed items of a comma-separated list.
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// callWords says what the call of n descriptors holds.
func callWords(n int) string {
	if n <= 1 {
		return "one descriptor (`user_id=user-1`, one counter)"
	}
	return fmt.Sprintf("%d descriptors (`user_id=user-1` ... `user-%d`, a counter each)", n, n)
}
