// Command libtrial compares Redis clients on the store's fixed-window
// workload, for issue 15's library trial: the production store
// (src/store/redis, its own pipeline scheduler on go-redis), go-redis's
// automatic pipeliner (half-duplex and full-duplex) and rueidis. It lives
// in a module of its own so that the main module does not depend on
// rueidis; it drives a real redis-server (harness.LaunchRedis).
//
// Every round runs each variant in turn, in a rotating order, for -dur
// with -c concurrent callers, each call one decision over 1 or 3 keys
// (INCRBY and EXPIRE per key); the table gives medians over -runs rounds
// and, for throughput, the ratio to the production store taken in the
// same round. -outage then stops redis-server under load and starts it
// again, for each variant.
//
//	cd tools/libtrial && go run . -runs 3 -dur 3s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// variant is one client under trial.
type variant struct {
	name string
	make func(addr string, timeout time.Duration) (client, error)
}

var variants = []variant{
	{"ours (pipeline.go)", func(a string, t time.Duration) (client, error) { return newOurs(a, t, 0) }},
	// One pipeline in flight at a time, as go-redis's autopipeliner sends
	// by default: shows what the scheduler's parallel pipelines cost.
	{"ours, REDIS_POOL_SIZE=1", func(a string, t time.Duration) (client, error) { return newOurs(a, t, 1) }},
	{"go-redis autopipeline", func(a string, t time.Duration) (client, error) { return newGoredisAP(a, t, false) }},
	{"go-redis autopipeline, full duplex", func(a string, t time.Duration) (client, error) { return newGoredisAP(a, t, true) }},
	{"rueidis", newRueidis},
}

func main() {
	runs := flag.Int("runs", 3, "rounds; each runs every variant once")
	dur := flag.Duration("dur", 3*time.Second, "measured time of one variant in one round")
	conc := flag.Int("c", 64, "concurrent callers")
	keysFlag := flag.String("keys", "1,3", "keys per call, comma-separated")
	timeout := flag.Duration("timeout", 250*time.Millisecond, "request timeout, and each client's network timeout")
	outage := flag.Bool("outage", true, "run the outage trial after the throughput rounds")
	flag.Parse()
	var keyCounts []int
	for f := range strings.SplitSeq(*keysFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			fatal(fmt.Errorf("bad -keys %q", *keysFlag))
		}
		keyCounts = append(keyCounts, n)
	}
	dir, err := os.MkdirTemp("", "libtrial")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := harness.LaunchRedis(dir, harness.RedisOptions{Config: []string{"save \"\"", "appendonly no"}})
	if err != nil {
		fatal(err)
	}
	defer srv.Close()
	fmt.Fprintf(os.Stderr, "redis-server at %s; %d rounds of %v, c=%d\n", srv.Addr, *runs, *dur, *conc)

	clients := make([]client, len(variants))
	for i, v := range variants {
		if clients[i], err = v.make(srv.Addr, *timeout); err != nil {
			fatal(fmt.Errorf("%s: %w", v.name, err))
		}
	}
	// results[k][v] holds one sample per round.
	results := make([][][]sample, len(keyCounts))
	for k := range results {
		results[k] = make([][]sample, len(variants))
	}
	for round := range *runs {
		for k, nk := range keyCounts {
			for j := range variants {
				v := (j + round) % len(variants) // rotate the order
				l := load{srv: srv, cl: clients[v], conc: *conc, keys: nk, timeout: *timeout,
					prefix: "t" + strconv.Itoa(v) + "_" + strconv.Itoa(nk) + "_"}
				l.run(dur.Truncate(0) / 6) // warm up
				s := l.run(*dur)
				fmt.Fprintf(os.Stderr, "round %d keys %d %-36s %s\n", round+1, nk, variants[v].name, s)
				results[k][v] = append(results[k][v], s)
			}
		}
	}
	for _, c := range clients {
		c.close()
	}
	printTable(os.Stdout, keyCounts, results)
	if *outage {
		fmt.Println()
		outageTrial(os.Stdout, srv, *timeout)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "libtrial:", err)
	os.Exit(1)
}

// sample is one variant's measurement in one round.
type sample struct {
	decisions   int
	errors      int
	elapsed     time.Duration
	cpu         time.Duration // this process: callers and client
	redisCPU    time.Duration
	commands    int64 // Redis total_commands_processed
	reads       int64 // Redis total_reads_processed: read events, about one per pipeline received
	p50, p99    time.Duration
	cpuOK, rdOK bool
}

func (s sample) rate() float64 { return float64(s.decisions) / s.elapsed.Seconds() }

func (s sample) String() string {
	return fmt.Sprintf("%8.0f/s cpu %6.0fns/dec redis %6.0fns/dec p50 %v p99 %v reads/dec %.3f cmds/dec %.2f errors %d",
		s.rate(), s.perDecision(s.cpu), s.perDecision(s.redisCPU), s.p50, s.p99,
		float64(s.reads)/float64(max(s.decisions, 1)), float64(s.commands)/float64(max(s.decisions, 1)), s.errors)
}

func (s sample) perDecision(d time.Duration) float64 {
	return float64(d) / float64(max(s.decisions, 1))
}

// load is c concurrent callers of one client.
type load struct {
	srv     *harness.RedisServer
	cl      client
	conc    int
	keys    int
	timeout time.Duration
	prefix  string
}

// maxSamples bounds the latencies kept per caller.
const maxSamples = 1 << 16

// keySpace is the number of distinct keys a load cycles through.
const keySpace = 10_000

// run loads the client for d and measures.
func (l load) run(d time.Duration) sample {
	var s sample
	cpu0, okCPU := harness.ProcessCPU()
	st0, okStats := redisStats(l.srv)
	var next atomic.Uint64
	var errs atomic.Int64
	lat := make([][]time.Duration, l.conc)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for g := range l.conc {
		wg.Go(func() {
			c := &caller{keys: make([]string, l.keys)}
			mine := make([]time.Duration, 0, 1024)
			for time.Now().Before(deadline) {
				n := next.Add(1)
				for i := range c.keys {
					c.keys[i] = keyName(l.prefix, (n*uint64(l.keys)+uint64(i))%keySpace)
				}
				ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
				t := time.Now()
				err := l.cl.decide(ctx, c)
				el := time.Since(t)
				cancel()
				if err != nil {
					errs.Add(1)
					continue
				}
				if len(mine) < maxSamples {
					mine = append(mine, el)
				}
			}
			lat[g] = mine
		})
	}
	wg.Wait()
	s.elapsed = time.Since(start)
	cpu1, okCPU1 := harness.ProcessCPU()
	st1, okStats1 := redisStats(l.srv)
	s.cpuOK, s.rdOK = okCPU && okCPU1, okStats && okStats1
	s.cpu = cpu1 - cpu0
	s.redisCPU = st1.cpu - st0.cpu
	s.commands = st1.commands - st0.commands
	s.reads = st1.reads - st0.reads
	var all []time.Duration
	for _, m := range lat {
		s.decisions += len(m)
		all = append(all, m...)
	}
	// decisions past maxSamples per caller are not timed: count them all.
	s.decisions = int(next.Load()) - int(errs.Load())
	s.errors = int(errs.Load())
	slices.Sort(all)
	if len(all) > 0 {
		s.p50 = all[len(all)/2]
		s.p99 = all[len(all)*99/100]
	}
	return s
}

type stats struct {
	cpu             time.Duration
	commands, reads int64
}

// redisStats reads the counters of INFO stats and INFO cpu.
func redisStats(srv *harness.RedisServer) (stats, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := srv.Do(ctx, "INFO", "all")
	info, _ := v.(string)
	if err != nil || info == "" {
		return stats{}, false
	}
	var st stats
	var cpuSec float64
	for line := range strings.Lines(info) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(val, 64)
			cpuSec += f
		case "total_commands_processed":
			st.commands, _ = strconv.ParseInt(val, 10, 64)
		case "total_reads_processed":
			st.reads, _ = strconv.ParseInt(val, 10, 64)
		}
	}
	// INFO itself is a command and a read: one each per call.
	st.cpu = time.Duration(cpuSec * float64(time.Second))
	return st, true
}

// median returns the median of f over the samples.
func median(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func printTable(w io.Writer, keyCounts []int, results [][][]sample) {
	fmt.Fprintln(w, "| keys/call | client | decisions/s | × ours (same round) | client CPU µs/decision | Redis CPU µs/decision | p50 ms | p99 ms | Redis reads/decision | commands/decision | errors |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for k, nk := range keyCounts {
		base := results[k][0]
		for v, ss := range results[k] {
			ratio := make([]sample, 0, len(ss))
			for r, s := range ss {
				// one value per round: the ratio to ours in that round
				ratio = append(ratio, sample{decisions: int(1e6 * s.rate() / base[r].rate()), elapsed: time.Second})
			}
			errs := 0
			for _, s := range ss {
				errs += s.errors
			}
			fmt.Fprintf(w, "| %d | %s | %.0f | %.2f | %.1f | %.1f | %.2f | %.2f | %.3f | %.2f | %d |\n", nk, variants[v].name,
				median(ss, sample.rate),
				median(ratio, sample.rate)/1e6,
				median(ss, func(s sample) float64 { return s.perDecision(s.cpu) / 1e3 }),
				median(ss, func(s sample) float64 { return s.perDecision(s.redisCPU) / 1e3 }),
				median(ss, func(s sample) float64 { return float64(s.p50) / 1e6 }),
				median(ss, func(s sample) float64 { return float64(s.p99) / 1e6 }),
				median(ss, func(s sample) float64 { return float64(s.reads) / float64(max(s.decisions, 1)) }),
				median(ss, func(s sample) float64 { return float64(s.commands) / float64(max(s.decisions, 1)) }),
				errs)
		}
	}
}
