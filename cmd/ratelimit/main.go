// Command ratelimit is the rate-limit service: Envoy's RateLimitService v3
// over gRPC, with /json and /healthcheck over HTTP. Settings come from the
// environment (see the README); rules from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
// RUNTIME_APPDIRECTORY, which defaults to ./config.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratelimitd/ratelimit/src/gctune"
	"github.com/ratelimitd/ratelimit/src/server"
	"github.com/ratelimitd/ratelimit/src/settings"
)

func main() {
	os.Exit(run())
}

func run() int {
	set, err := settings.Load()
	if err != nil {
		// LOG_FORMAT may itself be what is wrong; honour it when it says
		// json, so that even this first line is one a log pipeline parses.
		if settings.JSONLogsRequested() {
			server.NewLogger(os.Stderr, "error", "json").Error("invalid settings", "err", err)
		} else {
			fmt.Fprintln(os.Stderr, err)
		}
		return 2
	}
	log := server.NewLogger(os.Stderr, set.LogLevel, set.LogFormat)
	for _, w := range set.Warnings() {
		log.Warn(w.Message(), "setting", w.Name, "why", w.Why)
	}
	if v := set.BackendInferred(); v != "" {
		log.Info("BACKEND_TYPE is not set and "+v+" is: the store is Redis, as with envoyproxy/ratelimit", "backend", set.BackendType)
	}
	defer gctune.Start(uint64(set.GCHeadroomBytes))()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	srv, err := server.New(ctx, set, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	if err := srv.Run(ctx); err != nil {
		log.Error("stopped with an error", "err", err)
		return 1
	}
	return 0
}
