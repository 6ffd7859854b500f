package redis

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/store/breaker"
	"github.com/ratelimitd/ratelimit/src/store/tlsclient"
)

// The values of Config.Type (REDIS_TYPE), compared case-insensitively.
const (
	TypeSingle   = "SINGLE"
	TypeSentinel = "SENTINEL"
	TypeCluster  = "CLUSTER"
)

// Config configures a Store. Its fields mirror envoyproxy/ratelimit's REDIS_*
// settings; the server builds it from them. Zero values take the defaults
// given per field.
type Config struct {
	// Type is SINGLE, SENTINEL or CLUSTER (REDIS_TYPE; default SINGLE).
	Type string
	// SocketType is "tcp" or "unix" (REDIS_SOCKET_TYPE; default tcp here,
	// unix in settings as in the anchor). Only SINGLE can use a unix socket;
	// Sentinel and Cluster nodes are always reached over TCP.
	SocketType string
	// URL is REDIS_URL: host:port (or a socket path) for SINGLE;
	// "master-name,sentinel:port,..." for SENTINEL; "node:port,..." seeds for
	// CLUSTER. See ParseURL.
	URL string
	// Auth is REDIS_AUTH: "password" or "user:password"; empty for none.
	Auth string
	// SentinelAuth is REDIS_SENTINEL_AUTH, the sentinels' own credentials in
	// the same form; empty for none.
	SentinelAuth string
	// TLS, when not nil, is used for every connection (REDIS_TLS); see
	// TLSConfig for building it from the certificate settings.
	TLS *tls.Config
	// PoolSize is the number of connections per Redis node, and the number of
	// pipelines that may be in flight to it at once (REDIS_POOL_SIZE;
	// default 10).
	PoolSize int
	// Timeout bounds dialling and every round trip (REDIS_TIMEOUT; default
	// 10s, as in the anchor; keep it below Envoy's filter timeout, 20ms by
	// default, in production).
	Timeout time.Duration
	// Stall bounds, with the circuit breaker on (Breaker), how long a
	// connection waits for a server that owes replies and sends nothing,
	// from the last write to it or the last byte from it
	// (REDIS_STALL_TIMEOUT; default 250ms; negative: no bound but
	// Timeout). Past it, if the kernel holds no byte of the server's either
	// (so the server, not this process, is late), the server's breaker
	// opens at once, and the round trip fails with an error wrapping
	// limiter.ErrUnavailable and its connection is closed. The bound
	// stretches to four times the slowest first answer of the last 2 s
	// when that is longer (see stallConn). A healthy server sends its
	// first reply bytes within a round trip of the network; keep it well
	// above that. With the breaker off it is not used: every request
	// waits for the server, up to Timeout.
	Stall time.Duration
	// PipelineWindow, when positive, makes a pipeline wait up to this long
	// for more requests before it is sent (REDIS_PIPELINE_WINDOW; default 0:
	// send as soon as a connection is free, with whatever has queued up).
	PipelineWindow time.Duration
	// PipelineLimit, when positive, sends a pipeline as soon as it holds this
	// many Redis commands (REDIS_PIPELINE_LIMIT; default 0: no limit beyond
	// maxPipelineCommands). One request's commands are never split.
	PipelineLimit int
	// MaxQueue bounds the requests waiting for a connection to one Redis
	// (default 4096; not a setting of the anchor). When that many wait, Do
	// fails at once with an error wrapping limiter.ErrOverloaded (the
	// service answers ResourceExhausted) and the store stays healthy; a
	// request whose caller gives up leaves the queue. The default holds
	// 20-40 ms of a busy instance's traffic (100-200k requests/s), more
	// than Envoy's 20 ms filter timeout lets a queued request wait, and
	// keeps the queue to a few MB (a request of a few ops holds about a
	// kilobyte: its keys and commands).
	MaxQueue int
	// ExpirationJitterMax adds a random [0, max) whole seconds to the TTL of
	// fixed-window keys so that they do not all expire at once
	// (EXPIRATION_JITTER_MAX_SECONDS; default 0 here, 300s in settings).
	ExpirationJitterMax time.Duration
	// HealthCheckActiveConnection makes Healthy follow the connection to
	// Redis, probed every HealthCheckInterval
	// (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION; default false: healthy once Redis
	// has answered once).
	HealthCheckActiveConnection bool
	// HealthCheckInterval is the probe period for HealthCheckActiveConnection
	// (default 1s; not a setting of the anchor).
	HealthCheckInterval time.Duration
	// StartupInitialInterval and StartupMaxInterval bound the exponential
	// back-off between probes while Redis has never answered
	// (REDIS_STARTUP_INITIAL_INTERVAL, REDIS_STARTUP_MAX_INTERVAL; defaults
	// 1s and 30s, the anchor's). Requests still try Redis in the meantime.
	StartupInitialInterval time.Duration
	StartupMaxInterval     time.Duration
	// Breaker is the circuit breaker kept per Redis server: per backend for
	// SINGLE and SENTINEL, per master node address for CLUSTER
	// (STORE_BREAKER_FAILURES, STORE_BREAKER_PROBE_INTERVAL). After
	// Breaker.Failures failures in a row that mean the server cannot serve
	// (a transport error, a timeout, an error reply about the server's own
	// state; never a data error or a full queue), a request for that
	// server fails at once with an error wrapping limiter.ErrUnavailable,
	// until a probe every Breaker.ProbeInterval finds it answering. The
	// zero value (the default here; settings default to 5 failures) turns
	// it off.
	Breaker breaker.Config
	// PerSecond, when not nil, is a second Redis for the ops of rules whose
	// unit is second (REDIS_PERSECOND=true and REDIS_PERSECOND_*). Only its
	// connection fields are used (Type, SocketType, URL, Auth, SentinelAuth,
	// TLS, PoolSize, Timeout, PipelineWindow, PipelineLimit, MaxQueue); the
	// others (Stall and Breaker among them) come from the main Config.
	PerSecond *Config
	// Tracer, when not nil, adds a span to the request's trace for each
	// round trip a request takes to a Redis, when the context Do gets
	// holds a recorded span (see Store.Do). Nil, the default, costs a
	// request nothing.
	Tracer trace.Tracer
	// RoundTrip, when not nil, is called after each pipeline that Redis
	// answered (the main one or the per-second one, probes included) with
	// its duration, from the pipeline's send to its last reply, and its
	// number of commands. It runs on the worker that sent the pipeline:
	// it must be quick and must not block.
	RoundTrip func(d time.Duration, commands int)
	// Answered, when not nil, is called for each Redis (the main one and
	// the per-second one) when it first answers, a probe or a request,
	// before a request that got that answer is answered; and again once
	// one of its circuit breakers has closed, by the probe that closed it
	// or, at the latest, before the first request answered after that is:
	// Healthy may have turned true, and a caller can report health in step
	// with the store. It runs on the goroutine that saw the answer and must
	// not block.
	Answered func()

	// scriptClock is set by tests only (there is no way to set it from
	// outside the package): the Lua scripts then take the time from
	// Batch.Now instead of Redis TIME, so that they can be compared with
	// the limiter's pure functions on a fake clock. Production keeps
	// Redis's clock, one for the whole fleet.
	scriptClock bool
}

// Defaults.
const (
	defaultPoolSize               = 10
	defaultMaxQueue               = 4096
	defaultTimeout                = 10 * time.Second
	defaultStall                  = 250 * time.Millisecond
	defaultHealthCheckInterval    = time.Second
	defaultStartupInitialInterval = time.Second
	defaultStartupMaxInterval     = 30 * time.Second
)

// withDefaults returns c with its zero fields set to their defaults and its
// Type and SocketType normalised, or an error naming the bad field.
func (c Config) withDefaults() (Config, error) {
	c.Type = cmp.Or(strings.ToUpper(c.Type), TypeSingle)
	switch c.Type {
	case TypeSingle, TypeSentinel, TypeCluster:
	default:
		return c, fmt.Errorf("redis: unknown type %q (want SINGLE, SENTINEL or CLUSTER)", c.Type)
	}
	c.SocketType = strings.ToLower(c.SocketType)
	switch c.SocketType {
	case "":
		c.SocketType = "tcp"
	case "tcp", "unix":
	default:
		return c, fmt.Errorf("redis: unknown socket type %q (want tcp or unix)", c.SocketType)
	}
	c.PoolSize = cmp.Or(max(c.PoolSize, 0), defaultPoolSize)
	c.MaxQueue = cmp.Or(max(c.MaxQueue, 0), defaultMaxQueue)
	c.Timeout = cmp.Or(max(c.Timeout, 0), defaultTimeout)
	c.Stall = cmp.Or(c.Stall, defaultStall)
	c.HealthCheckInterval = cmp.Or(max(c.HealthCheckInterval, 0), defaultHealthCheckInterval)
	c.StartupInitialInterval = cmp.Or(max(c.StartupInitialInterval, 0), defaultStartupInitialInterval)
	c.StartupMaxInterval = cmp.Or(max(c.StartupMaxInterval, 0), defaultStartupMaxInterval)
	c.PipelineLimit = max(c.PipelineLimit, 0)
	c.PipelineWindow = max(c.PipelineWindow, 0)
	c.ExpirationJitterMax = max(c.ExpirationJitterMax, 0)
	return c, nil
}

// Endpoints is a REDIS_URL split by ParseURL.
type Endpoints struct {
	// MasterName is the Sentinel master name; empty for the other types.
	MasterName string
	// Addrs are the node (SINGLE, CLUSTER) or sentinel (SENTINEL) addresses.
	Addrs []string
}

// ParseURL splits REDIS_URL as envoyproxy/ratelimit reads it for the given
// type: SINGLE takes one address (or socket path); SENTINEL takes
// "master-name,sentinel1:port,sentinel2:port,..." with at least one
// sentinel; CLUSTER takes a comma list of seed nodes. Spaces around commas
// are ignored.
func ParseURL(typ, url string) (Endpoints, error) {
	var parts []string
	for p := range strings.SplitSeq(url, ",") {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return Endpoints{}, errors.New("redis: empty URL")
	}
	switch strings.ToUpper(typ) {
	case TypeSingle, "":
		if len(parts) != 1 {
			return Endpoints{}, fmt.Errorf("redis: URL %q: SINGLE takes one address", url)
		}
		return Endpoints{Addrs: parts}, nil
	case TypeSentinel:
		if len(parts) < 2 {
			return Endpoints{}, fmt.Errorf("redis: URL %q: SENTINEL takes master-name,sentinel1:port[,sentinel2:port]", url)
		}
		return Endpoints{MasterName: parts[0], Addrs: parts[1:]}, nil
	case TypeCluster:
		return Endpoints{Addrs: parts}, nil
	}
	return Endpoints{}, fmt.Errorf("redis: unknown type %q (want SINGLE, SENTINEL or CLUSTER)", typ)
}

// ParseAuth splits REDIS_AUTH (or REDIS_SENTINEL_AUTH) as
// envoyproxy/ratelimit does: "user:password" when it holds a colon,
// otherwise a password for the default user.
func ParseAuth(auth string) (user, password string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

// TLSFiles names the PEM files of REDIS_TLS_CLIENT_CERT,
// REDIS_TLS_CLIENT_KEY and REDIS_TLS_CACERT, and
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION (see tlsclient.Files).
type TLSFiles = tlsclient.Files

// TLSConfig builds the client TLS configuration for Redis, as
// envoyproxy/ratelimit does from the same settings. A client certificate is
// used only when both its files are given.
func TLSConfig(f TLSFiles) (*tls.Config, error) {
	c, err := tlsclient.Config(f)
	if err != nil {
		return nil, fmt.Errorf("redis: tls: %w", err)
	}
	return c, nil
}
