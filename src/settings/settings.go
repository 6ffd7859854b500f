// Package settings reads the service's environment settings. Names, meanings
// and defaults are envoyproxy/ratelimit's, except the deliberate differences
// listed in docs/SETTINGS.md. It is the only package that reads the environment.
package settings

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Settings is every environment setting: docs/SETTINGS.md describes each one
// (TestSettingsDocument checks it) and the struct tags give the defaults.
// Validate puts a setting that names one of a few words (LOG_FORMAT,
// CONFIG_TYPE, LIVE_VIEW_VALUES...) in the case of its constants.
type Settings struct {
	// Listeners.
	Host              string   `envconfig:"HOST" default:"0.0.0.0"`
	Port              int      `envconfig:"PORT" default:"8080"`
	GRPCHost          string   `envconfig:"GRPC_HOST" default:"0.0.0.0"`
	GRPCPort          int      `envconfig:"GRPC_PORT" default:"8081"`
	GRPCUDS           string   `envconfig:"GRPC_UDS" default:""`
	DebugHost         string   `envconfig:"DEBUG_HOST" default:"127.0.0.1"`
	DebugPort         int      `envconfig:"DEBUG_PORT" default:"6070"`
	DebugAllowedHosts []string `envconfig:"DEBUG_ALLOWED_HOSTS" default:""`
	PprofEnabled      bool     `envconfig:"PPROF_ENABLED" default:"true"`

	GRPCMaxConnectionAge      time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE" default:"24h"`
	GRPCMaxConnectionAgeGrace time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE_GRACE" default:"1h"`
	GRPCMaxConnectionIdle     time.Duration `envconfig:"GRPC_MAX_CONNECTION_IDLE" default:"5m"`

	// TLS on the gRPC listener.
	GRPCServerUseTLS    bool   `envconfig:"GRPC_SERVER_USE_TLS" default:"false"`
	GRPCServerTLSCert   string `envconfig:"GRPC_SERVER_TLS_CERT" default:""`
	GRPCServerTLSKey    string `envconfig:"GRPC_SERVER_TLS_KEY" default:""`
	GRPCClientTLSCACert string `envconfig:"GRPC_CLIENT_TLS_CACERT" default:""`
	GRPCClientTLSSAN    string `envconfig:"GRPC_CLIENT_TLS_SAN" default:""`

	// Bounds on what clients may hold.
	GRPCMaxRecvMsgSize           int `envconfig:"GRPC_MAX_RECV_MSG_SIZE" default:"65536"`
	GRPCMaxConcurrentStreams     int `envconfig:"GRPC_MAX_CONCURRENT_STREAMS" default:"1024"`
	GRPCMaxConnections           int `envconfig:"GRPC_MAX_CONNECTIONS" default:"10000"`
	HTTPMaxConnections           int `envconfig:"HTTP_MAX_CONNECTIONS" default:"1024"`
	MaxConnectionsPerPeerPercent int `envconfig:"MAX_CONNECTIONS_PER_PEER_PERCENT" default:"25"`

	// gRPC server tuning.
	GRPCReflectionEnabled bool `envconfig:"GRPC_REFLECTION_ENABLED" default:"true"`
	GRPCNumStreamWorkers  int  `envconfig:"GRPC_NUM_STREAM_WORKERS" default:"64"`
	GRPCReadBufferSize    int  `envconfig:"GRPC_READ_BUFFER_SIZE" default:"32768"`
	GRPCWriteBufferSize   int  `envconfig:"GRPC_WRITE_BUFFER_SIZE" default:"32768"`
	GRPCSharedWriteBuffer bool `envconfig:"GRPC_SHARED_WRITE_BUFFER" default:"false"`

	GCHeadroomBytes int64 `envconfig:"GC_HEADROOM_BYTES" default:"33554432"`

	// Prometheus.
	UsePrometheus                        bool   `envconfig:"USE_PROMETHEUS" default:"false"`
	PrometheusAddr                       string `envconfig:"PROMETHEUS_ADDR" default:":9090"`
	PrometheusPath                       string `envconfig:"PROMETHEUS_PATH" default:"/metrics"`
	PrometheusMapperYAML                 string `envconfig:"PROMETHEUS_MAPPER_YAML" default:""`
	PrometheusResponseTimeAsMilliseconds bool   `envconfig:"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS" default:"false"`

	// Statsd and DogStatsD.
	UseStatsd              bool              `envconfig:"USE_STATSD" default:"true"`
	StatsdHost             string            `envconfig:"STATSD_HOST" default:"localhost"`
	StatsdPort             int               `envconfig:"STATSD_PORT" default:"8125"`
	StatsdProtocol         string            `envconfig:"STATSD_PROTOCOL" default:"tcp"`
	StatsFlushInterval     time.Duration     `envconfig:"STATS_FLUSH_INTERVAL" default:"10s"`
	ExtraTags              map[string]string `envconfig:"EXTRA_TAGS" default:""`
	UseDogStatsd           bool              `envconfig:"USE_DOG_STATSD" default:"false"`
	UseDogStatsdMogrifiers []string          `envconfig:"USE_DOG_STATSD_MOGRIFIERS" default:""`
	DisableStats           bool              `envconfig:"DISABLE_STATS" default:"false"`

	// mogrifiers are those named by USE_DOG_STATSD_MOGRIFIERS, read by
	// Load (see Mogrifiers).
	mogrifiers []Mogrifier

	// Tracing. The OpenTelemetry SDK reads the OTEL_EXPORTER_OTLP_* variables
	// itself; OTLPEndpoint is read only to check it.
	TracingEnabled           bool    `envconfig:"TRACING_ENABLED" default:"false"`
	TracingServiceName       string  `envconfig:"TRACING_SERVICE_NAME" default:"RateLimit"`
	TracingServiceNamespace  string  `envconfig:"TRACING_SERVICE_NAMESPACE" default:""`
	TracingServiceInstanceID string  `envconfig:"TRACING_SERVICE_INSTANCE_ID" default:""`
	TracingExporterProtocol  string  `envconfig:"TRACING_EXPORTER_PROTOCOL" default:"http"`
	TracingSamplingRate      float64 `envconfig:"TRACING_SAMPLING_RATE" default:"1"`
	OTLPEndpoint             string  `envconfig:"OTEL_EXPORTER_OTLP_ENDPOINT" default:""`

	// Logging.
	LogLevel  string `envconfig:"LOG_LEVEL" default:"WARN"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`

	// Rules.
	RuntimeRoot             string        `envconfig:"RUNTIME_ROOT" default:""`
	RuntimeSubdirectory     string        `envconfig:"RUNTIME_SUBDIRECTORY" default:""`
	RuntimeAppDirectory     string        `envconfig:"RUNTIME_APPDIRECTORY" default:"config"`
	RuntimeIgnoreDotFiles   bool          `envconfig:"RUNTIME_IGNOREDOTFILES" default:"false"`
	RuntimeWatchRoot        bool          `envconfig:"RUNTIME_WATCH_ROOT" default:"true"` // accepted for compatibility: both values watch the same (see provider.FileConfig.Root)
	MergeDomainConfig       bool          `envconfig:"MERGE_DOMAIN_CONFIG" default:"false"`
	RuntimeRecheckInterval  time.Duration `envconfig:"RUNTIME_RECHECK_INTERVAL" default:"60s"`
	RuntimeQuietPeriod      time.Duration `envconfig:"RUNTIME_QUIET_PERIOD" default:"1s"`
	RuntimeAllowEmptyReload bool          `envconfig:"RUNTIME_ALLOW_EMPTY_RELOAD" default:"false"`

	ForceStartWithoutInitialConfig    bool `envconfig:"FORCE_START_WITHOUT_INITIAL_CONFIG" default:"false"`
	HealthyWithAtLeastOneConfigLoaded bool `envconfig:"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED" default:"false"`

	ConfigType string `envconfig:"CONFIG_TYPE" default:"FILE"`

	// The xDS client (CONFIG_TYPE=GRPC_XDS_SOTW).
	ConfigGRPCXDSNodeID                     string            `envconfig:"CONFIG_GRPC_XDS_NODE_ID" default:"default"`
	ConfigGRPCXDSNodeMetadata               string            `envconfig:"CONFIG_GRPC_XDS_NODE_METADATA" default:""`
	ConfigGRPCXDSServerURL                  string            `envconfig:"CONFIG_GRPC_XDS_SERVER_URL" default:"localhost:18000"`
	ConfigGRPCXDSServerConnectRetryInterval time.Duration     `envconfig:"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL" default:"3s"`
	ConfigGRPCXDSClientAdditionalHeaders    map[string]string `envconfig:"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS" default:""`
	ConfigGRPCXDSServerUseTLS               bool              `envconfig:"CONFIG_GRPC_XDS_SERVER_USE_TLS" default:"false"`
	ConfigGRPCXDSClientTLSCert              string            `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_CERT" default:""`
	ConfigGRPCXDSClientTLSKey               string            `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_KEY" default:""`
	ConfigGRPCXDSServerTLSCACert            string            `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_CACERT" default:""`
	ConfigGRPCXDSServerTLSSAN               string            `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_SAN" default:""`
	XDSClientBackoffInitialInterval         time.Duration     `envconfig:"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL" default:"10s"`
	XDSClientBackoffMaxInterval             time.Duration     `envconfig:"XDS_CLIENT_BACKOFF_MAX_INTERVAL" default:"60s"`
	XDSClientBackoffRandomFactor            float64           `envconfig:"XDS_CLIENT_BACKOFF_RANDOM_FACTOR" default:"0.5"`
	XDSClientBackoffJitter                  bool              `envconfig:"XDS_CLIENT_BACKOFF_JITTER" default:"true"`
	XDSClientMaxMsgSizeInBytes              int               `envconfig:"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES" default:""`

	// backendInferred is the REDIS_ variable that made BackendType redis
	// when BACKEND_TYPE was not set (see inferBackend); "" otherwise.
	backendInferred string
	// statsdAsked is whether any statsd setting was given (see StatsdAsked).
	statsdAsked bool

	// Decisions.
	BackendType                        string  `envconfig:"BACKEND_TYPE" default:"memory"` // see inferBackend
	ShadowMode                         bool    `envconfig:"SHADOW_MODE" default:"false"`
	QuotaMode                          bool    `envconfig:"QUOTA_MODE" default:"false"`
	NearLimitRatio                     float64 `envconfig:"NEAR_LIMIT_RATIO" default:"0.8"`
	CacheKeyPrefix                     string  `envconfig:"CACHE_KEY_PREFIX" default:""`
	CacheKeyFormat                     string  `envconfig:"CACHE_KEY_FORMAT" default:"anchor"`
	StopCacheKeyIncrementWhenOverlimit bool    `envconfig:"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" default:"false"`
	ExpirationJitterMaxSeconds         int64   `envconfig:"EXPIRATION_JITTER_MAX_SECONDS" default:"300"`
	LocalCacheSizeInBytes              int     `envconfig:"LOCAL_CACHE_SIZE_IN_BYTES" default:"0"`
	ResponseDynamicMetadata            bool    `envconfig:"RESPONSE_DYNAMIC_METADATA" default:"false"`

	// Response headers.
	LimitResponseHeadersEnabled    bool   `envconfig:"LIMIT_RESPONSE_HEADERS_ENABLED" default:"false"`
	LimitLimitHeader               string `envconfig:"LIMIT_LIMIT_HEADER" default:"RateLimit-Limit"`
	LimitRemainingHeader           string `envconfig:"LIMIT_REMAINING_HEADER" default:"RateLimit-Remaining"`
	LimitResetHeader               string `envconfig:"LIMIT_RESET_HEADER" default:"RateLimit-Reset"`
	LimitResponseHeadersStyle      string `envconfig:"LIMIT_RESPONSE_HEADERS_STYLE" default:"draft03"`
	LimitRequestHeadersEnabled     bool   `envconfig:"LIMIT_REQUEST_HEADERS_ENABLED" default:"false"`
	LimitResponseRetryAfterEnabled bool   `envconfig:"LIMIT_RESPONSE_RETRY_AFTER_ENABLED" default:"false"`
	LimitResponseBodyEnabled       bool   `envconfig:"LIMIT_RESPONSE_BODY_ENABLED" default:"false"`

	// Hostile input.
	RequestTimeout        time.Duration `envconfig:"REQUEST_TIMEOUT" default:"0"`
	MaxConcurrentRequests int           `envconfig:"MAX_CONCURRENT_REQUESTS" default:"4096"`
	StatsMaxDynamicKeys   int           `envconfig:"STATS_MAX_DYNAMIC_KEYS" default:"1000"`
	StatsIdleExpiry       time.Duration `envconfig:"STATS_IDLE_EXPIRY" default:"10m"`

	// The live view.
	LiveViewEnabled bool   `envconfig:"LIVE_VIEW_ENABLED" default:"true"`
	LiveViewMaxKeys int    `envconfig:"LIVE_VIEW_MAX_KEYS" default:"1024"`
	LiveViewValues  string `envconfig:"LIVE_VIEW_VALUES" default:"plain"`

	// Capture.
	CaptureEnabled  bool  `envconfig:"CAPTURE_ENABLED" default:"true"`
	CaptureMaxBytes int64 `envconfig:"CAPTURE_MAX_BYTES" default:"268435456"`

	// The Rate Limit Quota Service.
	RLQSEnabled             string        `envconfig:"RLQS_ENABLED" default:""`
	RLQSAssignmentTTL       time.Duration `envconfig:"RLQS_ASSIGNMENT_TTL" default:"15s"`
	RLQSIdleTimeout         time.Duration `envconfig:"RLQS_IDLE_TIMEOUT" default:"60s"`
	RLQSMaxStreams          int           `envconfig:"RLQS_MAX_STREAMS" default:"1024"`
	RLQSMaxBuckets          int           `envconfig:"RLQS_MAX_BUCKETS" default:"100000"`
	RLQSMaxBucketsPerStream int           `envconfig:"RLQS_MAX_BUCKETS_PER_STREAM" default:"10000"`
	RLQSMaxStreamsPerPeer   int           `envconfig:"RLQS_MAX_STREAMS_PER_PEER" default:"16"`
	RLQSMaxBucketsPerPeer   int           `envconfig:"RLQS_MAX_BUCKETS_PER_PEER" default:"20000"`

	// Memory store.
	MemoryMaxBytes int64 `envconfig:"MEMORY_MAX_BYTES" default:"67108864"`
	MemoryMaxKeys  int   `envconfig:"MEMORY_MAX_KEYS" default:"0"`

	// Store outages, Redis and Memcached.
	StoreBreakerFailures      int           `envconfig:"STORE_BREAKER_FAILURES" default:"5"`
	StoreBreakerProbeInterval time.Duration `envconfig:"STORE_BREAKER_PROBE_INTERVAL" default:"500ms"`
	StoreFailureMode          string        `envconfig:"STORE_FAILURE_MODE" default:"error"`

	// Write-behind counting, Redis and Memcached.
	WriteBehindInterval time.Duration `envconfig:"WRITE_BEHIND_INTERVAL" default:"0"`
	WriteBehindMaxKeys  int           `envconfig:"WRITE_BEHIND_MAX_KEYS" default:"100000"`

	// Redis.
	RedisSocketType                  string        `envconfig:"REDIS_SOCKET_TYPE" default:"unix"`
	RedisType                        string        `envconfig:"REDIS_TYPE" default:"SINGLE"`
	RedisURL                         string        `envconfig:"REDIS_URL" default:"/var/run/nutcracker/ratelimit.sock"`
	RedisPoolSize                    int           `envconfig:"REDIS_POOL_SIZE" default:"10"`
	RedisAuth                        string        `envconfig:"REDIS_AUTH" default:""`
	RedisSentinelAuth                string        `envconfig:"REDIS_SENTINEL_AUTH" default:""`
	RedisTLS                         bool          `envconfig:"REDIS_TLS" default:"false"`
	RedisTLSClientCert               string        `envconfig:"REDIS_TLS_CLIENT_CERT" default:""`
	RedisTLSClientKey                string        `envconfig:"REDIS_TLS_CLIENT_KEY" default:""`
	RedisTLSCACert                   string        `envconfig:"REDIS_TLS_CACERT" default:""`
	RedisTLSSkipHostnameVerification bool          `envconfig:"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION" default:"false"`
	RedisPipelineWindow              time.Duration `envconfig:"REDIS_PIPELINE_WINDOW" default:"0"`
	RedisPipelineLimit               int           `envconfig:"REDIS_PIPELINE_LIMIT" default:"0"`
	RedisTimeout                     time.Duration `envconfig:"REDIS_TIMEOUT" default:"10s"`
	RedisHealthCheckActiveConnection bool          `envconfig:"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION" default:"false"`

	RedisPerSecond               bool          `envconfig:"REDIS_PERSECOND" default:"false"`
	RedisPerSecondSocketType     string        `envconfig:"REDIS_PERSECOND_SOCKET_TYPE" default:"unix"`
	RedisPerSecondType           string        `envconfig:"REDIS_PERSECOND_TYPE" default:"SINGLE"`
	RedisPerSecondURL            string        `envconfig:"REDIS_PERSECOND_URL" default:"/var/run/nutcracker/ratelimitpersecond.sock"`
	RedisPerSecondPoolSize       int           `envconfig:"REDIS_PERSECOND_POOL_SIZE" default:"10"`
	RedisPerSecondAuth           string        `envconfig:"REDIS_PERSECOND_AUTH" default:""`
	RedisPerSecondSentinelAuth   string        `envconfig:"REDIS_PERSECOND_SENTINEL_AUTH" default:""`
	RedisPerSecondTLS            bool          `envconfig:"REDIS_PERSECOND_TLS" default:"false"`
	RedisPerSecondPipelineWindow time.Duration `envconfig:"REDIS_PERSECOND_PIPELINE_WINDOW" default:"0"`
	RedisPerSecondPipelineLimit  int           `envconfig:"REDIS_PERSECOND_PIPELINE_LIMIT" default:"0"`
	RedisPerSecondTimeout        time.Duration `envconfig:"REDIS_PERSECOND_TIMEOUT" default:"10s"`

	RedisStallTimeout time.Duration `envconfig:"REDIS_STALL_TIMEOUT" default:"250ms"`

	RedisStartupInitialInterval time.Duration `envconfig:"REDIS_STARTUP_INITIAL_INTERVAL" default:"1s"`
	RedisStartupMaxInterval     time.Duration `envconfig:"REDIS_STARTUP_MAX_INTERVAL" default:"30s"`
	RedisStartupMaxElapsedTime  time.Duration `envconfig:"REDIS_STARTUP_MAX_ELAPSED_TIME" default:"0"`

	// Memcached (BACKEND_TYPE=memcache).
	MemcacheHostPort                    []string      `envconfig:"MEMCACHE_HOST_PORT" default:""`
	MemcacheSrv                         string        `envconfig:"MEMCACHE_SRV" default:""`
	MemcacheSrvRefresh                  time.Duration `envconfig:"MEMCACHE_SRV_REFRESH" default:"0"`
	MemcacheMaxIdleConns                int           `envconfig:"MEMCACHE_MAX_IDLE_CONNS" default:"2"`
	MemcacheConnections                 int           `envconfig:"MEMCACHE_CONNECTIONS" default:"2"`
	MemcacheMaxInFlight                 int           `envconfig:"MEMCACHE_MAX_IN_FLIGHT" default:"128"`
	MemcacheTLS                         bool          `envconfig:"MEMCACHE_TLS" default:"false"`
	MemcacheTLSClientCert               string        `envconfig:"MEMCACHE_TLS_CLIENT_CERT" default:""`
	MemcacheTLSClientKey                string        `envconfig:"MEMCACHE_TLS_CLIENT_KEY" default:""`
	MemcacheTLSCACert                   string        `envconfig:"MEMCACHE_TLS_CACERT" default:""`
	MemcacheTLSSkipHostnameVerification bool          `envconfig:"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION" default:"false"`

	// warnings are the settings of envoyproxy/ratelimit that are set but
	// not implemented, found by Load. Unexported, so envconfig skips it.
	warnings []Warning
}

// Backend types accepted by BACKEND_TYPE.
const (
	BackendMemory   = "memory"
	BackendRedis    = "redis"
	BackendMemcache = "memcache"
)

// Rule sources accepted by CONFIG_TYPE.
const (
	ConfigTypeFile = "FILE"
	ConfigTypeXDS  = "GRPC_XDS_SOTW"
)

// Values of STORE_FAILURE_MODE: answer a store outage with its error, or
// decide from local counts meanwhile.
const (
	FailureModeError = "error"
	FailureModeLocal = "local"
)

// Cache key formats accepted by CACHE_KEY_FORMAT: the anchor's, where a '_'
// in a value can make two descriptors share a key, or one escaped so that
// they never do.
const (
	KeyFormatAnchor  = "anchor"
	KeyFormatEscaped = "escaped"
)

// Limits of GRPC_MAX_RECV_MSG_SIZE. The upper one is grpc-go's own default:
// a larger request is never needed (Envoy's are a few KiB) and would only
// let a client make the server buffer more.
const (
	minRecvMsgSize = 1 << 10
	maxRecvMsgSize = 4 << 20
)

// maxStreams bounds GRPC_MAX_CONCURRENT_STREAMS, and maxConnections
// GRPC_MAX_CONNECTIONS and HTTP_MAX_CONNECTIONS (far above any open-file
// limit; the server lowers them further to fit the real one).
const (
	maxStreams     = 1 << 20
	maxConnections = 1 << 24
)

// maxBreakerFailures bounds STORE_BREAKER_FAILURES: a breaker that needs
// more failures in a row than this would hardly ever open.
const maxBreakerFailures = 10000

// Load reads the settings from the environment and validates them. Every
// problem names its variable; all problems are reported together.
//
// Settings of envoyproxy/ratelimit that are not implemented are looked up
// too (see AnchorSettings): a value that asks for a Refused one is an
// error, and one that asks for a Warned one is kept for Warnings, so that
// no setting of the anchor is ignored without a word.
func Load() (*Settings, error) {
	var s Settings
	warnings, refused := checkAnchor(os.LookupEnv)
	if err := envconfig.Process("", &s); err != nil {
		return nil, errors.Join(append(refused, fmt.Errorf("settings: %w", err))...)
	}
	s.inferBackend(os.LookupEnv, os.Environ())
	for _, name := range []string{"USE_STATSD", "STATSD_HOST", "STATSD_PORT", "STATSD_PROTOCOL", "USE_DOG_STATSD"} {
		if _, set := os.LookupEnv(name); set {
			s.statsdAsked = true
		}
	}
	if err := errors.Join(append(refused, s.Validate(), s.loadMogrifiers(os.LookupEnv))...); err != nil {
		return nil, err
	}
	warnings = append(warnings, s.unusedTLS()...)
	warnings = append(warnings, s.unusedStats()...)
	warnings = append(warnings, s.unusedTracing(os.LookupEnv)...)
	sort.SliceStable(warnings, func(i, j int) bool { return warnings[i].Name < warnings[j].Name })
	s.warnings = warnings
	return &s, nil
}

// inferBackend keeps a deployment written for envoyproxy/ratelimit on
// Redis. There BACKEND_TYPE defaults to redis, and deployments that use
// Redis often set only REDIS_URL and REDIS_SOCKET_TYPE (Envoy Gateway's
// does); here it defaults to memory, which would quietly give every
// instance counts of its own. So when BACKEND_TYPE is not set and any
// REDIS_ variable is, the backend is redis, as with the anchor; with no
// REDIS_ variable either, memory. BackendInferred says it happened, for
// the startup log.
//
// It is the one setting whose default depends on another.
func (s *Settings) inferBackend(lookup func(string) (string, bool), environ []string) {
	if _, set := lookup("BACKEND_TYPE"); set {
		return
	}
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "REDIS_") {
			s.BackendType, s.backendInferred = BackendRedis, name
			return
		}
	}
}

// StatsdAsked reports whether the environment set any statsd setting
// (USE_STATSD, STATSD_HOST, STATSD_PORT, STATSD_PROTOCOL, USE_DOG_STATSD).
// Statistics go to statsd by default, as in the anchor; when nothing asked
// for it, a statsd that does not answer is not worth a warning.
func (s *Settings) StatsdAsked() bool { return s.statsdAsked }

// BackendInferred returns the REDIS_ variable that made the backend redis
// although BACKEND_TYPE was not set, or "".
func (s *Settings) BackendInferred() string { return s.backendInferred }

// unusedTLS warns about the gRPC TLS settings that are set but have no
// effect, as in the anchor: any of them without GRPC_SERVER_USE_TLS=true,
// where the listener serves in plaintext, and GRPC_CLIENT_TLS_SAN without
// GRPC_CLIENT_TLS_CACERT, where no client certificate is asked for and so
// none is checked. They are warnings, not errors, so that a deployment the
// anchor starts starts here too; the warning tells its operator that the
// security it seems to ask for is not there.
func (s *Settings) unusedTLS() []Warning {
	var out []Warning
	if !s.GRPCServerUseTLS {
		for _, f := range []struct{ name, value string }{
			{"GRPC_SERVER_TLS_CERT", s.GRPCServerTLSCert},
			{"GRPC_SERVER_TLS_KEY", s.GRPCServerTLSKey},
			{"GRPC_CLIENT_TLS_CACERT", s.GRPCClientTLSCACert},
			{"GRPC_CLIENT_TLS_SAN", s.GRPCClientTLSSAN},
		} {
			if f.value != "" {
				out = append(out, Warning{Name: f.name, Unused: true,
					Why: "it has no effect without GRPC_SERVER_USE_TLS=true, as with envoyproxy/ratelimit: the gRPC listener serves in plaintext"})
			}
		}
		return out
	}
	if s.GRPCClientTLSSAN != "" && s.GRPCClientTLSCACert == "" {
		out = append(out, Warning{Name: "GRPC_CLIENT_TLS_SAN", Unused: true,
			Why: "it has no effect without GRPC_CLIENT_TLS_CACERT, as with envoyproxy/ratelimit: no client certificate is asked for, so none is checked"})
	}
	return out
}

// unusedStats warns about statistics settings that are set but have no
// effect with the others, as in the anchor: USE_PROMETHEUS with
// DISABLE_STATS=true, PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS with
// PROMETHEUS_MAPPER_YAML, and USE_DOG_STATSD_MOGRIFIERS without DogStatsD.
func (s *Settings) unusedStats() []Warning {
	var out []Warning
	if s.DisableStats && s.UsePrometheus {
		out = append(out, Warning{Name: "USE_PROMETHEUS", Unused: true,
			Why: "DISABLE_STATS=true turns every statistics sink off, as with envoyproxy/ratelimit: no Prometheus listener opens (the debug port's /metrics still answers)"})
	}
	if s.PrometheusResponseTimeAsMilliseconds && s.PrometheusMapperYAML != "" {
		out = append(out, Warning{Name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Unused: true,
			Why: "it changes the default mapping only, as with envoyproxy/ratelimit: with PROMETHEUS_MAPPER_YAML the mapping says the unit (timers are in milliseconds, times its scale)"})
	}
	if len(s.UseDogStatsdMogrifiers) > 0 && (!s.UseDogStatsd || s.DisableStats) {
		out = append(out, Warning{Name: "USE_DOG_STATSD_MOGRIFIERS", Unused: true,
			Why: "mogrifiers apply to DogStatsD only: set USE_DOG_STATSD=true (and not DISABLE_STATS)"})
	}
	return out
}

// StatsdSink is where the statistics go: "statsd", "dogstatsd" or ""
// (none), from USE_STATSD, USE_DOG_STATSD and DISABLE_STATS.
func (s *Settings) StatsdSink() string {
	switch {
	case s.DisableStats:
		return ""
	case s.UseDogStatsd:
		return "dogstatsd"
	case s.UseStatsd:
		return "statsd"
	}
	return ""
}

// Mogrifier is one of the anchor's DogStatsD mogrifiers, named in
// USE_DOG_STATSD_MOGRIFIERS and set by DOG_STATSD_MOGRIFIER_<NAME>_PATTERN
// (a regular expression), _NAME (the new name) and _TAGS (key:value,...);
// in the name and the tag values, $0 is the match and $1, $2... its groups.
// A statistic whose name matches is sent under the new name with the tags.
type Mogrifier struct {
	// Key is the name as listed in USE_DOG_STATSD_MOGRIFIERS.
	Key     string
	Pattern *regexp.Regexp
	Name    string
	Tags    map[string]string
}

// Mogrifiers returns the mogrifiers of USE_DOG_STATSD_MOGRIFIERS in the
// order listed there (the first that matches a name applies; the anchor
// tries them in no set order). It is nil unless DogStatsD is in use.
func (s *Settings) Mogrifiers() []Mogrifier { return slices.Clone(s.mogrifiers) }

// loadMogrifiers reads the mogrifiers named by USE_DOG_STATSD_MOGRIFIERS,
// when DogStatsD is in use (the anchor reads them only then), and checks
// them as the anchor does: a PATTERN that compiles, a NAME, and TAGS whose
// keys and values are not empty. Each problem names its variable.
func (s *Settings) loadMogrifiers(lookup func(string) (string, bool)) error {
	if s.StatsdSink() != "dogstatsd" {
		return nil
	}
	var errs []error
	bad := func(name string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("settings: %s: %s", name, fmt.Sprintf(format, args...)))
	}
	for _, key := range s.UseDogStatsdMogrifiers {
		prefix := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(key) + "_"
		m := Mogrifier{Key: key}
		pattern, _ := lookup(prefix + "PATTERN")
		if pattern == "" {
			bad(prefix+"PATTERN", "mogrifier %q of USE_DOG_STATSD_MOGRIFIERS needs a pattern", key)
		} else if re, err := regexp.Compile(pattern); err != nil {
			bad(prefix+"PATTERN", "%v", err)
		} else {
			m.Pattern = re
		}
		if m.Name, _ = lookup(prefix + "NAME"); m.Name == "" {
			bad(prefix+"NAME", "mogrifier %q of USE_DOG_STATSD_MOGRIFIERS needs a name", key)
		}
		if tags, _ := lookup(prefix + "TAGS"); tags != "" {
			m.Tags = map[string]string{}
			// As envconfig reads a map, which the anchor uses: pairs
			// separated by ',', each exactly one key:value.
			for _, pair := range strings.Split(tags, ",") {
				kv := strings.Split(pair, ":")
				switch {
				case len(kv) != 2:
					bad(prefix+"TAGS", "invalid tag %q (want key:value)", pair)
				case kv[0] == "":
					bad(prefix+"TAGS", "tag %q has no key", pair)
				case kv[1] == "":
					bad(prefix+"TAGS", "tag %q has no value", pair)
				default:
					m.Tags[kv[0]] = kv[1]
				}
			}
		}
		s.mogrifiers = append(s.mogrifiers, m)
	}
	return errors.Join(errs...)
}

// Warnings returns the settings of envoyproxy/ratelimit that Load found
// set to a value this service does not honour, and that are harmless to
// go without. The caller logs each once, at startup.
func (s *Settings) Warnings() []Warning { return append([]Warning(nil), s.warnings...) }

// Validate checks values and combinations that the types alone do not.
func (s *Settings) Validate() error {
	var errs []error
	bad := func(name string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("settings: %s: %s", name, fmt.Sprintf(format, args...)))
	}
	s.validateListeners(bad)
	s.validateNames(bad)
	s.validateRules(bad)
	s.validateDecisions(bad)
	s.validateRLQS(bad)
	s.validateStats(bad)
	s.validateTracing(bad)
	s.validateStores(bad)
	return errors.Join(errs...)
}

// problem reports a setting that is not valid: its variable and what is
// wrong with its value.
type problem = func(name, format string, args ...any)

// within reports name unless lo <= v <= hi; span is the range as the
// message writes it ("1..100", "10ms..1m (0: none)").
func within[T cmp.Ordered](bad problem, name string, v, lo, hi T, span string) {
	if v < lo || v > hi {
		bad(name, "%v is outside %s", v, span)
	}
}

// notNegative reports name when v is below zero.
func notNegative[T ~int | ~int64](bad problem, name string, v T) {
	if v < 0 {
		bad(name, "must not be negative")
	}
}

// choose sets *v to fold(*v) when that is one of choices, and otherwise
// reports name as an unknown kind of value, with the choices it wants.
func choose(bad problem, name string, v *string, fold func(string) string, kind, want string, choices ...string) {
	if c := fold(*v); slices.Contains(choices, c) {
		*v = c
		return
	}
	bad(name, "unknown %s %q (want %s)", kind, *v, want)
}

// lowerTrimmed is a setting's value without surrounding space, in lower case.
func lowerTrimmed(v string) string { return strings.ToLower(strings.TrimSpace(v)) }

// validateListeners checks the listeners: ports, gRPC tuning and bounds, TLS
// on the gRPC listener.
func (s *Settings) validateListeners(bad problem) {
	port := func(name string, p int) {
		if p < 0 || p > 65535 {
			bad(name, "port %d out of range 0-65535", p)
		}
	}
	port("PORT", s.Port)
	port("GRPC_PORT", s.GRPCPort)
	port("DEBUG_PORT", s.DebugPort)
	within(bad, "GRPC_NUM_STREAM_WORKERS", s.GRPCNumStreamWorkers, -1, 1<<16, "-1..65536 (-1: one per CPU, 0: a goroutine per request)")
	within(bad, "GRPC_MAX_RECV_MSG_SIZE", s.GRPCMaxRecvMsgSize, minRecvMsgSize, maxRecvMsgSize, fmt.Sprintf("%d..%d bytes", minRecvMsgSize, maxRecvMsgSize))
	within(bad, "GRPC_MAX_CONCURRENT_STREAMS", s.GRPCMaxConcurrentStreams, 0, maxStreams, fmt.Sprintf("0..%d (0: no bound)", maxStreams))
	within(bad, "GRPC_MAX_CONNECTIONS", s.GRPCMaxConnections, 1, maxConnections, fmt.Sprintf("1..%d", maxConnections))
	within(bad, "HTTP_MAX_CONNECTIONS", s.HTTPMaxConnections, 1, maxConnections, fmt.Sprintf("1..%d", maxConnections))
	if s.GRPCMaxConnectionIdle < 0 || s.GRPCMaxConnectionIdle > 0 && s.GRPCMaxConnectionIdle < time.Second {
		bad("GRPC_MAX_CONNECTION_IDLE", "%v: want 0 (never) or at least 1s", s.GRPCMaxConnectionIdle)
	}
	within(bad, "MAX_CONNECTIONS_PER_PEER_PERCENT", s.MaxConnectionsPerPeerPercent, 1, 100, "1..100 (100: no share of its own)")
	if s.GRPCServerUseTLS {
		// The files themselves are read by the server, which names the
		// setting of any it cannot use.
		if s.GRPCServerTLSCert == "" {
			bad("GRPC_SERVER_TLS_CERT", "GRPC_SERVER_USE_TLS=true needs the server certificate's PEM file")
		}
		if s.GRPCServerTLSKey == "" {
			bad("GRPC_SERVER_TLS_KEY", "GRPC_SERVER_USE_TLS=true needs the server private key's PEM file")
		}
	}
	notNegative(bad, "GC_HEADROOM_BYTES", s.GCHeadroomBytes)
	within(bad, "GRPC_READ_BUFFER_SIZE", s.GRPCReadBufferSize, 0, 16<<20, "0..16777216 bytes")
	within(bad, "GRPC_WRITE_BUFFER_SIZE", s.GRPCWriteBufferSize, 0, 16<<20, "0..16777216 bytes")
}

// validateNames checks the settings that name one of a few choices (the
// store, the key format, the logs), and normalises their case.
func (s *Settings) validateNames(bad problem) {
	choose(bad, "BACKEND_TYPE", &s.BackendType, strings.ToLower, "backend", "memory, redis or memcache", BackendMemory, BackendRedis, BackendMemcache)
	choose(bad, "CACHE_KEY_FORMAT", &s.CacheKeyFormat, strings.ToLower, "format", "anchor or escaped", KeyFormatAnchor, KeyFormatEscaped)
	switch strings.ToUpper(s.LogLevel) {
	case "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "FATAL", "PANIC", "TRACE":
	default:
		bad("LOG_LEVEL", "unknown level %q (want debug, info, warn or error)", s.LogLevel)
	}
	choose(bad, "LOG_FORMAT", &s.LogFormat, strings.ToLower, "format", "text or json", "text", "json")
}

// validateRules checks where the rules come from: the files' re-check and
// settle, xDS.
func (s *Settings) validateRules(bad problem) {
	if s.RuntimeRecheckInterval < 0 || (s.RuntimeRecheckInterval > 0 && s.RuntimeRecheckInterval < 100*time.Millisecond) {
		// Each re-check reads and hashes every rule file: keep it rare.
		bad("RUNTIME_RECHECK_INTERVAL", "%v: want 0 (no re-check) or at least 100ms", s.RuntimeRecheckInterval)
	}
	// Below 10ms a writer's ordinary pauses look like its end; above a
	// minute nobody would wait for a reload.
	within(bad, "RUNTIME_QUIET_PERIOD", s.RuntimeQuietPeriod, 10*time.Millisecond, time.Minute, "10ms..1m")
	switch t := strings.ToUpper(strings.TrimSpace(s.ConfigType)); t {
	case "":
		// Set but empty: envconfig keeps the empty value, which means the
		// default as with every other setting.
		s.ConfigType = ConfigTypeFile
	case ConfigTypeFile, ConfigTypeXDS:
		s.ConfigType = t
	default:
		bad("CONFIG_TYPE", "unknown type %q (want FILE or GRPC_XDS_SOTW)", s.ConfigType)
	}
	if _, err := s.XDSNodeMetadata(); err != nil {
		bad("CONFIG_GRPC_XDS_NODE_METADATA", "%v", err)
	}
	if s.ConfigType == ConfigTypeXDS {
		if s.ConfigGRPCXDSServerURL == "" {
			bad("CONFIG_GRPC_XDS_SERVER_URL", "must not be empty with CONFIG_TYPE=GRPC_XDS_SOTW")
		}
		if s.ConfigGRPCXDSNodeID == "" {
			bad("CONFIG_GRPC_XDS_NODE_ID", "must not be empty with CONFIG_TYPE=GRPC_XDS_SOTW: the server keys its rules by it")
		}
	}
	if (s.ConfigGRPCXDSClientTLSCert == "") != (s.ConfigGRPCXDSClientTLSKey == "") {
		bad("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together: set both or neither")
	}
	if s.XDSClientBackoffInitialInterval <= 0 {
		bad("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "must be positive")
	}
	if s.XDSClientBackoffMaxInterval < s.XDSClientBackoffInitialInterval {
		bad("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "%v is below XDS_CLIENT_BACKOFF_INITIAL_INTERVAL (%v)", s.XDSClientBackoffMaxInterval, s.XDSClientBackoffInitialInterval)
	}
	within(bad, "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", s.XDSClientBackoffRandomFactor, 0, 1, "0..1")
	if s.XDSClientMaxMsgSizeInBytes < 0 {
		bad("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "must not be negative (0: gRPC's default of 4 MiB)")
	}
}

// validateDecisions checks what shapes a decision and its answer: near
// limit, jitter, near cache, headers, the request budget and bounds,
// statistics keys, the live view.
func (s *Settings) validateDecisions(bad problem) {
	within(bad, "NEAR_LIMIT_RATIO", s.NearLimitRatio, 0, 1, "0..1")
	notNegative(bad, "EXPIRATION_JITTER_MAX_SECONDS", s.ExpirationJitterMaxSeconds)
	notNegative(bad, "LOCAL_CACHE_SIZE_IN_BYTES", s.LocalCacheSizeInBytes)
	choose(bad, "LIMIT_RESPONSE_HEADERS_STYLE", &s.LimitResponseHeadersStyle, strings.ToLower, "style", "draft03 or ietf", "draft03", "ietf")
	if s.RequestTimeout < 0 {
		bad("REQUEST_TIMEOUT", "must not be negative (0: no bound beyond the caller's deadline)")
	}
	if s.MaxConcurrentRequests < 0 {
		bad("MAX_CONCURRENT_REQUESTS", "must not be negative (0: no bound)")
	}
	if s.StatsMaxDynamicKeys < 1 {
		bad("STATS_MAX_DYNAMIC_KEYS", "must be at least 1")
	}
	within(bad, "STATS_IDLE_EXPIRY", s.StatsIdleExpiry, time.Second, 7*24*time.Hour, "1s..168h")
	choose(bad, "LIVE_VIEW_VALUES", &s.LiveViewValues, strings.ToLower, "value", "plain, hashed or truncated", "plain", "hashed", "truncated")
	for _, h := range s.DebugAllowedHosts {
		if strings.ContainsAny(h, "/:@ \t") {
			bad("DEBUG_ALLOWED_HOSTS", "%q is not a host name (want names separated by commas, without ports, or *)", h)
		}
	}
	within(bad, "LIVE_VIEW_MAX_KEYS", s.LiveViewMaxKeys, 16, 65536, "16..65536")
	within(bad, "CAPTURE_MAX_BYTES", s.CaptureMaxBytes, 1<<20, 64<<30, "1048576..68719476736 (1 MiB..64 GiB)")
}

// validateStats checks the statsd sink.
func (s *Settings) validateStats(bad problem) {
	if s.StatsdPort < 1 || s.StatsdPort > 65535 {
		bad("STATSD_PORT", "port %d out of range 1-65535", s.StatsdPort)
	}
	choose(bad, "STATSD_PROTOCOL", &s.StatsdProtocol, lowerTrimmed, "protocol", "udp or tcp", "udp", "udp4", "udp6", "tcp", "tcp4", "tcp6")
	if s.StatsFlushInterval < 10*time.Millisecond {
		// The anchor's ticker panics on 0; below 10ms a flush would run
		// more often than it could be useful.
		bad("STATS_FLUSH_INTERVAL", "%v: want at least 10ms", s.StatsFlushInterval)
	}
}

// validateStores checks the stores: memory, breakers, failure mode,
// Memcached, Redis.
func (s *Settings) validateStores(bad problem) {
	if s.MemoryMaxBytes < 1<<20 {
		bad("MEMORY_MAX_BYTES", "%d is below the minimum of 1048576 (1 MiB)", s.MemoryMaxBytes)
	}
	notNegative(bad, "MEMORY_MAX_KEYS", s.MemoryMaxKeys)
	within(bad, "STORE_BREAKER_FAILURES", s.StoreBreakerFailures, 0, maxBreakerFailures, fmt.Sprintf("0..%d (0: no breaker)", maxBreakerFailures))
	// Below 10ms the probes of every instance would load a server that has
	// just come back; above a minute recovery would wait.
	within(bad, "STORE_BREAKER_PROBE_INTERVAL", s.StoreBreakerProbeInterval, 10*time.Millisecond, time.Minute, "10ms..1m")
	if s.RedisStallTimeout != 0 && (s.RedisStallTimeout < 10*time.Millisecond || s.RedisStallTimeout > time.Minute) {
		// Below 10ms a healthy Redis's reply behind a busy moment would
		// be taken for silence.
		bad("REDIS_STALL_TIMEOUT", "%v is outside 10ms..1m (0: no bound but REDIS_TIMEOUT)", s.RedisStallTimeout)
	}
	choose(bad, "STORE_FAILURE_MODE", &s.StoreFailureMode, strings.ToLower, "mode", "error or local", FailureModeError, FailureModeLocal)
	if s.WriteBehindInterval != 0 {
		// Above a minute the bound on over-admission would be a minute's hits.
		within(bad, "WRITE_BEHIND_INTERVAL", s.WriteBehindInterval, time.Millisecond, time.Minute, "1ms..1m (0: off)")
		if s.BackendType == BackendMemory {
			bad("WRITE_BEHIND_INTERVAL", "needs BACKEND_TYPE redis or memcache: the memory store counts locally already")
		}
	}
	within(bad, "WRITE_BEHIND_MAX_KEYS", s.WriteBehindMaxKeys, 1, 10_000_000, "1..10000000")
	s.validateRemoteStores(bad)
}

// validateRemoteStores checks the Memcached and Redis settings.
func (s *Settings) validateRemoteStores(bad problem) {
	if s.BackendType == BackendMemcache {
		switch hosts := len(s.MemcacheHostPort) > 0; {
		case hosts && s.MemcacheSrv != "":
			bad("MEMCACHE_HOST_PORT", "set together with MEMCACHE_SRV; set one of them")
		case !hosts && s.MemcacheSrv == "":
			bad("MEMCACHE_HOST_PORT", "BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT (host:port,...) or MEMCACHE_SRV")
		}
	}
	// A client certificate without its key (or the reverse) cannot be
	// used: stop at start, naming the store's own settings.
	for _, pair := range []struct {
		on        bool
		cert, key string
		prefix    string
	}{
		{s.RedisTLS || s.RedisPerSecondTLS, s.RedisTLSClientCert, s.RedisTLSClientKey, "REDIS_TLS_CLIENT_"},
		{s.MemcacheTLS, s.MemcacheTLSClientCert, s.MemcacheTLSClientKey, "MEMCACHE_TLS_CLIENT_"},
	} {
		if pair.on && (pair.cert == "") != (pair.key == "") {
			bad(pair.prefix+"CERT", "%sCERT and %sKEY go together: set both or neither", pair.prefix, pair.prefix)
		}
	}
	notNegative(bad, "MEMCACHE_SRV_REFRESH", s.MemcacheSrvRefresh)
	notNegative(bad, "MEMCACHE_MAX_IDLE_CONNS", s.MemcacheMaxIdleConns)
	if s.MemcacheConnections < 1 || s.MemcacheConnections > 8 {
		bad("MEMCACHE_CONNECTIONS", "must be 1 to 8")
	}
	if s.MemcacheMaxInFlight < 1 {
		bad("MEMCACHE_MAX_IN_FLIGHT", "must be at least 1")
	}
	for _, r := range []struct {
		name, socket, typ, url string
		timeout                time.Duration
		pool                   int
		used                   bool
	}{
		{"REDIS", s.RedisSocketType, s.RedisType, s.RedisURL, s.RedisTimeout, s.RedisPoolSize, s.BackendType == BackendRedis},
		{"REDIS_PERSECOND", s.RedisPerSecondSocketType, s.RedisPerSecondType, s.RedisPerSecondURL, s.RedisPerSecondTimeout, s.RedisPerSecondPoolSize,
			s.BackendType == BackendRedis && s.RedisPerSecond},
	} {
		switch r.socket {
		case "tcp", "unix":
		default:
			bad(r.name+"_SOCKET_TYPE", "unknown socket type %q (want tcp or unix)", r.socket)
		}
		// The socket type is unix by default, as in the anchor, and
		// only SINGLE dials with it: a TCP address there would fail
		// at every dial with "dial unix host:port: no such file or
		// directory".
		if r.used && r.socket == "unix" && strings.EqualFold(r.typ, "SINGLE") && tcpAddress(r.url) {
			bad(r.name+"_URL", "%q is a TCP address, but %s_SOCKET_TYPE is unix (its default, as in envoyproxy/ratelimit): set %s_SOCKET_TYPE=tcp",
				r.url, r.name, r.name)
		}
		switch strings.ToUpper(r.typ) {
		case "SINGLE", "SENTINEL", "CLUSTER":
		default:
			bad(r.name+"_TYPE", "unknown type %q (want SINGLE, SENTINEL or CLUSTER)", r.typ)
		}
		if r.timeout <= 0 {
			bad(r.name+"_TIMEOUT", "must be positive")
		}
		if r.pool <= 0 {
			bad(r.name+"_POOL_SIZE", "must be positive")
		}
	}
}

// tcpAddress reports whether a REDIS_URL is a TCP address, host:port or a
// redis:// or rediss:// URL, rather than a socket path: a path names no
// port, or holds a '/'.
func tcpAddress(addr string) bool {
	lower := strings.ToLower(addr)
	if strings.HasPrefix(lower, "redis://") || strings.HasPrefix(lower, "rediss://") {
		return true
	}
	if strings.Contains(addr, "/") {
		return false
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// Values of RLQS_ENABLED.
const (
	RLQSAuto = ""
	RLQSOn   = "true"
	RLQSOff  = "false"
)

// validateRLQS checks the RLQS_* settings.
func (s *Settings) validateRLQS(bad problem) {
	switch v := strings.ToLower(strings.TrimSpace(s.RLQSEnabled)); v {
	case RLQSAuto, RLQSOn, RLQSOff:
		s.RLQSEnabled = v
	default:
		bad("RLQS_ENABLED", "%q: want true, false, or empty (on while the rules have quota_buckets)", s.RLQSEnabled)
	}
	if ttl := s.RLQSAssignmentTTL; ttl < 2*time.Second || ttl > time.Hour || ttl%time.Second != 0 {
		// Envoy reads whole seconds only, and must hear again before
		// the TTL ends: its reports come every 5 s.
		bad("RLQS_ASSIGNMENT_TTL", "%v: want whole seconds from 2s to 1h", ttl)
	}
	if d := s.RLQSIdleTimeout; d < 0 || (d > 0 && d < 10*time.Second) {
		bad("RLQS_IDLE_TIMEOUT", "%v: want 0 (never) or at least 10s", d)
	}
	within(bad, "RLQS_MAX_STREAMS", s.RLQSMaxStreams, 1, 1_000_000, "1..1000000")
	within(bad, "RLQS_MAX_BUCKETS", s.RLQSMaxBuckets, 1, 10_000_000, "1..10000000")
	within(bad, "RLQS_MAX_BUCKETS_PER_STREAM", s.RLQSMaxBucketsPerStream, 1, s.RLQSMaxBuckets, fmt.Sprintf("1..RLQS_MAX_BUCKETS (%d)", s.RLQSMaxBuckets))
	// Left unset, the per-peer shares follow the bounds they share.
	if _, set := os.LookupEnv("RLQS_MAX_STREAMS_PER_PEER"); !set {
		s.RLQSMaxStreamsPerPeer = min(s.RLQSMaxStreamsPerPeer, s.RLQSMaxStreams)
	}
	if _, set := os.LookupEnv("RLQS_MAX_BUCKETS_PER_PEER"); !set {
		s.RLQSMaxBucketsPerPeer = max(s.RLQSMaxBucketsPerStream, min(s.RLQSMaxBucketsPerPeer, s.RLQSMaxBuckets))
	}
	within(bad, "RLQS_MAX_STREAMS_PER_PEER", s.RLQSMaxStreamsPerPeer, 1, s.RLQSMaxStreams, fmt.Sprintf("1..RLQS_MAX_STREAMS (%d)", s.RLQSMaxStreams))
	within(bad, "RLQS_MAX_BUCKETS_PER_PEER", s.RLQSMaxBucketsPerPeer, s.RLQSMaxBucketsPerStream, s.RLQSMaxBuckets,
		fmt.Sprintf("RLQS_MAX_BUCKETS_PER_STREAM..RLQS_MAX_BUCKETS (%d..%d)", s.RLQSMaxBucketsPerStream, s.RLQSMaxBuckets))
}

// Values of TRACING_EXPORTER_PROTOCOL.
const (
	TracingHTTP = "http"
	TracingGRPC = "grpc"
)

// validateTracing checks the TRACING_* settings, and the OTLP endpoint
// when tracing is on: a malformed one would have the SDK log an error and
// send every span to localhost instead, for as long as the process runs.
func (s *Settings) validateTracing(bad problem) {
	switch p := strings.ToLower(strings.TrimSpace(s.TracingExporterProtocol)); p {
	case "":
		// Set but empty: the anchor's default.
		s.TracingExporterProtocol = TracingHTTP
	case TracingHTTP, TracingGRPC:
		s.TracingExporterProtocol = p
	default:
		bad("TRACING_EXPORTER_PROTOCOL", "unknown protocol %q (want http or grpc)", s.TracingExporterProtocol)
	}
	if r := s.TracingSamplingRate; !(r >= 0 && r <= 1) {
		bad("TRACING_SAMPLING_RATE", "%v is outside 0..1", r)
	}
	if s.TracingEnabled && s.TracingServiceName == "" {
		bad("TRACING_SERVICE_NAME", "must not be empty with TRACING_ENABLED=true")
	}
	if !s.TracingEnabled || s.OTLPEndpoint == "" {
		return
	}
	// The OTLP specification wants a URL with a scheme for both
	// protocols; the scheme says whether the connection is TLS.
	u, err := url.Parse(s.OTLPEndpoint)
	switch {
	case err != nil:
		bad("OTEL_EXPORTER_OTLP_ENDPOINT", "not a URL: %v", err)
	case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		bad("OTEL_EXPORTER_OTLP_ENDPOINT", "want http://host:port or https://host:port")
	}
}

// unusedTracing warns about an OTLP endpoint set while tracing is off:
// whoever set it expects spans there.
func (s *Settings) unusedTracing(lookup func(string) (string, bool)) []Warning {
	if v, ok := lookup("OTEL_EXPORTER_OTLP_ENDPOINT"); s.TracingEnabled || !ok || v == "" {
		return nil
	}
	return []Warning{{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Unused: true, Why: "tracing is off: set TRACING_ENABLED=true to send spans there"}}
}

// JSONLogsRequested reports whether LOG_FORMAT asks for JSON lines, in any
// case. It reads that variable alone, so that when Load fails on another
// setting its error can still be printed in the format asked for.
func JSONLogsRequested() bool { return strings.EqualFold(os.Getenv("LOG_FORMAT"), "json") }

// XDSNodeMetadata returns CONFIG_GRPC_XDS_NODE_METADATA as a map: pairs
// separated by commas, each key=value. The anchor's code reads key=value
// and its documentation shows key:value, so a pair without '=' is split at
// its first ':'. Empty pairs are skipped; a pair with neither, or with an
// empty key, is an error (the anchor drops it without a word).
func (s *Settings) XDSNodeMetadata() (map[string]string, error) {
	if strings.TrimSpace(s.ConfigGRPCXDSNodeMetadata) == "" {
		return nil, nil
	}
	md := map[string]string{}
	for i, pair := range strings.Split(s.ConfigGRPCXDSNodeMetadata, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			k, v, ok = strings.Cut(pair, ":")
		}
		if !ok || k == "" {
			return nil, fmt.Errorf("pair %d: want key=value", i+1)
		}
		md[k] = v
	}
	return md, nil
}

// RulesRoot is RUNTIME_ROOT, or the working directory when it is empty.
func (s *Settings) RulesRoot() string {
	if s.RuntimeRoot != "" {
		return s.RuntimeRoot
	}
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	return wd
}
