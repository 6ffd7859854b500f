// Command soak is the program behind `make soak`. It builds the service
// without -race, starts redis-server with a fault-injecting proxy in front
// of it (harness.Proxy), and runs the service on it for a bounded time
// under mixed traffic: two domains, every algorithm, hot keys over their
// limit, a limit override, and a spread of keys under their limits. Every
// -fault-every a store fault is injected for -fault-length, in turn: Redis
// killed and restarted, Redis frozen (SIGSTOP) and resumed, replies delayed
// past the request budget, replies cut mid-way. It then reports the
// requests, the errors by code and when they happened, the latency, the
// service's RSS, goroutines, open files and Redis connections at the start
// and the end, the recovery after each fault, and the accuracy of the
// fixed-window limits: outside the faults, every one-second window of each
// stream whose traffic is known admits exactly its limit.
//
//	go run ./tools/soak [-duration 2m] [-fault-every 20s] [-fault-length 3s]
//
// SOAK_DURATION sets the default of -duration. The exit status is 1 when
// the run shows a problem (an error outside a fault, a window admitting
// other than its limit, a slow recovery, a request waiting for its budget
// after the breaker opened, a leak, a panic). Linux only: it reads /proc.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv("SOAK_DURATION"), os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(rep.format())
	if problems := rep.problems(); len(problems) > 0 {
		fmt.Println("\nproblems:")
		for _, p := range problems {
			fmt.Println("  -", p)
		}
		os.Exit(1)
	}
}

// parseFlags reads the command line; duration is SOAK_DURATION's value.
func parseFlags(args []string, duration string, out io.Writer) (config, error) {
	cfg := defaultConfig()
	if duration != "" {
		d, err := time.ParseDuration(duration)
		if err != nil {
			return cfg, fmt.Errorf("soak: SOAK_DURATION: %w", err)
		}
		cfg.duration = d
	}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.DurationVar(&cfg.duration, "duration", cfg.duration, "how long the measured traffic runs (default from SOAK_DURATION)")
	fs.DurationVar(&cfg.faultEvery, "fault-every", cfg.faultEvery, "time between the starts of two faults")
	fs.DurationVar(&cfg.faultLength, "fault-length", cfg.faultLength, "how long each fault lasts")
	fs.DurationVar(&cfg.budget, "budget", cfg.budget, "the service's REQUEST_TIMEOUT")
	fs.IntVar(&cfg.background, "background", cfg.background, "senders of background traffic, each up to 200 requests a second")
	fs.StringVar(&cfg.binary, "binary", "", "the service binary to run (default: build ./cmd/ratelimit without -race)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
}
