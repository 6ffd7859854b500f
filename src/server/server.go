// Package server wires the service together and owns its lifecycle: it
// turns settings into each package's Config, loads and watches the rules,
// opens the gRPC, HTTP and debug listeners, reports health and shuts down
// gracefully. Nothing imports it but cmd/ratelimit.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/provider"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// shutdownGrace bounds how long in-flight requests may take after SIGTERM.
const shutdownGrace = 10 * time.Second

// Server is a running rate-limit service.
type Server struct {
	set    *settings.Settings
	log    *slog.Logger
	stats  *stats.Registry
	health *Health
	svc    *service.Service
	store  *backend

	grpc       *grpc.Server
	httpSrv    *http.Server
	debugSrv   *http.Server
	promSrv    *http.Server
	grpcLn     net.Listener
	httpLn     net.Listener
	debugLn    net.Listener
	promLn     net.Listener
	rulesFiles provider.FileConfig
	// watcher is the rules' provider: a *provider.Watcher or, with
	// CONFIG_TYPE=GRPC_XDS_SOTW, a *provider.XDSWatcher.
	watcher   interface{ Wait() }
	stopWatch context.CancelFunc
}

// New builds a server from settings: it loads the rules (an invalid rules
// directory is an error unless FORCE_START_WITHOUT_INITIAL_CONFIG is set;
// from an xDS server, it waits for the first valid rules unless that is
// set), connects the store and opens the listeners. It does not serve yet.
func New(ctx context.Context, set *settings.Settings, log *slog.Logger) (*Server, error) {
	s := &Server{set: set, log: log, stats: stats.NewRegistry(), health: NewHealth()}

	b, err := newBackend(ctx, set, s.stats, log)
	if err != nil {
		return nil, err
	}
	s.store = b

	s.rulesFiles = provider.FileConfig{
		Root:           set.RulesRoot(),
		Subdirectory:   set.RuntimeSubdirectory,
		AppDirectory:   set.RuntimeAppDirectory,
		IgnoreDotFiles: set.RuntimeIgnoreDotFiles,
		Recheck:        set.RuntimeRecheckInterval,

		QuietPeriod:      set.RuntimeQuietPeriod,
		AllowEmptyReload: set.RuntimeAllowEmptyReload,
		Options: rules.Options{
			MergeDomains: set.MergeDomainConfig,
			Supports:     b.supports,
			StoreName:    set.BackendType,
		},
	}

	lim := limiter.New(b.store, limiter.Config{
		Prefix:                     set.CacheKeyPrefix,
		KeyFormat:                  b.keyFormat,
		NearLimitRatio:             set.NearLimitRatio,
		StopIncrementWhenOverLimit: set.StopCacheKeyIncrementWhenOverlimit,
		NearCache:                  limiter.NewNearCache(set.LocalCacheSizeInBytes),
	})
	s.svc = service.New(lim, s.stats, service.Config{
		GlobalShadowMode: set.ShadowMode,
		GlobalQuotaMode:  set.QuotaMode,
		Headers: service.Headers{
			Enabled:   set.LimitResponseHeadersEnabled,
			Limit:     set.LimitLimitHeader,
			Remaining: set.LimitRemainingHeader,
			Reset:     set.LimitResetHeader,
		},
		DynamicMetadata:    set.ResponseDynamicMetadata,
		Timeout:            b.budget(set.RequestTimeout),
		MaxConcurrent:      set.MaxConcurrentRequests,
		MaxDynamicStatKeys: set.StatsMaxDynamicKeys,
		Log:                log,
	})

	if set.ConfigType == settings.ConfigTypeXDS {
		err = s.watchXDS(ctx)
	} else {
		err = s.watchRules()
	}
	if err != nil {
		b.close()
		return nil, err
	}

	if err := s.listen(); err != nil {
		s.stopWatch()
		s.watcher.Wait()
		b.close()
		return nil, err
	}
	return s, nil
}

// watchRules starts watching the rules directory. The watcher loads the
// rules once before it returns; an invalid first load is an error unless
// FORCE_START_WITHOUT_INITIAL_CONFIG is set, in which case the server starts
// unhealthy and the watcher keeps trying. Later failures keep the rules in use.
func (s *Server) watchRules() error {
	var ctx context.Context
	ctx, s.stopWatch = context.WithCancel(context.Background())
	var started atomic.Bool
	var initial error
	w, err := provider.Watch(ctx, s.rulesFiles, s.setRules, func(err error) {
		s.stats.Counter("ratelimit.service.config_load_error").Inc()
		if !started.Load() {
			initial = err // reported synchronously, before Watch returns
			return
		}
		s.log.Error("rules reload failed; keeping the rules in use", "err", err)
	})
	started.Store(true)
	if err == nil && initial != nil && !s.set.ForceStartWithoutInitialConfig {
		w.Close()
		w.Wait()
		err = initial
	}
	if err != nil {
		s.stopWatch()
		return err
	}
	if initial != nil {
		s.log.Error("invalid rules at startup; serving unhealthy until valid rules load", "err", initial)
	}
	s.watcher = w
	return nil
}

// watchXDS subscribes to the rules of the xDS server. Without
// FORCE_START_WITHOUT_INITIAL_CONFIG it returns once the first valid rules
// are in use, as envoyproxy/ratelimit waits for them before serving: the
// ports stay closed meanwhile, and refused updates are NACKed and logged.
// With it, it returns at once and the server starts unhealthy until then.
// Lost connections and refused updates keep the rules in use.
func (s *Server) watchXDS(ctx context.Context) error {
	md, err := s.set.XDSNodeMetadata()
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	cfg := provider.XDSConfig{
		ServerURL:    s.set.ConfigGRPCXDSServerURL,
		NodeID:       s.set.ConfigGRPCXDSNodeID,
		NodeMetadata: md,
		Headers:      s.set.ConfigGRPCXDSClientAdditionalHeaders,
		Backoff: provider.Backoff{
			Initial:      s.set.XDSClientBackoffInitialInterval,
			Max:          s.set.XDSClientBackoffMaxInterval,
			RandomFactor: s.set.XDSClientBackoffRandomFactor,
			Jitter:       s.set.XDSClientBackoffJitter,
		},
		MaxMessageBytes: s.set.XDSClientMaxMsgSizeInBytes,
		Options:         s.rulesFiles.Options,
	}
	if s.set.ConfigGRPCXDSServerUseTLS {
		cfg.TLS = &provider.XDSTLS{
			CertFile:   s.set.ConfigGRPCXDSClientTLSCert,
			KeyFile:    s.set.ConfigGRPCXDSClientTLSKey,
			CAFile:     s.set.ConfigGRPCXDSServerTLSCACert,
			ServerName: s.set.ConfigGRPCXDSServerTLSSAN,
		}
	}
	var wctx context.Context
	wctx, s.stopWatch = context.WithCancel(context.Background())
	loaded := make(chan struct{})
	var once sync.Once
	w, err := provider.WatchXDS(wctx, cfg, func(c *rules.Config) {
		s.setRules(c)
		once.Do(func() { close(loaded) })
	}, func(err error) {
		if errors.Is(err, provider.ErrXDSConnection) {
			s.log.Warn("no connection to the xDS server; keeping the rules in use", "err", err)
			return
		}
		s.stats.Counter("ratelimit.service.config_load_error").Inc()
		s.log.Error("rules from the xDS server refused (NACK); keeping the rules in use", "err", err)
	})
	if err != nil {
		s.stopWatch()
		return err
	}
	s.watcher = w
	if s.set.ForceStartWithoutInitialConfig {
		return nil
	}
	s.log.Info("waiting for the first rules from the xDS server", "server", cfg.ServerURL, "node", cfg.NodeID)
	select {
	case <-loaded:
		return nil
	case <-ctx.Done():
		s.stopWatch()
		w.Wait()
		return fmt.Errorf("server: stopped while waiting for the first rules from the xDS server %s: %w", cfg.ServerURL, ctx.Err())
	}
}

func (s *Server) setRules(cfg *rules.Config) {
	s.svc.SetRules(cfg)
	s.stats.Counter("ratelimit.service.config_load_success").Inc()
	s.health.SetRules(!s.set.HealthyWithAtLeastOneConfigLoaded || !cfg.Empty())
	s.log.Info("rules loaded", "domains", cfg.Domains())
}

func (s *Server) listen() error {
	var err error
	if s.set.GRPCUDS != "" {
		_ = os.Remove(s.set.GRPCUDS)
		s.grpcLn, err = net.Listen("unix", s.set.GRPCUDS)
	} else {
		s.grpcLn, err = net.Listen("tcp", net.JoinHostPort(s.set.GRPCHost, fmt.Sprint(s.set.GRPCPort)))
	}
	if err != nil {
		return fmt.Errorf("server: grpc listener: %w", err)
	}
	s.httpLn, err = net.Listen("tcp", net.JoinHostPort(s.set.Host, fmt.Sprint(s.set.Port)))
	if err != nil {
		s.grpcLn.Close()
		return fmt.Errorf("server: http listener: %w", err)
	}
	s.debugLn, err = net.Listen("tcp", net.JoinHostPort(s.set.DebugHost, fmt.Sprint(s.set.DebugPort)))
	if err != nil {
		s.grpcLn.Close()
		s.httpLn.Close()
		return fmt.Errorf("server: debug listener: %w", err)
	}

	if s.set.UsePrometheus {
		s.promLn, err = net.Listen("tcp", s.set.PrometheusAddr)
		if err != nil {
			s.grpcLn.Close()
			s.httpLn.Close()
			s.debugLn.Close()
			return fmt.Errorf("server: prometheus listener: %w", err)
		}
		pmux := http.NewServeMux()
		pmux.Handle(s.set.PrometheusPath, s.stats.Handler())
		s.promSrv = &http.Server{Handler: pmux, ReadHeaderTimeout: 10 * time.Second}
	}

	opts := append(grpcOptions(s.set, s.recoverUnary),
		grpc.InTapHandle(s.svc.Tap),
		grpc.ForceServerCodecV2(service.Codec()))
	s.grpc = grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, s.svc)
	healthpb.RegisterHealthServer(s.grpc, s.health.grpc)
	reflection.Register(s.grpc)

	mux := http.NewServeMux()
	mux.Handle("/healthcheck", s.health)
	mux.HandleFunc("/json", s.svc.ServeJSON)
	s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	dmux := http.NewServeMux()
	dmux.HandleFunc("/rlconfig", s.serveRulesDump)
	dmux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = s.stats.WriteText(w)
	})
	dmux.Handle("/metrics", s.stats.Handler())
	dmux.HandleFunc("/debug/pprof/", pprof.Index)
	dmux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	dmux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	dmux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	dmux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	dmux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "/rlconfig: the rules in use\n/stats: counters as text\n/metrics: counters for Prometheus\n/debug/pprof/: profiles")
	})
	s.debugSrv = &http.Server{Handler: dmux, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

func (s *Server) serveRulesDump(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	cfg := s.svc.Rules()
	if cfg == nil {
		fmt.Fprintln(w, "no rules loaded")
		return
	}
	fmt.Fprint(w, cfg.Dump())
}

// grpcOptions are the gRPC server's options from the settings.
func grpcOptions(set *settings.Settings, intercept grpc.UnaryServerInterceptor) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      set.GRPCMaxConnectionAge,
			MaxConnectionAgeGrace: set.GRPCMaxConnectionAgeGrace,
		}),
		grpc.ChainUnaryInterceptor(intercept),
		grpc.ReadBufferSize(set.GRPCReadBufferSize),
		grpc.WriteBufferSize(set.GRPCWriteBufferSize),
		// grpc-go now shares write buffers by default and deprecates the
		// option; GRPC_SHARED_WRITE_BUFFER keeps the default it was
		// measured with (false: docs/BENCHMARKS.md) until measured again.
		//lint:ignore SA1019 see above
		grpc.SharedWriteBuffer(set.GRPCSharedWriteBuffer),
	}
	workers := set.GRPCNumStreamWorkers
	if workers < 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if workers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(workers)))
	}
	return opts
}

// recoverUnary turns a panic in a handler into codes.Internal, logs it and
// counts it, so that a bug never takes the process down.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.stats.Counter("ratelimit.server.panics").Inc()
			s.log.Error("panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, status.Errorf(codes.Internal, "internal error: %v", r)
		}
	}()
	return handler(ctx, req)
}

// Addrs are the addresses the server listens on (useful with port 0).
type Addrs struct{ GRPC, HTTP, Debug net.Addr }

// Addrs returns the listeners' addresses.
func (s *Server) Addrs() Addrs {
	return Addrs{GRPC: s.grpcLn.Addr(), HTTP: s.httpLn.Addr(), Debug: s.debugLn.Addr()}
}

// Health returns the server's health state.
func (s *Server) Health() *Health { return s.health }

// Run serves until ctx is done, then shuts down gracefully: health turns
// NOT_SERVING, in-flight requests finish (within a grace period) and
// listeners close. It returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, 5)
	serve := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("server: %s: %w", name, err)
			}
		}()
	}
	serve("grpc", func() error { return s.grpc.Serve(s.grpcLn) })
	serve("http", func() error { return s.httpSrv.Serve(s.httpLn) })
	serve("debug", func() error { return s.debugSrv.Serve(s.debugLn) })
	if s.promSrv != nil {
		serve("prometheus", func() error { return s.promSrv.Serve(s.promLn) })
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.store.watchHealth(ctx, s.health)
	}()
	if s.store.started != nil && s.set.RedisStartupMaxElapsedTime > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, s.set.RedisStartupMaxElapsedTime)
			defer cancel()
			if err := s.store.started(sctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("server: the store did not answer within REDIS_STARTUP_MAX_ELAPSED_TIME (%v): %w", s.set.RedisStartupMaxElapsedTime, err)
			}
		}()
	}
	s.log.Info("serving", "grpc", s.grpcLn.Addr().String(), "http", s.httpLn.Addr().String(), "debug", s.debugLn.Addr().String(), "backend", s.set.BackendType)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.log.Info("shutting down")
	s.health.Shutdown()
	cancel()

	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(shutdownGrace)
	select {
	case <-stopped:
	case <-timer.C:
		s.grpc.Stop()
	}
	timer.Stop()
	sctx, scancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer scancel()
	_ = s.httpSrv.Shutdown(sctx)
	_ = s.debugSrv.Shutdown(sctx)
	if s.promSrv != nil {
		_ = s.promSrv.Shutdown(sctx)
	}
	s.stopWatch()
	s.watcher.Wait()
	wg.Wait()
	s.store.close()
	if s.set.GRPCUDS != "" {
		_ = os.Remove(filepath.Clean(s.set.GRPCUDS))
	}
	return runErr
}
