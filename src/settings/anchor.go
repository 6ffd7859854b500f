package settings

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Status says how this service treats one environment variable of
// envoyproxy/ratelimit.
type Status uint8

// The statuses of the anchor's settings. A setting of our own, which the
// anchor does not have, has none: it is only in Settings.
const (
	// Same: implemented with the anchor's meaning and default.
	Same Status = iota + 1
	// Different: implemented, with a default or a behaviour that differs
	// on purpose (docs/SETTINGS.md says how).
	Different
	// Warned: not implemented. Going without it changes neither security
	// nor the rules in force (a statistics mapping, tuning of a client we
	// do not use), so a value that asks for it is accepted with
	// one warning at startup.
	Warned
	// Refused: not implemented, and going without it would make the
	// service less secure or apply other rules than the ones asked for (a
	// plaintext listener where TLS was asked, file rules where xDS rules
	// were), so a value that asks for it makes startup fail.
	Refused
)

// String returns the status as docs/SETTINGS.md writes it.
func (s Status) String() string {
	switch s {
	case Same:
		return "same"
	case Different:
		return "different on purpose"
	case Warned:
		return "not yet (warns)"
	case Refused:
		return "not yet (refuses)"
	}
	return "unknown"
}

// AnchorSetting is one environment variable of envoyproxy/ratelimit (an
// envconfig name of its Settings struct) and how this service treats it.
type AnchorSetting struct {
	// Name is the variable.
	Name string
	// Status is how this service treats it.
	Status Status
	// Default is the anchor's default value, as its envconfig tag writes
	// it ("" when it has none).
	Default string
	// Why, for a setting that is not implemented, says what this service
	// does instead; it ends the warning or the error.
	Why string
	// honoured, for a setting that is not implemented, reports whether a
	// value asks for nothing this service lacks (CONFIG_TYPE=FILE,
	// USE_STATSD=false): such a value is accepted silently. Nil means
	// only the empty value is. An empty value is always accepted, as
	// envconfig reads it as the default.
	honoured func(string) bool
}

// Warning is a setting that is set and ignored: one of the anchor's that
// is not implemented and harmless to go without, or (Unused) one that is
// implemented but has no effect with the other settings, as in the anchor.
type Warning struct {
	// Name is the variable.
	Name string
	// Why says what this service does instead.
	Why string
	// Unused is true for an implemented setting without effect.
	Unused bool
}

// Message is the line to log for the warning; Name and Why go with it.
func (w Warning) Message() string {
	if w.Unused {
		return "setting has no effect; ignored"
	}
	return "setting of envoyproxy/ratelimit not implemented; ignored"
}

// isFalse honours a boolean setting that is off.
func isFalse(v string) bool {
	b, err := strconv.ParseBool(v)
	return err == nil && !b
}

// oneOf honours the listed values, in any case.
func oneOf(values ...string) func(string) bool {
	return func(v string) bool {
		return slices.ContainsFunc(values, func(want string) bool { return strings.EqualFold(strings.TrimSpace(v), want) })
	}
}

// anchorSettings is every envconfig name of envoyproxy/ratelimit's
// settings that we know of: the union of its recent versions (a few
// settings come and go between them, such as PROTO), each with our status.
// A new setting of the anchor gets a line here and a row in
// docs/SETTINGS.md; TestSettingsDocument fails until both exist.
var anchorSettings = []AnchorSetting{
	// Listeners.
	{Name: "HOST", Status: Same, Default: "0.0.0.0"},
	{Name: "PORT", Status: Same, Default: "8080"},
	{Name: "DEBUG_HOST", Status: Different, Default: "0.0.0.0"},
	{Name: "DEBUG_PORT", Status: Same, Default: "6070"},
	{Name: "GRPC_HOST", Status: Same, Default: "0.0.0.0"},
	{Name: "GRPC_PORT", Status: Same, Default: "8081"},
	{Name: "GRPC_UDS", Status: Different},
	{Name: "GRPC_MAX_CONNECTION_AGE", Status: Same, Default: "24h"},
	{Name: "GRPC_MAX_CONNECTION_AGE_GRACE", Status: Same, Default: "1h"},
	{Name: "PROTO", Status: Warned, Default: "tcp", honoured: oneOf("tcp"),
		Why: "the listeners are TCP, or a unix socket with GRPC_UDS"},
	// GRPC_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_REQUESTS and
	// REQUEST_TIMEOUT are ours: the anchor has none of them (docs/SETTINGS.md,
	// MAX_CONCURRENT_REQUESTS, says what we read).

	// TLS on the gRPC listener. The anchor also trusts the system's CAs
	// for client certificates; only GRPC_CLIENT_TLS_CACERT's are trusted
	// here. GRPC_SERVER_TLS_CA_CERT, which Envoy Gateway sets, is no
	// setting of the anchor's: it is ignored silently, as there.
	{Name: "GRPC_SERVER_USE_TLS", Status: Different, Default: "false"}, // /json over TLS only
	{Name: "GRPC_SERVER_TLS_CERT", Status: Same},
	{Name: "GRPC_SERVER_TLS_KEY", Status: Same},
	{Name: "GRPC_CLIENT_TLS_CACERT", Status: Different},
	{Name: "GRPC_CLIENT_TLS_SAN", Status: Same},

	// Logs.
	{Name: "LOG_LEVEL", Status: Same, Default: "WARN"},
	{Name: "LOG_FORMAT", Status: Same, Default: "text"},

	// Where the rules come from.
	{Name: "CONFIG_TYPE", Status: Same, Default: "FILE"},
	{Name: "FORCE_START_WITHOUT_INITIAL_CONFIG", Status: Different, Default: "false"},
	{Name: "CONFIG_GRPC_XDS_NODE_ID", Status: Same, Default: "default"},
	{Name: "CONFIG_GRPC_XDS_NODE_METADATA", Status: Different},
	{Name: "CONFIG_GRPC_XDS_SERVER_URL", Status: Same, Default: "localhost:18000"},
	{Name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Status: Different, Default: "3s"},
	{Name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Status: Same},
	{Name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", Status: Same, Default: "false"},
	{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Status: Same},
	{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Status: Same},
	{Name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Status: Same},
	{Name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", Status: Same},
	{Name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Status: Same, Default: "10s"},
	{Name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", Status: Same, Default: "60s"},
	{Name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Status: Same, Default: "0.5"},
	{Name: "XDS_CLIENT_BACKOFF_JITTER", Status: Same, Default: "true"},
	{Name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Status: Same},
	{Name: "DESCRIPTOR_KEY_CONFIG", Status: Refused,
		Why: "choosing which descriptor values enter the cache keys of limit overrides is not implemented, so overridden limits would count under other keys than asked: unset DESCRIPTOR_KEY_CONFIG"},

	// Statistics. STATSD_PROTOCOL is read by gostats rather than by the
	// anchor's settings, as its sink is built.
	{Name: "USE_STATSD", Status: Same, Default: "true"},
	{Name: "STATSD_HOST", Status: Same, Default: "localhost"},
	{Name: "STATSD_PORT", Status: Same, Default: "8125"},
	{Name: "STATSD_PROTOCOL", Status: Same, Default: "tcp"},
	{Name: "STATS_FLUSH_INTERVAL", Status: Same, Default: "10s"},
	{Name: "EXTRA_TAGS", Status: Same},
	{Name: "USE_DOG_STATSD", Status: Same, Default: "false"},
	{Name: "USE_DOG_STATSD_MOGRIFIERS", Status: Same},
	{Name: "DISABLE_STATS", Status: Same, Default: "false"},
	{Name: "USE_PROMETHEUS", Status: Same, Default: "false"},
	{Name: "PROMETHEUS_ADDR", Status: Same, Default: ":9090"},
	{Name: "PROMETHEUS_PATH", Status: Same, Default: "/metrics"},
	{Name: "PROMETHEUS_MAPPER_YAML", Status: Same},
	{Name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Status: Same, Default: "false"},

	// Tracing. OTEL_EXPORTER_OTLP_ENDPOINT is read by the OpenTelemetry
	// SDK rather than by the anchor's settings, and set by Envoy
	// Gateway's Deployment when tracing is on.
	{Name: "TRACING_ENABLED", Status: Same, Default: "false"},
	{Name: "TRACING_SERVICE_NAME", Status: Same, Default: "RateLimit"},
	{Name: "TRACING_SERVICE_NAMESPACE", Status: Same},
	{Name: "TRACING_SERVICE_INSTANCE_ID", Status: Same},
	{Name: "TRACING_EXPORTER_PROTOCOL", Status: Same, Default: "http"},
	{Name: "TRACING_SAMPLING_RATE", Status: Same, Default: "1"},
	{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Status: Same},

	// Rules on disk.
	{Name: "RUNTIME_ROOT", Status: Different, Default: "/srv/runtime_data/current"},
	{Name: "RUNTIME_SUBDIRECTORY", Status: Same},
	{Name: "RUNTIME_APPDIRECTORY", Status: Same, Default: "config"},
	{Name: "RUNTIME_IGNOREDOTFILES", Status: Same, Default: "false"},
	{Name: "RUNTIME_WATCH_ROOT", Status: Different, Default: "true"},
	{Name: "MERGE_DOMAIN_CONFIG", Status: Same, Default: "false"},
	{Name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Status: Same, Default: "false"},

	// Decisions.
	{Name: "BACKEND_TYPE", Status: Different, Default: "redis"},
	{Name: "EXPIRATION_JITTER_MAX_SECONDS", Status: Same, Default: "300"},
	{Name: "LOCAL_CACHE_SIZE_IN_BYTES", Status: Same, Default: "0"},
	{Name: "NEAR_LIMIT_RATIO", Status: Same, Default: "0.8"},
	{Name: "CACHE_KEY_PREFIX", Status: Same},
	{Name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Status: Same, Default: "false"},
	{Name: "SHADOW_MODE", Status: Same, Default: "false"},
	{Name: "QUOTA_MODE", Status: Same, Default: "false"},
	{Name: "RESPONSE_DYNAMIC_METADATA", Status: Same, Default: "false"},
	{Name: "LIMIT_RESPONSE_HEADERS_ENABLED", Status: Same, Default: "false"},
	{Name: "LIMIT_LIMIT_HEADER", Status: Same, Default: "RateLimit-Limit"},
	{Name: "LIMIT_REMAINING_HEADER", Status: Same, Default: "RateLimit-Remaining"},
	{Name: "LIMIT_RESET_HEADER", Status: Same, Default: "RateLimit-Reset"},

	// Redis.
	{Name: "REDIS_SOCKET_TYPE", Status: Same, Default: "unix"},
	{Name: "REDIS_TYPE", Status: Same, Default: "SINGLE"},
	{Name: "REDIS_URL", Status: Same, Default: "/var/run/nutcracker/ratelimit.sock"},
	{Name: "REDIS_POOL_SIZE", Status: Same, Default: "10"},
	{Name: "REDIS_AUTH", Status: Same},
	{Name: "REDIS_SENTINEL_AUTH", Status: Same},
	{Name: "REDIS_TLS", Status: Same, Default: "false"},
	{Name: "REDIS_TLS_CLIENT_CERT", Status: Same},
	{Name: "REDIS_TLS_CLIENT_KEY", Status: Same},
	{Name: "REDIS_TLS_CACERT", Status: Same},
	{Name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Status: Same, Default: "false"},
	{Name: "REDIS_PIPELINE_WINDOW", Status: Same, Default: "0"},
	{Name: "REDIS_PIPELINE_LIMIT", Status: Same, Default: "0"},
	{Name: "REDIS_TIMEOUT", Status: Same, Default: "10s"},
	{Name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Status: Same, Default: "false"},
	{Name: "REDIS_STARTUP_INITIAL_INTERVAL", Status: Same, Default: "1s"},
	{Name: "REDIS_STARTUP_MAX_INTERVAL", Status: Same, Default: "30s"},
	{Name: "REDIS_STARTUP_MAX_ELAPSED_TIME", Status: Same, Default: "0"},
	{Name: "REDIS_USE_EXPLICIT_PIPELINE", Status: Warned, Default: "false", honoured: isFalse,
		Why: "the commands of concurrent requests are always pipelined together (see docs/STORES.md, Redis)"},
	{Name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", Status: Warned, Default: "WAIT", honoured: oneOf("WAIT"),
		Why: "a request waits for a connection (WAIT), within REDIS_TIMEOUT"},
	{Name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", Status: Warned, Default: "1",
		Why: "the parts of a pipeline for several Cluster nodes are always sent in parallel"},
	{Name: "REDIS_PERSECOND", Status: Same, Default: "false"},
	{Name: "REDIS_PERSECOND_SOCKET_TYPE", Status: Same, Default: "unix"},
	{Name: "REDIS_PERSECOND_TYPE", Status: Same, Default: "SINGLE"},
	{Name: "REDIS_PERSECOND_URL", Status: Same, Default: "/var/run/nutcracker/ratelimitpersecond.sock"},
	{Name: "REDIS_PERSECOND_POOL_SIZE", Status: Same, Default: "10"},
	{Name: "REDIS_PERSECOND_AUTH", Status: Same},
	{Name: "REDIS_PERSECOND_SENTINEL_AUTH", Status: Same},
	{Name: "REDIS_PERSECOND_TLS", Status: Same, Default: "false"},
	{Name: "REDIS_PERSECOND_PIPELINE_WINDOW", Status: Same, Default: "0"},
	{Name: "REDIS_PERSECOND_PIPELINE_LIMIT", Status: Same, Default: "0"},
	{Name: "REDIS_PERSECOND_TIMEOUT", Status: Same, Default: "10s"},
	{Name: "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE", Status: Warned, Default: "false", honoured: isFalse,
		Why: "the commands of concurrent requests are always pipelined together (see docs/STORES.md, Redis)"},
	{Name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", Status: Warned, Default: "WAIT", honoured: oneOf("WAIT"),
		Why: "a request waits for a connection (WAIT), within REDIS_PERSECOND_TIMEOUT"},
	{Name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", Status: Warned, Default: "1",
		Why: "the parts of a pipeline for several Cluster nodes are always sent in parallel"},

	// Memcached.
	{Name: "MEMCACHE_HOST_PORT", Status: Same},
	{Name: "MEMCACHE_MAX_IDLE_CONNS", Status: Same, Default: "2"},
	{Name: "MEMCACHE_SRV", Status: Same},
	{Name: "MEMCACHE_SRV_REFRESH", Status: Same, Default: "0"},
	{Name: "MEMCACHE_TLS", Status: Same, Default: "false"},
	{Name: "MEMCACHE_TLS_CLIENT_CERT", Status: Same},
	{Name: "MEMCACHE_TLS_CLIENT_KEY", Status: Same},
	{Name: "MEMCACHE_TLS_CACERT", Status: Same},
	{Name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Status: Same, Default: "false"},
}

// AnchorSettings returns every environment variable of
// envoyproxy/ratelimit that this service knows, with its status, sorted
// by name.
func AnchorSettings() []AnchorSetting {
	out := append([]AnchorSetting(nil), anchorSettings...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// checkAnchor looks up every setting of the anchor that is not
// implemented. A value that asks for a Refused one is an error naming it;
// one that asks for a Warned one gives a Warning. Values are not repeated
// in warnings: some of these settings hold credentials (xDS headers).
func checkAnchor(lookup func(string) (string, bool)) ([]Warning, []error) {
	var warnings []Warning
	var errs []error
	for _, a := range AnchorSettings() {
		if a.Status != Warned && a.Status != Refused {
			continue
		}
		v, ok := lookup(a.Name)
		if !ok || v == "" || (a.honoured != nil && a.honoured(v)) {
			continue
		}
		if a.Status == Refused {
			errs = append(errs, fmt.Errorf("settings: %s=%s is not supported: %s", a.Name, v, a.Why))
			continue
		}
		warnings = append(warnings, Warning{Name: a.Name, Why: a.Why})
	}
	return warnings, errs
}
