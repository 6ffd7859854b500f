// Command ratelimit-bench is a gRPC load generator for any Envoy rate-limit
// service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit). It
// keeps -c requests in flight over -conns connections for -d (or -n requests)
// after -warmup, and reports requests/s, latency percentiles and the count of
// OK, OVER_LIMIT and errors by gRPC code.
//
//	ratelimit-bench -addr 127.0.0.1:8081 -domain bench -c 64 -d 10s \
//	    -descriptors 'user_id=user-{0..9999}'
//	ratelimit-bench -calibrate -c 64 -d 5s   # the gRPC ceiling of this machine
//	ratelimit-bench -calibrate -addr 127.0.0.1:8081 -d 10s   # and -addr as a fraction of it
//
// The ceiling is a no-op RLS server with the service's gRPC tuning (64
// stream workers), measured under the same load just before -addr; the same
// server with grpc-go's defaults, measured before it, is reported beside it.
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
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimit/loadgen"
)

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-bench:", err)
		os.Exit(1)
	}
}

// paired is the JSON output of -calibrate with -addr: the target's result,
// the ceilings', and the target's as a fraction of them.
type paired struct {
	Result *loadgen.Result `json:"result"`
	// Ceiling is the no-op server with the service's gRPC tuning
	// (loadgen.ServiceTuning); UntunedCeiling the same with grpc-go's
	// defaults.
	Ceiling        *loadgen.Result `json:"ceiling"`
	UntunedCeiling *loadgen.Result `json:"untuned_ceiling"`
	// OfCeilingRPS is requests/s ÷ the ceiling's; P99OfCeiling is p99 ÷
	// the ceiling's p99; OfUntunedCeilingRPS is requests/s ÷ the untuned
	// ceiling's.
	OfCeilingRPS        float64 `json:"of_ceiling_rps"`
	P99OfCeiling        float64 `json:"p99_of_ceiling"`
	OfUntunedCeilingRPS float64 `json:"of_untuned_ceiling_rps"`
}

// calibration is the JSON output of -calibrate without -addr.
type calibration struct {
	Ceiling        *loadgen.Result `json:"ceiling"`
	UntunedCeiling *loadgen.Result `json:"untuned_ceiling"`
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	measure := func(target string) (*loadgen.Result, error) {
		dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		client, err := loadgen.Dial(dialCtx, target, min(o.conns, o.load.Concurrency))
		cancel()
		if err != nil {
			return nil, err
		}
		defer client.Close()
		res, err := client.Run(ctx, o.load)
		if res != nil && err != nil {
			fmt.Fprintln(stderr, "ratelimit-bench: interrupted; partial result:")
		}
		return res, err
	}
	if !o.calibrate {
		res, err := measure(o.addr)
		if res == nil {
			return err
		}
		return report(stdout, o.asJSON, "", res)
	}
	return calibrated(o, measure, stdout)
}

// options are the command line's.
type options struct {
	addr       string
	addrSet    bool
	conns      int
	asJSON     bool
	calibrate  bool
	cpuprofile string
	load       loadgen.Load
}

// parseFlags reads and checks the command line.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("ratelimit-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var (
		c        = fs.Int("c", 64, "concurrent requests in flight")
		d        = fs.Duration("d", 10*time.Second, "measured `duration` (with -n: stop at whichever comes first)")
		n        = fs.Int64("n", 0, "measured requests; when set without -d, the run is bounded by count only")
		warmup   = fs.Duration("warmup", time.Second, "warm-up before measuring; its requests are not counted")
		domain   = fs.String("domain", "bench", "request domain")
		hits     = fs.Uint("hits", 0, "hits_addend of each request; 0 leaves it unset (the server counts 1)")
		override = fs.String("override", "", "a limit override on every descriptor, `N/unit` (e.g. 100/hour): the server applies it instead of its rules")
		timeout  = fs.Duration("timeout", time.Second, "deadline of each request; 0 for none")
		descs    listFlag
	)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "`host:port` of the RLS v3 gRPC server")
	fs.IntVar(&o.conns, "conns", 4, "gRPC connections; requests spread over them round robin")
	fs.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	fs.BoolVar(&o.calibrate, "calibrate", false, "first run the same load against in-process no-op RLS servers (grpc-go's defaults, then the service's gRPC tuning: the ceiling of this machine), then against -addr, and report -addr's figures as fractions of theirs; without -addr, measure only the no-op servers")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of this process (generator, and the no-op server with -calibrate) to `file`")
	fs.Var(&descs, "descriptors", "descriptor `template`, e.g. 'user_id=user-{0..9999}' or 'a=x,b=y-{0..9},c=z' (repeatable; default user_id=user-{0..9999})")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ratelimit-bench [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	dSet := false
	fs.Visit(func(f *flag.Flag) {
		dSet = dSet || f.Name == "d"
		o.addrSet = o.addrSet || f.Name == "addr"
	})
	if *n > 0 && !dSet {
		*d = 0
	}
	if *hits > 1<<32-1 {
		return nil, fmt.Errorf("-hits %d does not fit in 32 bits", *hits)
	}
	if len(descs) == 0 {
		descs = listFlag{"user_id=user-{0..9999}"}
	}
	ov, err := parseOverride(*override)
	if err != nil {
		return nil, err
	}
	if *c < 1 || o.conns < 1 {
		return nil, errors.New("-c and -conns must be at least 1")
	}
	o.load = loadgen.Load{
		Domain:      *domain,
		Descriptors: descs,
		Hits:        uint32(*hits),
		Override:    ov,
		Concurrency: *c,
		Requests:    *n,
		Duration:    *d,
		Warmup:      *warmup,
		Timeout:     *timeout,
	}
	return o, nil
}

// calibrated measures the no-op servers (grpc-go's defaults, then the
// service's tuning: the ceiling) and then -addr, and reports -addr's
// figures as fractions of theirs; without -addr, the no-op servers only.
func calibrated(o *options, measure func(string) (*loadgen.Result, error), stdout io.Writer) error {
	// The untuned no-op first, then the tuned one (the ceiling) just
	// before the target, so that the pair compared is the closest.
	untuned, err := measureNoop(measure, loadgen.Tuning{})
	if untuned == nil {
		return err
	}
	var ceiling *loadgen.Result
	if err == nil {
		ceiling, err = measureNoop(measure, loadgen.ServiceTuning)
	}
	if ceiling == nil {
		return report(stdout, o.asJSON, "calibrate    in-process no-op RLS v3 server, grpc-go's defaults", untuned)
	}
	if err != nil || !o.addrSet {
		if o.asJSON {
			return encodeJSON(stdout, calibration{Ceiling: ceiling, UntunedCeiling: untuned})
		}
		if err := report(stdout, false, "calibrate    in-process no-op RLS v3 server, the service's gRPC tuning (the ceiling)", ceiling); err != nil {
			return err
		}
		return report(stdout, false, "untuned      the same with grpc-go's defaults", untuned)
	}
	res, err := measure(o.addr)
	if res == nil {
		return err
	}
	return reportPaired(stdout, o.asJSON, res, ceiling, untuned)
}

// reportPaired reports res with its fractions of the no-op servers'.
func reportPaired(stdout io.Writer, asJSON bool, res, ceiling, untuned *loadgen.Result) error {
	p := paired{Result: res, Ceiling: ceiling, UntunedCeiling: untuned,
		OfCeilingRPS: ratio(res.RPS(), ceiling.RPS()), OfUntunedCeilingRPS: ratio(res.RPS(), untuned.RPS()),
		P99OfCeiling: ratio(float64(res.Latency.P99), float64(ceiling.Latency.P99))}
	if asJSON {
		if math.IsNaN(p.OfCeilingRPS) || math.IsNaN(p.P99OfCeiling) || math.IsNaN(p.OfUntunedCeilingRPS) {
			return errors.New("the ceiling run answered nothing: no fraction to report")
		}
		return encodeJSON(stdout, p)
	}
	if err := res.WriteText(stdout); err != nil {
		return err
	}
	_, err := fmt.Fprintf(stdout, "ceiling      in-process no-op RLS v3 server with the service's gRPC tuning, same load just before: %.0f req/s, p99 %s\n"+
		"of ceiling   %.0f%% of its requests/s, %.2f× its p99\n"+
		"untuned      the same no-op server with grpc-go's defaults: %.0f req/s, p99 %s; %.0f%% of its requests/s\n",
		ceiling.RPS(), loadgen.FormatDuration(ceiling.Latency.P99), 100*p.OfCeilingRPS, p.P99OfCeiling,
		untuned.RPS(), loadgen.FormatDuration(untuned.Latency.P99), 100*p.OfUntunedCeilingRPS)
	return err
}

// measureNoop measures an in-process no-op server with tuning t.
func measureNoop(measure func(string) (*loadgen.Result, error), t loadgen.Tuning) (*loadgen.Result, error) {
	srv, err := loadgen.StartNoopTuned("127.0.0.1:0", t)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	return measure(srv.Addr())
}

// ratio is a / b, NaN when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

// report prints one result, as text under an optional title line, or JSON.
func report(w io.Writer, asJSON bool, title string, res *loadgen.Result) error {
	if asJSON {
		return encodeJSON(w, res)
	}
	if title != "" {
		if _, err := fmt.Fprintln(w, title); err != nil {
			return err
		}
	}
	return res.WriteText(w)
}

func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseOverride reads -override's "N/unit"; "" is no override.
func parseOverride(s string) (*ratelimitv3.RateLimitDescriptor_RateLimitOverride, error) {
	if s == "" {
		return nil, nil
	}
	n, unit, ok := strings.Cut(s, "/")
	rpu, err := strconv.ParseUint(n, 10, 32)
	u, known := typev3.RateLimitUnit_value[strings.ToUpper(unit)]
	if !ok || err != nil || !known || u == 0 {
		return nil, fmt.Errorf("-override %q: want N/unit, e.g. 100/hour", s)
	}
	return &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(rpu), Unit: typev3.RateLimitUnit(u)}, nil
}
