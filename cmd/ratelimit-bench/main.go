// Command ratelimit-bench is a gRPC load generator for any Envoy rate-limit
// service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit). It
// keeps -c requests in flight over -conns connections for -d (or -n requests)
// after -warmup, and reports requests/s, latency percentiles and the count of
// OK, OVER_LIMIT and errors by gRPC code.
//
//	ratelimit-bench -addr 127.0.0.1:8081 -domain bench -c 64 -d 10s \
//	    -descriptors 'user_id=user-{0..9999}'
//	ratelimit-bench -calibrate -c 64 -d 5s   # the gRPC ceiling of this machine
//
// A descriptor template is a comma-separated chain of key=value entries in
// which each {lo..hi} is replaced per request by a uniformly random integer;
// repeat -descriptors for several descriptors per request.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimit/cmd/ratelimit-bench/bench"
)

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		addr      = flag.String("addr", "127.0.0.1:8081", "`host:port` of the RLS v3 gRPC server")
		c         = flag.Int("c", 64, "concurrent requests in flight")
		conns     = flag.Int("conns", 4, "gRPC connections; requests spread over them round robin")
		d         = flag.Duration("d", 10*time.Second, "measured `duration` (with -n: stop at whichever comes first)")
		n         = flag.Int64("n", 0, "measured requests; when set without -d, the run is bounded by count only")
		warmup    = flag.Duration("warmup", time.Second, "warm-up before measuring; its requests are not counted")
		domain    = flag.String("domain", "bench", "request domain")
		hits      = flag.Uint("hits", 0, "hits_addend of each request; 0 leaves it unset (the server counts 1)")
		asJSON    = flag.Bool("json", false, "print the result as JSON")
		calibrate = flag.Bool("calibrate", false, "benchmark an in-process no-op RLS server instead of -addr: the gRPC ceiling")
		timeout   = flag.Duration("timeout", time.Second, "deadline of each request; 0 for none")
		cpuprof   = flag.String("cpuprofile", "", "write a CPU profile of this process (generator, and the no-op server with -calibrate) to `file`")
		descs     listFlag
	)
	flag.Var(&descs, "descriptors", "descriptor `template`, e.g. 'user_id=user-{0..9999}' or 'a=x,b=y-{0..9},c=z' (repeatable; default user_id=user-{0..9999})")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: ratelimit-bench [flags]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	dSet := false
	flag.Visit(func(f *flag.Flag) { dSet = dSet || f.Name == "d" })
	if *n > 0 && !dSet {
		*d = 0
	}
	if *hits > 1<<32-1 {
		return fmt.Errorf("-hits %d does not fit in 32 bits", *hits)
	}
	if len(descs) == 0 {
		descs = listFlag{"user_id=user-{0..9999}"}
	}
	if *c < 1 || *conns < 1 {
		return errors.New("-c and -conns must be at least 1")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	target := *addr
	if *calibrate {
		srv, err := bench.StartNoop("127.0.0.1:0")
		if err != nil {
			return err
		}
		defer srv.Stop()
		target = srv.Addr()
	}
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	client, err := bench.Dial(dialCtx, target, min(*conns, *c))
	cancel()
	if err != nil {
		return err
	}
	defer client.Close()

	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := client.Run(ctx, bench.Load{
		Domain:      *domain,
		Descriptors: descs,
		Hits:        uint32(*hits),
		Concurrency: *c,
		Requests:    *n,
		Duration:    *d,
		Warmup:      *warmup,
		Timeout:     *timeout,
	})
	if res == nil {
		return err
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-bench: interrupted; partial result:")
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if *calibrate {
		fmt.Println("calibrate    in-process no-op RLS v3 server (the gRPC ceiling)")
	}
	return res.WriteText(os.Stdout)
}
