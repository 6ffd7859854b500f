// Command ratelimit is the rate-limit service: Envoy's RateLimitService v3
// over gRPC, with /json and /healthcheck over HTTP. Settings come from the
// environment (see docs/SETTINGS.md); rules from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
// RUNTIME_APPDIRECTORY, which defaults to ./config.
//
//	ratelimit                serve
//	ratelimit -version       print the version and exit
//	ratelimit -healthcheck   ask the running service's /healthcheck; exit 0 healthy, 1 not
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/ratelimitd/ratelimit/src/gctune"
	"github.com/ratelimitd/ratelimit/src/server"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// version is stamped at build time with -ldflags "-X main.version=..." (the
// Makefile and the Dockerfile do). Unstamped, it falls back to the module
// version the Go toolchain recorded (go install ...@v1.2.3), else "dev".
var version = ""

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes: 0 stopped cleanly (or healthy, for -healthcheck), 1 failed
// (or unhealthy), 2 bad usage or settings.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	printVersion := fs.Bool("version", false, "print the version and exit")
	healthcheck := fs.Bool("healthcheck", false,
		"GET http://127.0.0.1:$PORT/healthcheck of the running service and exit 0 if it answers 200, else 1 (a health check for images without a shell)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ratelimit: unexpected argument %q: settings come from the environment\n", fs.Arg(0))
		return exitUsage
	}
	if *printVersion {
		fmt.Fprintln(stdout, "ratelimit", buildVersion())
		return exitOK
	}

	set, err := settings.Load()
	if err != nil {
		// LOG_FORMAT may itself be what is wrong; honour it when it says
		// json, so that even this first line is one a log pipeline parses.
		if settings.JSONLogsRequested() {
			server.NewLogger(stderr, "error", "json").Error("invalid settings", "err", err)
		} else {
			fmt.Fprintln(stderr, err)
		}
		return exitUsage
	}
	if *healthcheck {
		return probe(healthURL(set), stderr)
	}
	return serve(set, stderr)
}

func serve(set *settings.Settings, stderr io.Writer) int {
	log := server.NewLogger(stderr, set.LogLevel, set.LogFormat)
	for _, w := range set.Warnings() {
		log.Warn(w.Message(), "setting", w.Name, "why", w.Why)
	}
	if v := set.BackendInferred(); v != "" {
		log.Info("BACKEND_TYPE is not set and "+v+" is: the store is Redis, as with envoyproxy/ratelimit", "backend", set.BackendType)
	}
	defer gctune.Start(uint64(set.GCHeadroomBytes))()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// SIGHUP reloads the rules and the certificates now, as operators
	// expect of a server: it never ends the process, not even during the
	// start (one that comes then is handled once the server runs).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv, err := server.New(ctx, set, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return exitFail
	}
	go func() {
		for {
			select {
			case <-hup:
				srv.Reload()
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := srv.Run(ctx); err != nil {
		log.Error("stopped with an error", "err", err)
		return exitFail
	}
	return exitOK
}

// buildVersion is version, or what the toolchain recorded, or "dev".
func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// healthURL is the /healthcheck address of the service that runs with the
// same settings: its HOST, or loopback when HOST is every interface (the
// default), which a container's own health check always reaches.
func healthURL(set *settings.Settings) string {
	host := set.Host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(set.Port)) + "/healthcheck"
}

// probeTimeout bounds the whole health check, well below the 30 s default
// timeout of Docker's HEALTHCHECK and Kubernetes' exec probes' usual ones,
// so that a hung service is reported as unhealthy, not as a timed-out probe.
const probeTimeout = 3 * time.Second

// probe GETs url and returns exitOK on 200, exitFail otherwise, saying why
// on stderr (Docker keeps the output of the last health checks).
func probe(url string, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit: healthcheck:", err)
		return exitFail
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v", probeTimeout)
		}
		fmt.Fprintf(stderr, "ratelimit: healthcheck %s: %v\n", url, err)
		return exitFail
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "ratelimit: healthcheck %s: %s %s\n", url, resp.Status, body)
		return exitFail
	}
	return exitOK
}
