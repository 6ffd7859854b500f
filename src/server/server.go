// Package server wires the service together and owns its lifecycle: it
// turns settings into each package's Config, loads and watches the rules,
// opens the gRPC, HTTP and debug listeners, reports health and shuts down
// gracefully. Nothing imports it but cmd/ratelimit.
package server

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/live/web"
	"github.com/ratelimitd/ratelimit/src/provider"
	"github.com/ratelimitd/ratelimit/src/quota"
	"github.com/ratelimitd/ratelimit/src/rlqs"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/server/listen"
	"github.com/ratelimitd/ratelimit/src/service"
	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/wire"
)

// shutdownDrain bounds the whole shutdown after SIGTERM: in-flight requests
// finish within it, and the store's close gets what is left of it.
const shutdownDrain = 10 * time.Second

// traceFlushMax bounds the last export of spans at shutdown, within the
// drain: a collector that answers takes milliseconds, and one that is
// down or never answers must not hold every shutdown for the whole drain
// (the gRPC exporter retries a refused connection until its deadline).
const traceFlushMax = 2 * time.Second

// Server is a running rate-limit service.
type Server struct {
	set    *settings.Settings
	log    *slog.Logger
	stats  *stats.Registry
	health *Health
	svc    *service.Service
	store  *storeHandle
	// storeHealth reports the store's health to health.
	storeHealth *storeHealth
	// statsd sends the statistics to statsd or DogStatsD; nil when the
	// settings ask for neither.
	statsd *stats.Statsd
	// tracing exports spans; nil with TRACING_ENABLED=false.
	tracing *tracing
	// metrics serves the statistics for Prometheus, on PROMETHEUS_ADDR and
	// the debug port's /metrics alike.
	metrics http.Handler
	// rulesLoaded is the Unix time of the last rules that loaded.
	rulesLoaded *stats.Gauge

	grpc     *grpc.Server
	httpSrv  *http.Server
	debugSrv *http.Server
	promSrv  *http.Server
	grpcLn   net.Listener
	httpLn   net.Listener
	debugLn  net.Listener
	promLn   net.Listener
	// drain is shutdownDrain; tests shorten it.
	drain      time.Duration
	rulesFiles provider.FileConfig
	// watcher is the rules' provider: a *provider.Watcher or, with
	// CONFIG_TYPE=GRPC_XDS_SOTW, a *provider.XDSWatcher.
	watcher   interface{ Wait() }
	stopWatch context.CancelFunc
	// snapshot is the rules in use with their source, and reloadErr the
	// last failed load since they loaded, for /rlconfig. Nil when none.
	snapshot  atomic.Pointer[provider.Snapshot]
	reloadErr atomic.Pointer[loadError]
	// udsOwn is the socket made at GRPC_UDS, removed at shutdown if it is
	// still there; nil without GRPC_UDS.
	udsOwn *listen.OwnSocket
	// tls serves TLS on the gRPC listener; nil without GRPC_SERVER_USE_TLS.
	tls *serverTLS
	// live records the traffic for the live view, and web serves it on
	// the debug listener; both nil with LIVE_VIEW_ENABLED=false.
	live      *live.Recorder
	web       *web.Handler
	capture   *capture.Recorder // nil with CAPTURE_ENABLED=false
	nearCache *limiter.NearCache
	// streams bounds the long-lived gRPC calls besides the quota
	// service's (streams.go).
	streams *streamBound
	// stall watches the gRPC connections and calls (newGRPCServer).
	stall *listen.StallWatch
	// quota serves the Rate Limit Quota Service; nil with
	// RLQS_ENABLED=false.
	quota *rlqs.Service
	// oneReplica logs, once, that the quota service's shares live in
	// this process (see setRules).
	oneReplica sync.Once
}

// Reload reads the rule files and the TLS files at once, as an operator's
// SIGHUP asks: changed rules load without waiting for the files to settle
// (invalid ones are refused, keeping the rules in use, as any reload),
// changed certificates are put in force. Rules from an xDS server are
// pushed by it: there is nothing to re-read. It does not wait for the
// reads; it is safe for concurrent use.
func (s *Server) Reload() {
	w, files := s.watcher.(*provider.Watcher)
	s.log.Info("reload asked (SIGHUP): reading the rule files and TLS files now", "rules", files, "tls", s.tls != nil)
	if files {
		w.Reload()
	}
	if s.tls != nil {
		s.tls.reloadNow()
	}
}

// New builds a server from settings: it loads the rules (an invalid rules
// directory is an error unless FORCE_START_WITHOUT_INITIAL_CONFIG is set;
// from an xDS server, it waits for the first valid rules unless that is
// set), connects the store and opens the listeners. It does not serve yet.
func New(ctx context.Context, set *settings.Settings, log *slog.Logger) (*Server, error) {
	s := &Server{set: set, log: log, stats: stats.NewRegistry(), health: NewHealth(), drain: shutdownDrain}
	s.stats.GoRuntime("ratelimit.go")
	s.statsd = s.newStatsd()
	var err error
	if s.metrics, err = s.newMetrics(); err != nil {
		return nil, err
	}
	s.rulesLoaded = s.stats.Gauge("ratelimit.service.config_load_success_timestamp_seconds")
	// Counters of rare events start at 0, so that Prometheus sees their
	// first increase (a series that appears at 1 has no increase).
	s.stats.Counter("ratelimit.service.config_load_error")
	s.stats.Counter("ratelimit.server.panics")
	tr, err := newTracing(ctx, set, log)
	if err != nil {
		return nil, err
	}
	s.tracing = tr

	b, err := newStoreHandle(ctx, set, s.stats, tr.Tracer())
	if err != nil {
		s.stopTracing()
		return nil, err
	}
	s.store = b
	s.storeHealth = watchStore(b, s.health, log)

	s.rulesFiles = rulesFileConfig(set, b)

	lim, fallback := s.newLimiters(b)
	if set.LiveViewEnabled {
		s.live = live.New(live.Config{MaxKeys: set.LiveViewMaxKeys})
	}
	if set.CaptureEnabled {
		s.capture = newCapture(set)
	}
	s.svc = s.newService(lim, fallback, b, tr)
	s.quota = s.newQuota()

	if set.ConfigType == settings.ConfigTypeXDS {
		err = s.watchXDS(ctx)
	} else {
		err = s.watchRules()
	}
	if err != nil {
		b.close()
		s.stopTracing()
		return nil, err
	}

	if err := s.listen(); err != nil {
		s.stopWatch()
		s.watcher.Wait()
		b.close()
		s.stopTracing()
		return nil, err
	}
	return s, nil
}

// rulesFileConfig is where the rule files are, and how they load.
func rulesFileConfig(set *settings.Settings, b *storeHandle) provider.FileConfig {
	return provider.FileConfig{
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
			Unsupported:  b.unsupported,
		},
	}
}

// newLimiters builds the limiter of the store, with the near cache, and,
// with STORE_FAILURE_MODE=local, the one of the local store beside it.
func (s *Server) newLimiters(b *storeHandle) (lim, fallback *limiter.Limiter) {
	set := s.set
	s.nearCache = limiter.NewNearCache(set.LocalCacheSizeInBytes)
	if s.nearCache != nil {
		s.stats.GaugeFunc("ratelimit.local_cache.keys", func() int64 { return int64(s.nearCache.Len()) })
		registerLocalCache(s.stats, s.nearCache)
	}
	lim = limiter.New(b.store, limiter.Config{
		Prefix:                     set.CacheKeyPrefix,
		KeyFormat:                  b.keyFormat,
		NearLimitRatio:             set.NearLimitRatio,
		StopIncrementWhenOverLimit: set.StopCacheKeyIncrementWhenOverlimit,
		NearCache:                  s.nearCache,
	})
	if b.local != nil {
		// The memory store's keys, which no other process reads.
		fallback = limiter.New(b.local, limiter.Config{
			Prefix:                     set.CacheKeyPrefix,
			KeyFormat:                  limiter.EscapedKeys,
			NearLimitRatio:             set.NearLimitRatio,
			StopIncrementWhenOverLimit: set.StopCacheKeyIncrementWhenOverlimit,
		})
	}
	return lim, fallback
}

// newService builds the RLS service.
func (s *Server) newService(lim, fallback *limiter.Limiter, b *storeHandle, tr *tracing) *service.Service {
	set, log := s.set, s.log
	return service.New(lim, s.stats, service.Config{
		GlobalShadowMode: set.ShadowMode,
		GlobalQuotaMode:  set.QuotaMode,
		Headers: service.Headers{
			Enabled:    set.LimitResponseHeadersEnabled,
			Style:      headerStyle(set.LimitResponseHeadersStyle),
			Limit:      set.LimitLimitHeader,
			Remaining:  set.LimitRemainingHeader,
			Reset:      set.LimitResetHeader,
			Upstream:   set.LimitRequestHeadersEnabled,
			RetryAfter: set.LimitResponseRetryAfterEnabled,
			Body:       set.LimitResponseBodyEnabled,
		},
		DynamicMetadata:    set.ResponseDynamicMetadata,
		Ceiling:            b.budget(set.RequestTimeout),
		Deadlines:          b.timeout > 0,
		MaxConcurrent:      set.MaxConcurrentRequests,
		MaxDynamicStatKeys: set.StatsMaxDynamicKeys,
		StatsExpiry:        set.StatsIdleExpiry,
		Fallback:           fallback,
		ResponseTime:       s.statsd != nil || s.prometheus(),
		Tracer:             tr.Tracer(),
		Propagator:         service.Propagator(),
		Live:               s.live,
		Capture:            s.capture,
		Log:                log,
	})
}

// newQuota builds the Rate Limit Quota Service, unless RLQS_ENABLED=false.
// With Redis, its pools are shared with the other replicas on that Redis.
func (s *Server) newQuota() *rlqs.Service {
	set := s.set
	if set.RLQSEnabled == settings.RLQSOff {
		return nil
	}
	return rlqs.New(s.stats, rlqs.Config{
		Auto:                set.RLQSEnabled == settings.RLQSAuto,
		Pool:                quota.Config{TTL: set.RLQSAssignmentTTL, Idle: cmp.Or(set.RLQSIdleTimeout, -1)}, // 0: never, the pool's -1
		MaxStreams:          set.RLQSMaxStreams,
		MaxBuckets:          set.RLQSMaxBuckets,
		MaxBucketsPerStream: set.RLQSMaxBucketsPerStream,
		MaxStreamsPerPeer:   set.RLQSMaxStreamsPerPeer,
		MaxBucketsPerPeer:   set.RLQSMaxBucketsPerPeer,
		MaxReportBytes:      set.GRPCMaxRecvMsgSize,
		Share:               s.store.share,
		Scope:               set.CacheKeyPrefix,
		Log:                 s.log,
	})
}

// stopTracing stops the exporter of a server that failed to start. No
// span was made, so there is nothing to wait for.
func (s *Server) stopTracing() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.tracing.flush(ctx)
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
		s.reloadErr.Store(&loadError{err: err, at: time.Now()})
		if !started.Load() {
			initial = err // reported synchronously, before Watch returns
			return
		}
		s.log.Error("rules reload failed; keeping the rules in use", "err", err)
	})
	started.Store(true)
	err, initial = s.rulesDirError(err), s.rulesDirError(initial)
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
	s.warnNoRules()
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
	w, err := provider.WatchXDS(wctx, cfg, func(snap provider.Snapshot) {
		s.setRules(snap)
		once.Do(func() { close(loaded) })
	}, func(err error) {
		if errors.Is(err, provider.ErrXDSConnection) {
			s.log.Warn("no connection to the xDS server; keeping the rules in use", "err", err)
			return
		}
		s.stats.Counter("ratelimit.service.config_load_error").Inc()
		s.reloadErr.Store(&loadError{err: err, at: time.Now()})
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

func (s *Server) setRules(snap provider.Snapshot) {
	cfg := snap.Rules
	s.svc.SetRules(cfg)
	if s.quota != nil {
		s.quota.SetRules(cfg)
		if s.store.share == nil && cfg.HasQuota() {
			// Several replicas would each give out the whole limit.
			s.oneReplica.Do(func() {
				s.log.Info("quota service: one replica: its shares live in this process's memory; run it on one replica, or share them through Redis (BACKEND_TYPE=redis)",
					"backend", s.set.BackendType)
			})
		}
	}
	s.snapshot.Store(&snap)
	s.reloadErr.Store(nil)
	s.stats.Counter("ratelimit.service.config_load_success").Inc()
	s.rulesLoaded.Set(time.Now().Unix())
	s.health.SetRules(!s.set.HealthyWithAtLeastOneConfigLoaded || !cfg.Empty())
	s.log.Info("rules loaded", "domains", cfg.Domains(), "version", snap.Source.Version)
}

func (s *Server) listen() error {
	// The TLS files first: a misconfiguration stops the start before any
	// socket opens.
	if err := s.loadTLS(); err != nil {
		return err
	}
	if err := s.openListeners(s.connLimits()); err != nil {
		return err
	}
	s.newGRPCServer()
	s.newMainHTTPServer()
	s.newDebugServer()
	return nil
}

// loadTLS reads the TLS files of the gRPC listener, if it serves TLS.
func (s *Server) loadTLS() (err error) {
	if s.set.GRPCServerUseTLS {
		s.tls, err = newServerTLS(tlsFiles{
			cert:      s.set.GRPCServerTLSCert,
			key:       s.set.GRPCServerTLSKey,
			clientCA:  s.set.GRPCClientTLSCACert,
			clientSAN: s.set.GRPCClientTLSSAN,
		}, s.stats, s.log)
	}
	return err
}

// connLimits returns the connection caps of the gRPC and HTTP listeners.
func (s *Server) connLimits() (grpcCap, httpCap listen.Limits) {
	// One cap per listener, so that no single listener can take every file
	// descriptor; together they must also fit the open-file limit.
	caps := listen.Caps{GRPC: s.set.GRPCMaxConnections, HTTP: s.set.HTTPMaxConnections, HTTPListeners: 2}
	if s.prometheus() {
		caps.HTTPListeners++
	}
	nofile := listen.OpenFileLimit()
	caps, lowered := caps.Fit(nofile)
	if lowered {
		s.log.Warn("connection caps lowered to fit the open-file limit",
			"RLIMIT_NOFILE", nofile, "GRPC_MAX_CONNECTIONS", caps.GRPC, "HTTP_MAX_CONNECTIONS", caps.HTTP)
	}
	// No client address may hold more than its share of a listener.
	overShare := s.stats.Counter("ratelimit.server.connections_over_peer_share")
	share := func(capacity int, setting string) listen.Limits {
		return listen.Limits{Capacity: capacity, PerPeerPercent: s.set.MaxConnectionsPerPeerPercent, Setting: setting, OverShare: overShare}
	}
	grpcCap, httpCap = share(caps.GRPC, "GRPC_MAX_CONNECTIONS"), share(caps.HTTP, "HTTP_MAX_CONNECTIONS")
	// At its cap an HTTP listener closes the connection idle longest for
	// a new one, so that /healthcheck answers whatever slow clients hold;
	// the gRPC listener, one idle for grpcEvictIdle at least, so that
	// clients holding their share with silent streams cannot keep others
	// out.
	httpCap.Evicted = s.stats.Counter("ratelimit.server.connections_evicted")
	grpcCap.Evicted, grpcCap.MinIdle = httpCap.Evicted, grpcEvictIdle
	return grpcCap, httpCap
}

// openListeners opens the gRPC, HTTP, debug and Prometheus listeners. It
// tries each, so that its error names every listener that could not open,
// each by the settings that place it (two ports in use need one restart,
// not two); on a failure it closes those it opened.
func (s *Server) openListeners(grpcCap, httpCap listen.Limits) error {
	var opened []net.Listener
	var errs []error
	// open opens addr, placed by the settings where names (setting the
	// one of its port).
	open := func(lim listen.Limits, addr, where, setting string) net.Listener {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, listenError(where, setting, err))
			return nil
		}
		ll := listen.Limit(l, lim, s.log)
		opened = append(opened, ll)
		return ll
	}
	hostPort := func(lim listen.Limits, hostSetting, host, portSetting string, port int) net.Listener {
		where := fmt.Sprintf("%s=%s %s=%d", hostSetting, host, portSetting, port)
		return open(lim, net.JoinHostPort(host, fmt.Sprint(port)), where, portSetting)
	}
	if s.set.GRPCUDS != "" {
		if err := s.openUDS(grpcCap); err != nil {
			errs = append(errs, err)
		} else {
			opened = append(opened, s.grpcLn)
		}
	} else {
		s.grpcLn = hostPort(grpcCap, "GRPC_HOST", s.set.GRPCHost, "GRPC_PORT", s.set.GRPCPort)
	}
	s.httpLn = hostPort(httpCap, "HOST", s.set.Host, "PORT", s.set.Port)
	s.debugLn = hostPort(httpCap, "DEBUG_HOST", s.set.DebugHost, "DEBUG_PORT", s.set.DebugPort)
	if s.prometheus() {
		s.promLn = open(httpCap, s.set.PrometheusAddr, "PROMETHEUS_ADDR="+s.set.PrometheusAddr, "PROMETHEUS_ADDR")
	}
	if len(errs) > 0 {
		for _, o := range opened {
			o.Close()
		}
		s.udsOwn.Remove()
		return errors.Join(errs...)
	}
	if s.tls != nil {
		// Plaintext for the kubelet's probes, TLS for /json (issue 24).
		s.httpLn = listen.Sniff(s.httpLn, s.tls.httpConfig, s.tls.refused, httpReadHeaderTimeout)
	}
	if s.promLn != nil {
		pmux := http.NewServeMux()
		pmux.Handle(s.set.PrometheusPath, s.metrics)
		s.promSrv = newHTTPServer(pmux, httpWriteTimeout, s.log)
	}
	return nil
}

// openUDS opens the gRPC listener on the socket GRPC_UDS.
func (s *Server) openUDS(grpcCap listen.Limits) error {
	path := s.set.GRPCUDS
	if err := listen.ClearSocketPath(path); err != nil {
		return err
	}
	ul, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("server: grpc listener: GRPC_UDS %s: %w", path, err)
	}
	if s.udsOwn, err = listen.ClaimSocket(ul, path); err != nil {
		ul.Close()
		return err
	}
	s.grpcLn = listen.Limit(ul, grpcCap, s.log)
	return nil
}

// listenError is the error of a listener that did not open at where,
// naming setting, the one that picks its port.
func listenError(where, setting string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("server: %s: address in use: set %s to a free port, or stop the process that holds it: %w", where, setting, err)
	}
	return fmt.Errorf("server: %s: %w", where, err)
}

// newGRPCServer builds the gRPC server and registers its services.
func (s *Server) newGRPCServer() {
	s.streams = newStreamBound(s.stats)
	stall := listen.NewStallWatch(s.stats, s.set.GRPCMaxConnectionIdle)
	s.stall = stall
	opts := append(grpcOptions(s.set, s.recoverUnary, s.recoverStream),
		grpc.ChainUnaryInterceptor(stall.Unary),
		grpc.ChainStreamInterceptor(stall.Stream, s.streams.intercept),
		grpc.InTapHandle(stall.Tap(s.svc.Tap)),
		grpc.ForceServerCodecV2(wire.Codec()))
	// Every connection is watched for answers its client does not let out.
	var creds credentials.TransportCredentials
	if s.tls != nil {
		creds = s.tls.credentials()
	}
	// A client that speaks another protocol is warned of.
	opts = append(opts, grpc.Creds(stall.Credentials(listen.NewProtocolCheck(creds, s.log))))
	s.grpc = grpc.NewServer(opts...)
	rls := withHandler(rlsv3.RateLimitService_ServiceDesc, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, s.shouldRateLimit)
	s.grpc.RegisterService(&rls, s.svc)
	if s.quota != nil {
		rlqsv3.RegisterRateLimitQuotaServiceServer(s.grpc, s.quota)
	}
	healthpb.RegisterHealthServer(s.grpc, s.health.grpc)
	if s.set.GRPCReflectionEnabled {
		reflection.Register(s.grpc)
	}
}

// newMainHTTPServer builds the server of PORT: /healthcheck and /json.
func (s *Server) newMainHTTPServer() {
	mux := http.NewServeMux()
	mux.Handle("/healthcheck", s.health)
	jsonHandler := s.svc.JSONHandler(int64(s.set.GRPCMaxRecvMsgSize))
	if s.tls != nil {
		jsonHandler = listen.RequireTLS(jsonHandler)
	}
	mux.Handle("/json", jsonHandler)
	s.httpSrv = newHTTPServer(mux, httpWriteTimeout+s.store.timeout, s.log)
}

// newDebugServer builds the server of the debug listener.
func (s *Server) newDebugServer() {
	dmux := http.NewServeMux()
	dmux.HandleFunc("/rlconfig", s.serveRulesDump)
	dmux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = s.stats.WriteText(w)
	})
	dmux.Handle("/metrics", s.metrics)
	index := "/rlconfig: the rules in use\n/stats: counters as text\n/metrics: counters for Prometheus\n"
	// off answers 404 under path, saying which setting turned it off.
	off := func(path, why string) {
		dmux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, why, http.StatusNotFound) })
	}
	if s.set.PprofEnabled {
		dmux.HandleFunc("/debug/pprof/", pprof.Index)
		dmux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		dmux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		dmux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		dmux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		index += "/debug/pprof/: profiles\n"
	} else {
		off("/debug/pprof/", "profiles are off (PPROF_ENABLED=false)")
	}
	if s.live != nil {
		values, _ := web.ParseValues(s.set.LiveViewValues) // validated by settings
		wc := web.Config{Live: s.live, Source: s.liveSource, Store: s.liveStore, Values: values}
		if s.quota != nil {
			wc.Quota = func() any { return s.quota.State() }
		}
		s.web = web.New(wc)
		dmux.Handle("/ui", s.web)
		dmux.Handle("/ui/", s.web)
		dmux.Handle("/api/", s.web)
		index += "/ui/: the live view (its JSON API under /api/v1/)\n"
	} else {
		off("/ui/", "the live view is off (LIVE_VIEW_ENABLED=false)")
	}
	dmux.Handle("/api/v1/explain", s.svc.ExplainHandler(int64(s.set.GRPCMaxRecvMsgSize)))
	index += "/api/v1/explain: why a request is (not) limited: POST it as to /json\n"
	index += s.mountCapture(dmux)
	dmux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, index)
	})
	s.debugSrv = newHTTPServer(listen.AllowHosts(s.set.DebugAllowedHosts, dmux), debugWriteTimeout, s.log)
	if s.web != nil {
		// Streams never end by themselves: a graceful shutdown ends them.
		s.debugSrv.RegisterOnShutdown(s.web.Close)
	}
	if s.capture != nil {
		// Nor does a capture before its time.
		s.debugSrv.RegisterOnShutdown(s.capture.Close)
	}
}

// newMetrics returns the Prometheus handler: with PROMETHEUS_MAPPER_YAML,
// the file's statsd_exporter mapping names the series. A mapping that
// does not load stops the start when the Prometheus listener is asked
// for; otherwise (only the debug port's /metrics uses it, as the anchor
// would not read the file at all) it is logged and the default names
// serve.
func (s *Server) newMetrics() (http.Handler, error) {
	cfg := stats.PrometheusConfig{ResponseTimeMillis: s.set.PrometheusResponseTimeAsMilliseconds}
	if path := s.set.PrometheusMapperYAML; path != "" {
		m, err := stats.LoadMapper(path, s.log)
		switch {
		case err == nil:
			cfg.Mapper = m
		case s.prometheus():
			return nil, fmt.Errorf("server: PROMETHEUS_MAPPER_YAML: %w", err)
		default:
			s.log.Warn("PROMETHEUS_MAPPER_YAML does not load; the debug port's /metrics keeps the default names", "err", err)
		}
	}
	return s.stats.PrometheusHandler(cfg), nil
}

// prometheus reports whether the Prometheus listener is asked for:
// USE_PROMETHEUS, unless DISABLE_STATS turns every sink off (as in the
// anchor, where it wins over the others).
func (s *Server) prometheus() bool { return s.set.UsePrometheus && !s.set.DisableStats }

func (s *Server) serveRulesDump(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	bw := bufio.NewWriterSize(w, 32<<10)
	if writeRulesDump(bw, s.snapshot.Load(), s.reloadErr.Load()) == nil {
		_ = bw.Flush()
	}
}

// Bounds of the gRPC listener besides the settings (see grpcOptions).
const (
	// grpcHandshakeTimeout bounds a new connection's HTTP/2 preface and
	// settings (grpc-go's default is 120 s): a client that connects and says
	// nothing, holding a slot of GRPC_MAX_CONNECTIONS, is dropped after it.
	grpcHandshakeTimeout = 10 * time.Second
	// grpcPingMinTime is the shortest interval between a client's keepalive
	// pings. grpc-go answers a client that pings more often (three strikes)
	// with GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and closes the
	// connection. 10 s is laxer than grpc-go's default of 5 min, so that no
	// Envoy keepalive setting that works with the anchor breaks; pings are
	// also allowed with no call in flight, since Envoy keeps idle
	// connections alive that way.
	grpcPingMinTime = 10 * time.Second
	// grpcEvictIdle is how long a gRPC connection's client must have sent
	// no whole message for the connection to be closed for a new one at
	// GRPC_MAX_CONNECTIONS: so long as every connection has been so used
	// within it, a new client waits (issue 36, item 1).
	grpcEvictIdle = 10 * time.Second
	// grpcMaxHeaderListSize bounds a call's metadata (grpc-go's default is
	// 16 MiB; Envoy's own default for the requests it accepts is 60 KiB); a
	// larger one is refused with codes.Internal by the transport.
	grpcMaxHeaderListSize = 64 << 10
)

// grpcOptions are the gRPC server's options from the settings.
func grpcOptions(set *settings.Settings, intercept grpc.UnaryServerInterceptor, interceptStream grpc.StreamServerInterceptor) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      set.GRPCMaxConnectionAge,
			MaxConnectionAgeGrace: set.GRPCMaxConnectionAgeGrace,
			// 0 is grpc-go's infinity.
			MaxConnectionIdle: set.GRPCMaxConnectionIdle,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcPingMinTime,
			PermitWithoutStream: true,
		}),
		// grpc-go reads a message's 5-byte length prefix first and refuses
		// a longer message with ResourceExhausted before buffering it.
		grpc.MaxRecvMsgSize(set.GRPCMaxRecvMsgSize),
		grpc.MaxHeaderListSize(grpcMaxHeaderListSize),
		grpc.ConnectionTimeout(grpcHandshakeTimeout),
		grpc.ChainUnaryInterceptor(intercept),
		grpc.ChainStreamInterceptor(interceptStream),
		grpc.ReadBufferSize(set.GRPCReadBufferSize),
		grpc.WriteBufferSize(set.GRPCWriteBufferSize),
		// grpc-go now shares write buffers by default and deprecates the
		// option; GRPC_SHARED_WRITE_BUFFER keeps the default it was
		// measured with (false: docs/BENCHMARKS.md) until measured again.
		//lint:ignore SA1019 see above
		grpc.SharedWriteBuffer(set.GRPCSharedWriteBuffer),
	}
	// 0 is the anchor's default: no bound, as grpc-go's own.
	if n := set.GRPCMaxConcurrentStreams; n > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(n)))
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

// withHandler returns desc with h as the handler of its unary method
// named method (a full name), its other methods as they are.
func withHandler(desc grpc.ServiceDesc, method string, h grpc.MethodHandler) grpc.ServiceDesc {
	desc.Methods = slices.Clone(desc.Methods)
	for i, m := range desc.Methods {
		if "/"+desc.ServiceName+"/"+m.MethodName == method {
			desc.Methods[i].Handler = h
		}
	}
	return desc
}

// shouldRateLimit is ShouldRateLimit's gRPC handler in place of the
// generated one: it does what the unary interceptors do (recoverUnary, the
// stall watch's Arrived) without grpc-go's chain of them, whose call info
// and closures cost each call three allocations. It does not call the
// chain it is given.
func (s *Server) shouldRateLimit(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (_ any, err error) {
	req := new(rlsv3.RateLimitRequest)
	if err := dec(req); err != nil {
		return nil, err
	}
	s.stall.Arrived(ctx)
	defer s.recovered(rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &err)
	return s.svc.ShouldRateLimit(ctx, req)
}

// recoverUnary turns a panic in a handler into codes.Internal, logs it and
// counts it, so that a bug never takes the process down. The caller is
// told only that it was an internal error: the panic's value and stack
// are for the log.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (_ any, err error) {
	defer s.recovered(info.FullMethod, &err)
	return handler(ctx, req)
}

// recovered, deferred by a handler of method, recovers its panic (its
// result is then nil) and sets *err to what recoverUnary says.
func (s *Server) recovered(method string, err *error) {
	if r := recover(); r != nil {
		s.stats.Counter("ratelimit.server.panics").Inc()
		s.log.Error("panic in handler", "method", method, "panic", r, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "internal error")
	}
}

// recoverStream is recoverUnary for streams (the quota service, health
// watches): a panic ends the stream with codes.Internal.
func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.stats.Counter("ratelimit.server.panics").Inc()
			s.log.Error("panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error: %v", r)
		}
	}()
	return handler(srv, ss)
}

// Run serves until ctx is done, then shuts down gracefully: health turns
// NOT_SERVING, listeners close, in-flight requests finish and the store
// closes, all within the drain time (10 s); past it Run returns without
// waiting for what is still running. It returns nil unless a listener or
// the store's startup failed.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, 5)
	serve := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("server: %s: %w", name, err)
			}
		})
	}
	serve("grpc", func() error { return s.grpc.Serve(s.grpcLn) })
	serve("http", func() error { return s.httpSrv.Serve(s.httpLn) })
	serve("debug", func() error { return s.debugSrv.Serve(s.debugLn) })
	if s.promSrv != nil {
		serve("prometheus", func() error { return s.promSrv.Serve(s.promLn) })
	}
	wg.Go(func() { s.storeHealth.run(ctx) })
	wg.Go(func() { s.store.reportMemory(ctx, s.log) })
	if s.tls != nil {
		wg.Go(func() { s.tls.watch(ctx) })
	}
	if s.statsd != nil {
		wg.Go(func() { s.statsd.Run(ctx) })
	}
	if s.live != nil {
		wg.Go(func() { s.live.Run(ctx) })
	}
	wg.Go(func() { s.svc.RunStatsExpiry(ctx) })
	if s.quota != nil {
		wg.Go(func() { s.quota.Run(ctx) })
	}
	if s.store.started != nil && s.set.RedisStartupMaxElapsedTime > 0 {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, s.set.RedisStartupMaxElapsedTime)
			defer cancel()
			if err := s.store.started(sctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("server: the store did not answer within REDIS_STARTUP_MAX_ELAPSED_TIME (%v): %w", s.set.RedisStartupMaxElapsedTime, err)
			}
		})
	}
	// At warn, so that the default LOG_LEVEL shows it: see startup.go.
	// It names the addresses bound, so that a listener on port 0 (tests)
	// can be found.
	attrs := []any{"grpc", s.grpcLn.Addr().String(), "grpc_tls", s.tls != nil, "http", s.httpLn.Addr().String(),
		"debug", s.debugLn.Addr().String()}
	if s.promLn != nil {
		attrs = append(attrs, "prometheus", s.promLn.Addr().String())
	}
	attrs = append(attrs, "backend", s.set.BackendType, "store", storeSummary(s.set), "rules", s.rulesSummary(), "domains", s.domains())
	s.log.Warn("serving", attrs...)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.log.Info("shutting down")
	s.health.Shutdown()
	cancel()
	s.shutdown(&wg)
	return runErr
}

// shutdown drains and stops everything within s.drain, whatever the
// clients and the store do: one deadline covers the gRPC and HTTP drains,
// the goroutines of Run and the store's close. Past it, connections still
// open are closed and shutdown returns without waiting for what is left (a
// store blocked on a frozen Redis, a handler waiting for it): the process
// is about to exit, and an orchestrator that waits longer than the drain it
// was promised kills it anyway.
func (s *Server) shutdown(run *sync.WaitGroup) {
	dctx, dcancel := context.WithTimeout(context.Background(), s.drain)
	defer dcancel()

	// Quota streams never end by themselves: end them first, so that
	// the graceful stop does not wait for them. Envoy keeps their
	// assignments until their TTL and opens its stream again elsewhere.
	if s.quota != nil {
		s.quota.Close()
	}
	var drain sync.WaitGroup
	drain.Go(s.grpc.GracefulStop)
	for _, h := range s.httpServers() {
		drain.Go(func() { _ = h.Shutdown(dctx) })
	}
	if !waitCtx(dctx, drain.Wait) {
		s.log.Warn("drain time over; closing the connections still open", "drain", s.drain)
		// Stop closes every connection and cancels the calls in flight; it
		// does not wait for their handlers, but run it aside all the same.
		go s.grpc.Stop()
		for _, h := range s.httpServers() {
			_ = h.Close()
		}
	}
	// The spans of the requests drained above are all ended and queued:
	// they are exported beside the rest, within traceFlushMax of the time
	// left, so that a collector that does not answer delays nothing else
	// and the exit by no more than that.
	var traces sync.WaitGroup
	traces.Go(func() {
		tctx, cancel := context.WithTimeout(dctx, traceFlushMax)
		defer cancel()
		s.flushTraces(tctx)
	})
	// The watcher, Run's goroutines, a last flush of the statistics (the
	// requests drained above are counted by now) and the store's close
	// get the time left, if any.
	if !waitCtx(dctx, func() {
		s.stopWatch()
		s.watcher.Wait()
		run.Wait()
		s.flushStats(dctx)
		s.store.close()
	}) {
		s.log.Warn("drain time over before the store closed; exiting without waiting for it", "drain", s.drain)
	}
	// flushTraces returns by its deadline: the SDK's export gives up then.
	traces.Wait()
	s.udsOwn.Remove()
}

// flushStats sends the statistics one last time, within ctx.
func (s *Server) flushStats(ctx context.Context) {
	if s.statsd == nil {
		return
	}
	if err := s.statsd.Flush(ctx); err != nil {
		level := slog.LevelWarn
		if !s.set.StatsdAsked() {
			level = slog.LevelInfo // statsd by default only: see newStatsd
		}
		s.log.Log(ctx, level, "last statistics not sent to statsd", "err", err)
	}
	_ = s.statsd.Close()
}

// flushTraces exports the spans still queued, within ctx.
func (s *Server) flushTraces(ctx context.Context) {
	if err := s.tracing.flush(ctx); err != nil {
		s.log.Warn("last spans not exported", "err", err)
	}
}

// httpServers are the HTTP servers in use.
func (s *Server) httpServers() []*http.Server {
	hs := []*http.Server{s.httpSrv, s.debugSrv}
	if s.promSrv != nil {
		hs = append(hs, s.promSrv)
	}
	return hs
}

// waitCtx runs f and waits until it returns (true) or ctx is done (false),
// leaving f running.
func waitCtx(ctx context.Context, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// headerStyle is LIMIT_RESPONSE_HEADERS_STYLE, which settings validated.
func headerStyle(s string) service.HeaderStyle {
	st, _ := service.ParseHeaderStyle(s)
	return st
}

// registerLocalCache registers the near cache's gauges under
// envoyproxy/ratelimit's names for its local cache (ratelimit.localcache.*,
// freecache's counters, all gauges there), so that dashboards built on them
// keep working: in Prometheus, under the default mapping, they are
// ratelimit_localcache_hitCount and so on, as statsd_exporter names a
// statistic its mapping does not list.
func registerLocalCache(reg *stats.Registry, c *limiter.NearCache) {
	count := func(v uint64) int64 { return int64(min(v, math.MaxInt64)) }
	for _, g := range []struct {
		name string
		f    func(limiter.NearCacheStats) int64
	}{
		{"hitCount", func(st limiter.NearCacheStats) int64 { return count(st.Hits) }},
		{"missCount", func(st limiter.NearCacheStats) int64 { return count(st.Misses) }},
		{"lookupCount", func(st limiter.NearCacheStats) int64 { return count(st.Lookups()) }},
		{"entryCount", func(st limiter.NearCacheStats) int64 { return st.Entries }},
		{"evacuateCount", func(st limiter.NearCacheStats) int64 { return count(st.Evacuated) }},
		{"expiredCount", func(st limiter.NearCacheStats) int64 { return count(st.Expired) }},
		{"overwriteCount", func(st limiter.NearCacheStats) int64 { return count(st.Overwrites) }},
		{"averageAccessTime", func(st limiter.NearCacheStats) int64 { return st.AverageAccessTime }},
	} {
		reg.GaugeFunc("ratelimit.localcache."+g.name, func() int64 { return g.f(c.Stats()) })
	}
}
