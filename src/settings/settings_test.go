package settings

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		got  any
		want any
	}{
		{"PORT", s.Port, 8080},
		{"GRPC_PORT", s.GRPCPort, 8081},
		{"DEBUG_PORT", s.DebugPort, 6070},
		{"HOST", s.Host, "0.0.0.0"},
		{"GRPC_HOST", s.GRPCHost, "0.0.0.0"},
		{"DEBUG_HOST", s.DebugHost, "127.0.0.1"},
		{"BACKEND_TYPE", s.BackendType, "memory"},
		{"RUNTIME_APPDIRECTORY", s.RuntimeAppDirectory, "config"},
		{"RUNTIME_WATCH_ROOT", s.RuntimeWatchRoot, true},
		{"NEAR_LIMIT_RATIO", s.NearLimitRatio, 0.8},
		{"LOG_LEVEL", s.LogLevel, "WARN"},
		{"LOG_FORMAT", s.LogFormat, "text"},
		{"LIMIT_LIMIT_HEADER", s.LimitLimitHeader, "RateLimit-Limit"},
		{"LIMIT_REMAINING_HEADER", s.LimitRemainingHeader, "RateLimit-Remaining"},
		{"LIMIT_RESET_HEADER", s.LimitResetHeader, "RateLimit-Reset"},
		{"GRPC_MAX_CONNECTION_AGE", s.GRPCMaxConnectionAge, 24 * time.Hour},
		{"GRPC_MAX_CONNECTION_AGE_GRACE", s.GRPCMaxConnectionAgeGrace, time.Hour},
		{"REDIS_TYPE", s.RedisType, "SINGLE"},
		{"REDIS_POOL_SIZE", s.RedisPoolSize, 10},
		{"EXPIRATION_JITTER_MAX_SECONDS", s.ExpirationJitterMaxSeconds, int64(300)},
		{"GRPC_MAX_RECV_MSG_SIZE", s.GRPCMaxRecvMsgSize, 65536},
		{"GRPC_MAX_CONCURRENT_STREAMS", s.GRPCMaxConcurrentStreams, 1024},
		{"GRPC_MAX_CONNECTIONS", s.GRPCMaxConnections, 10000},
		{"HTTP_MAX_CONNECTIONS", s.HTTPMaxConnections, 1024},
		{"GRPC_NUM_STREAM_WORKERS", s.GRPCNumStreamWorkers, 64},
		{"GRPC_READ_BUFFER_SIZE", s.GRPCReadBufferSize, 32768},
		{"GRPC_WRITE_BUFFER_SIZE", s.GRPCWriteBufferSize, 32768},
		{"GRPC_SHARED_WRITE_BUFFER", s.GRPCSharedWriteBuffer, false},
		{"GC_HEADROOM_BYTES", s.GCHeadroomBytes, int64(32 << 20)},
		{"MEMCACHE_MAX_IDLE_CONNS", s.MemcacheMaxIdleConns, 2},
		{"MEMCACHE_CONNECTIONS", s.MemcacheConnections, 2},
		{"MEMCACHE_MAX_IN_FLIGHT", s.MemcacheMaxInFlight, 128},
		{"MEMCACHE_SRV_REFRESH", s.MemcacheSrvRefresh, time.Duration(0)},
		{"MEMCACHE_TLS", s.MemcacheTLS, false},
		{"RUNTIME_RECHECK_INTERVAL", s.RuntimeRecheckInterval, time.Minute},
		{"MEMORY_MAX_BYTES", s.MemoryMaxBytes, int64(64 << 20)},
		{"LIVE_VIEW_ENABLED", s.LiveViewEnabled, true},
		{"LIVE_VIEW_MAX_KEYS", s.LiveViewMaxKeys, 1024},
		{"MEMORY_MAX_KEYS", s.MemoryMaxKeys, 0},
		{"CACHE_KEY_FORMAT", s.CacheKeyFormat, "anchor"},
		{"RUNTIME_QUIET_PERIOD", s.RuntimeQuietPeriod, time.Second},
		{"RUNTIME_ALLOW_EMPTY_RELOAD", s.RuntimeAllowEmptyReload, false},
		{"STORE_BREAKER_FAILURES", s.StoreBreakerFailures, 5},
		{"STORE_BREAKER_PROBE_INTERVAL", s.StoreBreakerProbeInterval, 500 * time.Millisecond},
		{"STORE_FAILURE_MODE", s.StoreFailureMode, "error"},
		{"WRITE_BEHIND_INTERVAL", s.WriteBehindInterval, time.Duration(0)},
		{"WRITE_BEHIND_MAX_KEYS", s.WriteBehindMaxKeys, 100000},
		{"REDIS_STALL_TIMEOUT", s.RedisStallTimeout, 250 * time.Millisecond},
		{"RLQS_ENABLED", s.RLQSEnabled, ""},
		{"RLQS_ASSIGNMENT_TTL", s.RLQSAssignmentTTL, 15 * time.Second},
		{"RLQS_IDLE_TIMEOUT", s.RLQSIdleTimeout, time.Minute},
		{"RLQS_MAX_STREAMS", s.RLQSMaxStreams, 1024},
		{"RLQS_MAX_BUCKETS", s.RLQSMaxBuckets, 100000},
		{"RLQS_MAX_BUCKETS_PER_STREAM", s.RLQSMaxBucketsPerStream, 10000},
		{"RLQS_MAX_STREAMS_PER_PEER", s.RLQSMaxStreamsPerPeer, 16},
		{"RLQS_MAX_BUCKETS_PER_PEER", s.RLQSMaxBucketsPerPeer, 20000},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestMalformedValuesNameTheVariable(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		wants []string
	}{
		{"port_not_a_number", map[string]string{"PORT": "abc"}, []string{"PORT"}},
		{"unknown_backend", map[string]string{"BACKEND_TYPE": "foo"}, []string{"BACKEND_TYPE", "foo"}},
		{"bad_bool", map[string]string{"SHADOW_MODE": "maybe"}, []string{"SHADOW_MODE"}},
		{"bad_duration", map[string]string{"GRPC_MAX_CONNECTION_AGE": "soon"}, []string{"GRPC_MAX_CONNECTION_AGE"}},
		{"port_out_of_range", map[string]string{"GRPC_PORT": "70000"}, []string{"GRPC_PORT"}},
		{"ratio_above_one", map[string]string{"NEAR_LIMIT_RATIO": "1.5"}, []string{"NEAR_LIMIT_RATIO"}},
		{"log_format", map[string]string{"LOG_FORMAT": "xml"}, []string{"LOG_FORMAT"}},
		{"stream_workers", map[string]string{"GRPC_NUM_STREAM_WORKERS": "-2"}, []string{"GRPC_NUM_STREAM_WORKERS", "-1..65536"}},
		{"read_buffer", map[string]string{"GRPC_READ_BUFFER_SIZE": "-1"}, []string{"GRPC_READ_BUFFER_SIZE"}},
		{"write_buffer", map[string]string{"GRPC_WRITE_BUFFER_SIZE": "99999999"}, []string{"GRPC_WRITE_BUFFER_SIZE"}},
		{"recv_msg_size_above_grpc_default", map[string]string{"GRPC_MAX_RECV_MSG_SIZE": "4194305"}, []string{"GRPC_MAX_RECV_MSG_SIZE", "1024..4194304"}},
		{"recv_msg_size_tiny", map[string]string{"GRPC_MAX_RECV_MSG_SIZE": "100"}, []string{"GRPC_MAX_RECV_MSG_SIZE"}},
		{"concurrent_streams_negative", map[string]string{"GRPC_MAX_CONCURRENT_STREAMS": "-1"}, []string{"GRPC_MAX_CONCURRENT_STREAMS", "0: no bound"}},
		{"grpc_connections_zero", map[string]string{"GRPC_MAX_CONNECTIONS": "0"}, []string{"GRPC_MAX_CONNECTIONS"}},
		{"http_connections_negative", map[string]string{"HTTP_MAX_CONNECTIONS": "-5"}, []string{"HTTP_MAX_CONNECTIONS"}},
		{"gc_headroom", map[string]string{"GC_HEADROOM_BYTES": "-1"}, []string{"GC_HEADROOM_BYTES"}},
		{"memcache_without_servers", map[string]string{"BACKEND_TYPE": "memcache"}, []string{"MEMCACHE_HOST_PORT", "MEMCACHE_SRV"}},
		{"memcache_both", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "a:1", "MEMCACHE_SRV": "_m._tcp.x"}, []string{"MEMCACHE_HOST_PORT", "MEMCACHE_SRV"}},
		{"memcache_idle", map[string]string{"MEMCACHE_MAX_IDLE_CONNS": "-1"}, []string{"MEMCACHE_MAX_IDLE_CONNS"}},
		{"memcache_connections", map[string]string{"MEMCACHE_CONNECTIONS": "9"}, []string{"MEMCACHE_CONNECTIONS", "1 to 8"}},
		{"memcache_in_flight", map[string]string{"MEMCACHE_MAX_IN_FLIGHT": "0"}, []string{"MEMCACHE_MAX_IN_FLIGHT"}},
		{"recheck_negative", map[string]string{"RUNTIME_RECHECK_INTERVAL": "-1s"}, []string{"RUNTIME_RECHECK_INTERVAL"}},
		{"recheck_too_often", map[string]string{"RUNTIME_RECHECK_INTERVAL": "1ms"}, []string{"RUNTIME_RECHECK_INTERVAL"}},
		{"recheck_not_a_duration", map[string]string{"RUNTIME_RECHECK_INTERVAL": "60"}, []string{"RUNTIME_RECHECK_INTERVAL"}},
		{"live_view_max_keys_small", map[string]string{"LIVE_VIEW_MAX_KEYS": "15"}, []string{"LIVE_VIEW_MAX_KEYS", "16..65536"}},
		{"live_view_max_keys_large", map[string]string{"LIVE_VIEW_MAX_KEYS": "65537"}, []string{"LIVE_VIEW_MAX_KEYS"}},
		{"memory_max_bytes_zero", map[string]string{"MEMORY_MAX_BYTES": "0"}, []string{"MEMORY_MAX_BYTES", "1048576"}},
		{"memory_max_bytes_small", map[string]string{"MEMORY_MAX_BYTES": "1048575"}, []string{"MEMORY_MAX_BYTES"}},
		{"memory_max_bytes_not_a_number", map[string]string{"MEMORY_MAX_BYTES": "64MiB"}, []string{"MEMORY_MAX_BYTES"}},
		{"memory_max_keys", map[string]string{"MEMORY_MAX_KEYS": "-1"}, []string{"MEMORY_MAX_KEYS"}},
		{"cache_key_format", map[string]string{"CACHE_KEY_FORMAT": "escape"}, []string{"CACHE_KEY_FORMAT", "escape", "anchor or escaped"}},
		{"quiet_period_too_short", map[string]string{"RUNTIME_QUIET_PERIOD": "1ms"}, []string{"RUNTIME_QUIET_PERIOD", "10ms..1m"}},
		{"quiet_period_zero", map[string]string{"RUNTIME_QUIET_PERIOD": "0"}, []string{"RUNTIME_QUIET_PERIOD"}},
		{"quiet_period_too_long", map[string]string{"RUNTIME_QUIET_PERIOD": "2m"}, []string{"RUNTIME_QUIET_PERIOD"}},
		{"allow_empty_reload", map[string]string{"RUNTIME_ALLOW_EMPTY_RELOAD": "sometimes"}, []string{"RUNTIME_ALLOW_EMPTY_RELOAD"}},
		{"breaker_failures_negative", map[string]string{"STORE_BREAKER_FAILURES": "-1"}, []string{"STORE_BREAKER_FAILURES", "0: no breaker"}},
		{"breaker_failures_huge", map[string]string{"STORE_BREAKER_FAILURES": "10001"}, []string{"STORE_BREAKER_FAILURES"}},
		{"breaker_probe_too_often", map[string]string{"STORE_BREAKER_PROBE_INTERVAL": "1ms"}, []string{"STORE_BREAKER_PROBE_INTERVAL", "10ms..1m"}},
		{"breaker_probe_too_rare", map[string]string{"STORE_BREAKER_PROBE_INTERVAL": "2m"}, []string{"STORE_BREAKER_PROBE_INTERVAL"}},
		{"stall_too_short", map[string]string{"REDIS_STALL_TIMEOUT": "5ms"}, []string{"REDIS_STALL_TIMEOUT", "10ms..1m", "0: no bound"}},
		{"stall_too_long", map[string]string{"REDIS_STALL_TIMEOUT": "2m"}, []string{"REDIS_STALL_TIMEOUT"}},
		{"stall_negative", map[string]string{"REDIS_STALL_TIMEOUT": "-1s"}, []string{"REDIS_STALL_TIMEOUT"}},
		{"failure_mode", map[string]string{"STORE_FAILURE_MODE": "open"}, []string{"STORE_FAILURE_MODE", "open", "error or local"}},
		{"write_behind_too_often", map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "WRITE_BEHIND_INTERVAL": "100us"},
			[]string{"WRITE_BEHIND_INTERVAL", "1ms..1m"}},
		{"write_behind_too_rare", map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "WRITE_BEHIND_INTERVAL": "2m"},
			[]string{"WRITE_BEHIND_INTERVAL", "1ms..1m"}},
		{"write_behind_on_memory", map[string]string{"WRITE_BEHIND_INTERVAL": "100ms"}, []string{"WRITE_BEHIND_INTERVAL", "needs BACKEND_TYPE redis or memcache"}},
		{"write_behind_no_keys", map[string]string{"WRITE_BEHIND_MAX_KEYS": "0"}, []string{"WRITE_BEHIND_MAX_KEYS", "1..10000000"}},
		{"several", map[string]string{"BACKEND_TYPE": "foo", "LOG_LEVEL": "loud"}, []string{"BACKEND_TYPE", "LOG_LEVEL"}},
		{"redis_host_port_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_URL": "redis:6379"},
			[]string{"REDIS_URL", `"redis:6379"`, "REDIS_SOCKET_TYPE is unix", "set REDIS_SOCKET_TYPE=tcp"}},
		{"redis_inferred_host_port_on_unix", map[string]string{"REDIS_URL": "10.0.0.7:6379"}, []string{"REDIS_URL", "set REDIS_SOCKET_TYPE=tcp"}},
		{"redis_ipv6_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "[::1]:6379"}, []string{"REDIS_SOCKET_TYPE=tcp"}},
		{"redis_url_scheme_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_URL": "redis://redis:6379/0"}, []string{"REDIS_URL", "REDIS_SOCKET_TYPE=tcp"}},
		{"redis_persecond_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379",
			"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "r2:6379"}, []string{"REDIS_PERSECOND_URL", "set REDIS_PERSECOND_SOCKET_TYPE=tcp"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			if err == nil {
				t.Fatalf("Load() with %v succeeded, want an error", tt.env)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load() error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestRequestTimeout: REQUEST_TIMEOUT is 0 (no fixed bound) unless it is
// set, as in the anchor (issue 36: at 15ms by default it failed healthy
// calls without a deadline on a busy host); set, it is the bound of every
// request.
func TestRequestTimeout(t *testing.T) {
	tests := []struct {
		name  string
		value string // "" leaves it unset
		want  time.Duration
	}{
		{"unset", "", 0},
		{"set", "250ms", 250 * time.Millisecond},
		{"zero", "0", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("REQUEST_TIMEOUT", tt.value)
			if tt.value == "" {
				os.Unsetenv("REQUEST_TIMEOUT")
			}
			s, err := Load()
			if err != nil {
				t.Fatal(err)
			}
			if s.RequestTimeout != tt.want {
				t.Errorf("RequestTimeout = %v, want %v", s.RequestTimeout, tt.want)
			}
		})
	}
}

func TestBackendTypeIsCaseInsensitive(t *testing.T) {
	t.Setenv("BACKEND_TYPE", "Redis")
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if s.BackendType != BackendRedis {
		t.Errorf("BackendType = %q, want %q", s.BackendType, BackendRedis)
	}
}

func TestCacheKeyFormatIsCaseInsensitive(t *testing.T) {
	t.Setenv("CACHE_KEY_FORMAT", "Escaped")
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if s.CacheKeyFormat != KeyFormatEscaped {
		t.Errorf("CacheKeyFormat = %q, want %q", s.CacheKeyFormat, KeyFormatEscaped)
	}
}

func TestRulesRootDefaultsToWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := s.RulesRoot(); got != dir {
		t.Errorf("RulesRoot() = %q, want %q", got, dir)
	}
	t.Setenv("RUNTIME_ROOT", "/srv/runtime_data/current")
	s, err = Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := s.RulesRoot(); got != "/srv/runtime_data/current" {
		t.Errorf("RulesRoot() = %q, want RUNTIME_ROOT", got)
	}
}

// TestLogSettingsAnyCase accepts LOG_FORMAT and LOG_LEVEL in any case, as
// envoyproxy/ratelimit does (it lowers both before comparing).
func TestLogSettingsAnyCase(t *testing.T) {
	tests := []struct {
		format, level string
		wantJSON      bool
	}{
		{"JSON", "Debug", true},
		{"Json", "warning", true},
		{"json", "TRACE", true},
		{"Text", "Info", false},
		{"TEXT", "eRRoR", false},
	}
	for _, tt := range tests {
		t.Run(tt.format+"_"+tt.level, func(t *testing.T) {
			t.Setenv("LOG_FORMAT", tt.format)
			t.Setenv("LOG_LEVEL", tt.level)
			s, err := Load()
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if want := strings.ToLower(tt.format); s.LogFormat != want {
				t.Errorf("LogFormat = %q, want %q", s.LogFormat, want)
			}
			if got := JSONLogsRequested(); got != tt.wantJSON {
				t.Errorf("JSONLogsRequested() = %v, want %v", got, tt.wantJSON)
			}
		})
	}
	// Read on its own: a bad setting elsewhere does not hide it.
	t.Setenv("LOG_FORMAT", "JSON")
	t.Setenv("PORT", "abc")
	if _, err := Load(); err == nil || !JSONLogsRequested() {
		t.Errorf("with PORT=abc: Load() = %v, JSONLogsRequested() = %v; want an error and true", err, JSONLogsRequested())
	}
}

// TestXDSSettings reads the xDS client's settings the way Envoy Gateway
// and the anchor's documentation write them, and refuses the values that
// would leave the client unable to do what was asked.
func TestXDSSettings(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" means Load succeeds
		check   func(t *testing.T, s *Settings)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, s *Settings) {
				if s.ConfigType != ConfigTypeFile || s.ConfigGRPCXDSNodeID != "default" || s.ConfigGRPCXDSServerURL != "localhost:18000" ||
					s.XDSClientBackoffInitialInterval != 10*time.Second || s.XDSClientBackoffMaxInterval != time.Minute ||
					s.XDSClientBackoffRandomFactor != 0.5 || !s.XDSClientBackoffJitter || s.XDSClientMaxMsgSizeInBytes != 0 {
					t.Errorf("defaults = %+v", s)
				}
			},
		},
		{
			name: "envoy_gateway",
			env: map[string]string{
				"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001",
				"CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
				"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
				"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
			},
			check: func(t *testing.T, s *Settings) {
				if s.ConfigType != ConfigTypeXDS || !s.ConfigGRPCXDSServerUseTLS || s.ConfigGRPCXDSServerTLSCACert != "/certs/ca.crt" {
					t.Errorf("settings = %+v", s)
				}
			},
		},
		{
			name:  "config_type_any_case",
			env:   map[string]string{"CONFIG_TYPE": " grpc_xds_sotw "},
			check: func(t *testing.T, s *Settings) { want(t, "ConfigType", s.ConfigType, ConfigTypeXDS) },
		},
		{
			name: "headers",
			env:  map[string]string{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:Bearer t1,x-tenant:a"},
			check: func(t *testing.T, s *Settings) {
				h := s.ConfigGRPCXDSClientAdditionalHeaders
				if len(h) != 2 || h["authorization"] != "Bearer t1" || h["x-tenant"] != "a" {
					t.Errorf("headers = %q", h)
				}
			},
		},
		{
			name: "node_metadata",
			env:  map[string]string{"CONFIG_GRPC_XDS_NODE_METADATA": "zone=eu-1,team:edge,,url=http://x:1"},
			check: func(t *testing.T, s *Settings) {
				md, err := s.XDSNodeMetadata()
				if err != nil || len(md) != 3 || md["zone"] != "eu-1" || md["team"] != "edge" || md["url"] != "http://x:1" {
					t.Errorf("XDSNodeMetadata() = %q, %v", md, err)
				}
			},
		},
		{name: "node_metadata_without_separator", env: map[string]string{"CONFIG_GRPC_XDS_NODE_METADATA": "zone=eu,oops"}, wantErr: "CONFIG_GRPC_XDS_NODE_METADATA: pair 2"},
		{name: "node_metadata_empty_key", env: map[string]string{"CONFIG_GRPC_XDS_NODE_METADATA": "=v"}, wantErr: "CONFIG_GRPC_XDS_NODE_METADATA"},
		{name: "empty_url", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": ""}, wantErr: "CONFIG_GRPC_XDS_SERVER_URL"},
		{name: "empty_node_id", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": ""}, wantErr: "CONFIG_GRPC_XDS_NODE_ID"},
		{name: "cert_without_key", env: map[string]string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/c.pem"}, wantErr: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together"},
		{name: "memcache_cert_without_key", env: map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:11211", "MEMCACHE_TLS": "true", "MEMCACHE_TLS_CLIENT_CERT": "/c.pem"},
			wantErr: "settings: MEMCACHE_TLS_CLIENT_CERT: MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY go together"},
		{name: "redis_key_without_cert", env: map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CLIENT_KEY": "/k.pem"}, wantErr: "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together"},
		{name: "zero_backoff", env: map[string]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "0s"}, wantErr: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"},
		{name: "max_below_initial", env: map[string]string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL": "5s"}, wantErr: "XDS_CLIENT_BACKOFF_MAX_INTERVAL"},
		{name: "random_factor", env: map[string]string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "1.5"}, wantErr: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR"},
		{name: "negative_msg_size", env: map[string]string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "-1"}, wantErr: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load() = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if tt.check != nil {
				tt.check(t, s)
			}
		})
	}
}

func want[T comparable](t *testing.T, name string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", name, got, want)
	}
}

// A deployment written for envoyproxy/ratelimit stays on Redis: there
// BACKEND_TYPE defaults to redis and Envoy Gateway sets only REDIS_URL and
// REDIS_SOCKET_TYPE.
func TestBackendInferredFromRedisSettings(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		want     string
		inferred string
	}{
		{"nothing_set", nil, "memory", ""},
		{"redis_url", map[string]string{"REDIS_URL": "redis:6379", "REDIS_SOCKET_TYPE": "tcp"}, "redis", "REDIS_"},
		{"explicit_memory_wins", map[string]string{"BACKEND_TYPE": "memory", "REDIS_URL": "redis:6379"}, "memory", ""},
		{"explicit_memcache_wins", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:11211", "REDIS_URL": "r:6379"}, "memcache", ""},
		{"memcache_settings_alone", map[string]string{"MEMCACHE_HOST_PORT": "m:11211"}, "memory", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := loadOnly(t, tt.env)
			if s.BackendType != tt.want || !strings.HasPrefix(s.BackendInferred(), tt.inferred) || (tt.inferred == "") != (s.BackendInferred() == "") {
				t.Errorf("BackendType %q (inferred from %q), want %q", s.BackendType, s.BackendInferred(), tt.want)
			}
		})
	}
}

// TestRedisSocketTypeKept: the anchor's default socket type (unix) and
// every REDIS_URL that fits its socket type still load: socket paths on
// unix, addresses on tcp, and the Sentinel and Cluster lists, which are
// dialled over TCP whatever the socket type; an address on unix is refused
// only for the store in use.
func TestRedisSocketTypeKept(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"default_path", map[string]string{"BACKEND_TYPE": "redis"}},
		{"path_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_URL": "/run/redis/redis.sock"}},
		{"relative_path_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_URL": "redis.sock"}},
		{"address_on_tcp", map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"}},
		{"sentinel_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379"}},
		{"cluster_on_unix", map[string]string{"BACKEND_TYPE": "redis", "REDIS_TYPE": "CLUSTER", "REDIS_URL": "n1:6379,n2:6379"}},
		{"memory_store", map[string]string{"BACKEND_TYPE": "memory", "REDIS_URL": "redis:6379"}},
		{"persecond_off", map[string]string{"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_PERSECOND_URL": "r2:6379"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := loadOnly(t, tt.env)
			if tt.env["REDIS_SOCKET_TYPE"] == "" && s.RedisSocketType != "unix" {
				t.Errorf("REDIS_SOCKET_TYPE = %q by default, want unix (the anchor's)", s.RedisSocketType)
			}
		})
	}
}

// loadOnly loads the settings with env and none of the store's from the
// process's environment.
func loadOnly(t *testing.T, env map[string]string) *Settings {
	t.Helper()
	clearEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
	s, err := Load()
	if err != nil {
		t.Fatalf("Load() with %v: %v", env, err)
	}
	return s
}

// clearEnv unsets, for this test only, the variables that choose the store.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "BACKEND_TYPE" || strings.HasPrefix(name, "REDIS_") || strings.HasPrefix(name, "MEMCACHE_") {
			t.Setenv(name, "") // restored after the test
			os.Unsetenv(name)
		}
	}
}

// TestStatsSettings: the statistics settings read and checked as the
// anchor reads them, each problem naming its variable.
func TestStatsSettings(t *testing.T) {
	const pattern = `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`
	tests := []struct {
		name       string
		env        map[string]string
		errs       []string
		sink       string
		protocol   string
		tags       map[string]string
		mogrifiers []string // Key NAME k=v... of each
	}{
		{name: "defaults", sink: "statsd", protocol: "tcp"},
		{name: "off", env: map[string]string{"USE_STATSD": "false"}, sink: "", protocol: "tcp"},
		{name: "udp", env: map[string]string{"STATSD_PROTOCOL": "UDP"}, sink: "statsd", protocol: "udp"},
		{name: "disabled_wins", env: map[string]string{"DISABLE_STATS": "true", "USE_DOG_STATSD": "true"}, sink: "", protocol: "tcp"},
		{name: "extra_tags", env: map[string]string{"EXTRA_TAGS": "version:1.2.3,commit:abc"}, sink: "statsd", protocol: "tcp",
			tags: map[string]string{"version": "1.2.3", "commit": "abc"}},
		{name: "extra_tags_not_pairs", env: map[string]string{"EXTRA_TAGS": "version"}, errs: []string{"EXTRA_TAGS"}},
		{name: "protocol_unknown", env: map[string]string{"STATSD_PROTOCOL": "quic"}, errs: []string{"STATSD_PROTOCOL"}},
		{name: "port_zero", env: map[string]string{"STATSD_PORT": "0"}, errs: []string{"STATSD_PORT"}},
		{name: "interval_zero", env: map[string]string{"STATS_FLUSH_INTERVAL": "0s"}, errs: []string{"STATS_FLUSH_INTERVAL"}},
		{
			name: "mogrifiers_in_order",
			env: map[string]string{
				"USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "specific,tag",
				"DOG_STATSD_MOGRIFIER_SPECIFIC_PATTERN": `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$`,
				"DOG_STATSD_MOGRIFIER_SPECIFIC_NAME":    "custom.foo",
				"DOG_STATSD_MOGRIFIER_TAG_PATTERN":      pattern,
				"DOG_STATSD_MOGRIFIER_TAG_NAME":         "ratelimit.service.rate_limit.$3",
				"DOG_STATSD_MOGRIFIER_TAG_TAGS":         "domain:$1,descriptor:$2",
			},
			sink: "dogstatsd", protocol: "tcp",
			mogrifiers: []string{"specific custom.foo", "tag ratelimit.service.rate_limit.$3 descriptor=$2 domain=$1"},
		},
		{
			name: "mogrifier_unset_ignored_without_dogstatsd",
			env:  map[string]string{"USE_DOG_STATSD_MOGRIFIERS": "tag"},
			sink: "statsd", protocol: "tcp",
		},
		{
			name: "mogrifier_without_pattern_or_name",
			env:  map[string]string{"USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "tag"},
			errs: []string{"DOG_STATSD_MOGRIFIER_TAG_PATTERN", "DOG_STATSD_MOGRIFIER_TAG_NAME"},
		},
		{
			name: "mogrifier_bad_pattern",
			env: map[string]string{"USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "tag",
				"DOG_STATSD_MOGRIFIER_TAG_PATTERN": "(", "DOG_STATSD_MOGRIFIER_TAG_NAME": "x"},
			errs: []string{"DOG_STATSD_MOGRIFIER_TAG_PATTERN"},
		},
		{
			name: "mogrifier_bad_tags",
			env: map[string]string{"USE_DOG_STATSD": "true", "USE_DOG_STATSD_MOGRIFIERS": "tag",
				"DOG_STATSD_MOGRIFIER_TAG_PATTERN": pattern, "DOG_STATSD_MOGRIFIER_TAG_NAME": "x",
				"DOG_STATSD_MOGRIFIER_TAG_TAGS": "domain:$1,descriptor:"},
			errs: []string{"DOG_STATSD_MOGRIFIER_TAG_TAGS"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if len(tt.errs) > 0 {
				if err == nil {
					t.Fatalf("Load() succeeded, want an error naming %v", tt.errs)
				}
				for _, name := range tt.errs {
					if !strings.Contains(err.Error(), name) {
						t.Errorf("Load() error %q does not name %s", err, name)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if got := s.StatsdSink(); got != tt.sink {
				t.Errorf("StatsdSink() = %q, want %q", got, tt.sink)
			}
			if s.StatsdProtocol != tt.protocol {
				t.Errorf("StatsdProtocol = %q, want %q", s.StatsdProtocol, tt.protocol)
			}
			if len(s.ExtraTags) != len(tt.tags) {
				t.Errorf("ExtraTags = %v, want %v", s.ExtraTags, tt.tags)
			}
			for k, v := range tt.tags {
				if s.ExtraTags[k] != v {
					t.Errorf("ExtraTags = %v, want %v", s.ExtraTags, tt.tags)
				}
			}
			var got []string
			for _, m := range s.Mogrifiers() {
				d := m.Key + " " + m.Name
				keys := make([]string, 0, len(m.Tags))
				for k := range m.Tags {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				for _, k := range keys {
					d += " " + k + "=" + m.Tags[k]
				}
				got = append(got, d)
			}
			if !slices.Equal(got, tt.mogrifiers) {
				t.Errorf("Mogrifiers() = %q, want %q", got, tt.mogrifiers)
			}
		})
	}
}

// TestTracingSettings: the tracing settings read as the anchor reads
// them, and the values it would misuse refused, each naming its variable.
func TestTracingSettings(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		errs     []string
		protocol string
		rate     float64
	}{
		{name: "defaults", protocol: "http", rate: 1},
		{name: "grpc_any_case", env: map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "GRPC"}, protocol: "grpc", rate: 1},
		{name: "protocol_empty", env: map[string]string{"TRACING_EXPORTER_PROTOCOL": ""}, protocol: "http", rate: 1},
		{name: "protocol_unknown", env: map[string]string{"TRACING_EXPORTER_PROTOCOL": "http/json"}, errs: []string{"TRACING_EXPORTER_PROTOCOL"}},
		{name: "rate_envoy_gateway", env: map[string]string{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "0.0"}, protocol: "http", rate: 0},
		{name: "rate_percent", env: map[string]string{"TRACING_SAMPLING_RATE": "50"}, errs: []string{"TRACING_SAMPLING_RATE"}},
		{name: "rate_negative", env: map[string]string{"TRACING_SAMPLING_RATE": "-0.1"}, errs: []string{"TRACING_SAMPLING_RATE"}},
		{name: "rate_nan", env: map[string]string{"TRACING_SAMPLING_RATE": "NaN"}, errs: []string{"TRACING_SAMPLING_RATE"}},
		{name: "rate_not_a_number", env: map[string]string{"TRACING_SAMPLING_RATE": "half"}, errs: []string{"TRACING_SAMPLING_RATE"}},
		{name: "empty_service_name", env: map[string]string{"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": ""}, errs: []string{"TRACING_SERVICE_NAME"}},
		{name: "endpoint", env: map[string]string{"TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example.com:4318"}, protocol: "http", rate: 1},
		{name: "endpoint_without_scheme", env: map[string]string{"TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "otel:4317"}, errs: []string{"OTEL_EXPORTER_OTLP_ENDPOINT"}},
		{name: "endpoint_not_a_url", env: map[string]string{"TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"}, errs: []string{"OTEL_EXPORTER_OTLP_ENDPOINT"}},
		// Unused with tracing off, as in the anchor: one warning, no error.
		{name: "endpoint_without_scheme_tracing_off", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel:4317"}, protocol: "http", rate: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if len(tt.errs) > 0 {
				if err == nil {
					t.Fatalf("Load() succeeded, want an error naming %v", tt.errs)
				}
				for _, w := range tt.errs {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Load() error %q does not name %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			if s.TracingExporterProtocol != tt.protocol || s.TracingSamplingRate != tt.rate {
				t.Errorf("protocol %q, rate %v; want %q, %v", s.TracingExporterProtocol, s.TracingSamplingRate, tt.protocol, tt.rate)
			}
		})
	}
}

func TestRLQSSettings(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
		check   func(*Settings) bool
	}{
		{name: "enabled_any_case", env: map[string]string{"RLQS_ENABLED": " TRUE "}, check: func(s *Settings) bool { return s.RLQSEnabled == RLQSOn }},
		{name: "disabled", env: map[string]string{"RLQS_ENABLED": "false"}, check: func(s *Settings) bool { return s.RLQSEnabled == RLQSOff }},
		{name: "enabled_nonsense", env: map[string]string{"RLQS_ENABLED": "sometimes"}, wantErr: `RLQS_ENABLED: "sometimes"`},
		{name: "ttl_fraction", env: map[string]string{"RLQS_ASSIGNMENT_TTL": "2500ms"}, wantErr: "RLQS_ASSIGNMENT_TTL: 2.5s: want whole seconds"},
		{name: "ttl_too_short", env: map[string]string{"RLQS_ASSIGNMENT_TTL": "1s"}, wantErr: "RLQS_ASSIGNMENT_TTL: 1s"},
		{name: "idle_never", env: map[string]string{"RLQS_IDLE_TIMEOUT": "0"}, check: func(s *Settings) bool { return s.RLQSIdleTimeout == 0 }},
		{name: "idle_too_short", env: map[string]string{"RLQS_IDLE_TIMEOUT": "1s"}, wantErr: "RLQS_IDLE_TIMEOUT: 1s"},
		{name: "no_streams", env: map[string]string{"RLQS_MAX_STREAMS": "0"}, wantErr: "RLQS_MAX_STREAMS: 0 is outside"},
		{name: "per_stream_above_total", env: map[string]string{"RLQS_MAX_BUCKETS": "10", "RLQS_MAX_BUCKETS_PER_STREAM": "11"}, wantErr: "RLQS_MAX_BUCKETS_PER_STREAM: 11 is outside 1..RLQS_MAX_BUCKETS (10)"},
		{name: "peer_shares_follow_small_totals", env: map[string]string{"RLQS_MAX_STREAMS": "8", "RLQS_MAX_BUCKETS": "10", "RLQS_MAX_BUCKETS_PER_STREAM": "5"},
			check: func(s *Settings) bool { return s.RLQSMaxStreamsPerPeer == 8 && s.RLQSMaxBucketsPerPeer == 10 }},
		{name: "peer_streams_above_total", env: map[string]string{"RLQS_MAX_STREAMS": "8", "RLQS_MAX_STREAMS_PER_PEER": "9"}, wantErr: "RLQS_MAX_STREAMS_PER_PEER: 9 is outside 1..RLQS_MAX_STREAMS (8)"},
		{name: "peer_buckets_below_stream", env: map[string]string{"RLQS_MAX_BUCKETS_PER_PEER": "9999"}, wantErr: "RLQS_MAX_BUCKETS_PER_PEER: 9999 is outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(s) {
				t.Errorf("Load() with %v: unexpected settings %+v", tt.env, s)
			}
		})
	}
}
