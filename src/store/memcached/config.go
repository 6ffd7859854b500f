package memcached

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// Config configures a Store. Its fields mirror envoyproxy/ratelimit's
// MEMCACHE_* settings; the server builds it from them. Zero values take the
// defaults given per field.
type Config struct {
	// Addrs lists the servers as host:port (MEMCACHE_HOST_PORT). Keys are
	// sharded over them by gomemcache's ServerList (CRC-32 of the key modulo
	// the number of servers, in this order), as the anchor does. Exactly one
	// of Addrs and SRV must be set.
	Addrs []string
	// SRV is a DNS SRV record, such as "_memcache._tcp.example.com."
	// (MEMCACHE_SRV), resolved with net.LookupSRV to the servers' host:port.
	// The targets are sorted, so that every instance, and every refresh,
	// shards keys the same way (the order of an SRV answer is random).
	SRV string
	// SRVRefresh, when positive, re-resolves SRV that often and switches to
	// the new server list when it changed (MEMCACHE_SRV_REFRESH; default 0:
	// resolved once, in New). A failed lookup keeps the current list.
	// Ignored without SRV.
	SRVRefresh time.Duration
	// Conns is the connections to each server (MEMCACHE_CONNECTIONS;
	// default 2, at most maxPipelineConns). Each pipelines any number of
	// concurrent commands, and fewer connections coalesce more of them
	// per write: the next takes requests only while the ones before have
	// deep queues (see server.choose).
	Conns int
	// MaxIdleConns is the anchor's MEMCACHE_MAX_IDLE_CONNS: the
	// connections to each server kept open while nothing is under way on
	// them (default 2; 0 means 2, as for gomemcache). A connection past
	// it is closed as soon as its last answer is read, and dialed again
	// when a deep queue needs it.
	MaxIdleConns int
	// MaxConns bounds the ops under way at once (MEMCACHE_MAX_IN_FLIGHT;
	// default 128): a Do takes one slot, and the other ops of its batch
	// run side by side on more while they are free (else after one
	// another on the Do's). A Do that finds every one taken waits for
	// one, at most until its ctx's deadline, and then fails with an error
	// wrapping limiter.ErrOverloaded. Each server's queue of commands
	// sent or to send holds at most 4 × MaxConns; a command past that
	// fails the same way.
	MaxConns int
	// MaxWaiting bounds the Do calls waiting for one of MaxConns (default
	// 4 × MaxConns); one more fails at once with an error wrapping
	// limiter.ErrOverloaded, so that the wait line is bounded too.
	MaxWaiting int
	// Timeout bounds a dial, and how late an answer may be (default
	// 500ms, gomemcache's): a connection whose oldest answer is later
	// than that is closed, and every command under way on it fails. A
	// request's own wait ends at its ctx's end, which may come first.
	Timeout time.Duration
	// TLS, when not nil, makes every connection TLS with this
	// configuration (memcached built with --enable-ssl); its ServerName
	// defaults to the server's host.
	TLS *tls.Config
	// Breaker is the circuit breaker kept per server (STORE_BREAKER_FAILURES,
	// STORE_BREAKER_PROBE_INTERVAL): after Breaker.Failures round trips in
	// a row to a server failed for want of it (never for an item's data,
	// never a full connection pool), a request with an op for that server
	// fails at once with an error wrapping limiter.ErrUnavailable, until a
	// probe every Breaker.ProbeInterval finds the server answering. The
	// zero value (the default here; settings default to 5 failures) turns
	// it off.
	Breaker breaker.Config
	// ExpirationJitterMax adds a random [0, max) whole seconds to the
	// expiration of every item, so that keys do not all expire at once
	// (EXPIRATION_JITTER_MAX_SECONDS; default 0 here, 300s in settings).
	ExpirationJitterMax time.Duration
	// Tracer, when not nil, makes each round trip of a request whose
	// span is recorded (TRACING_ENABLED) a client span under it, named
	// after its command (memcached incr, add, gets, cas, decr). Nil
	// traces nothing and costs a nil check per round trip.
	Tracer trace.Tracer
	// RoundTrip, when not nil, is called after each command answered
	// (probes included) with its duration, from the write that sent it
	// to the read that brought its answer. It runs on the connection's
	// reader goroutine: it must be quick and must not block.
	RoundTrip func(time.Duration)
	// Answered, when not nil, is called when memcached first answers, a
	// probe or a request, before a request that got that answer is
	// answered; and again once a circuit breaker has closed, by the probe
	// that closed it or, at the latest, before the first request answered
	// after that is: Healthy may have turned true, and a caller can report
	// health in step with the store. It runs on the goroutine that saw the
	// answer and must not block.
	Answered func()
}

// Defaults of the zero Config fields.
const (
	defaultConns        = 2
	defaultMaxIdleConns = 2
	defaultMaxConns     = 128
	defaultTimeout      = 500 * time.Millisecond
	// maxPipelineConns caps Conns: past a few, connections only split the
	// batches a pipeline coalesces (see BenchmarkClientIncr).
	maxPipelineConns = 8
)

// withDefaults validates cfg and fills its zero fields. Every problem is
// reported, each naming its field.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("memcached: "+format, args...))
	}
	switch {
	case len(cfg.Addrs) == 0 && cfg.SRV == "":
		bad("no servers: set Addrs (MEMCACHE_HOST_PORT) or SRV (MEMCACHE_SRV)")
	case len(cfg.Addrs) > 0 && cfg.SRV != "":
		bad("both Addrs (MEMCACHE_HOST_PORT) and SRV (MEMCACHE_SRV) are set; set one")
	}
	for i, a := range cfg.Addrs {
		if err := checkAddr(a); err != nil {
			bad("Addrs[%d] (MEMCACHE_HOST_PORT) %q: %v", i, a, err)
		}
	}
	if cfg.SRVRefresh < 0 {
		bad("SRVRefresh (MEMCACHE_SRV_REFRESH) %v is negative", cfg.SRVRefresh)
	}
	if cfg.Conns < 0 || cfg.Conns > maxPipelineConns {
		bad("Conns (MEMCACHE_CONNECTIONS) %d: want 1 to %d", cfg.Conns, maxPipelineConns)
	}
	if cfg.MaxIdleConns < 0 {
		bad("MaxIdleConns (MEMCACHE_MAX_IDLE_CONNS) %d is negative", cfg.MaxIdleConns)
	}
	if cfg.MaxConns < 0 {
		bad("MaxConns %d is negative", cfg.MaxConns)
	}
	if cfg.MaxWaiting < 0 {
		bad("MaxWaiting %d is negative", cfg.MaxWaiting)
	}
	if cfg.Timeout < 0 {
		bad("Timeout %v is negative", cfg.Timeout)
	}
	if cfg.ExpirationJitterMax < 0 {
		bad("ExpirationJitterMax (EXPIRATION_JITTER_MAX_SECONDS) %v is negative", cfg.ExpirationJitterMax)
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	cfg.Conns = cmp.Or(cfg.Conns, defaultConns)
	cfg.MaxIdleConns = cmp.Or(cfg.MaxIdleConns, defaultMaxIdleConns)
	cfg.MaxConns = cmp.Or(cfg.MaxConns, defaultMaxConns)
	cfg.MaxWaiting = cmp.Or(cfg.MaxWaiting, 4*cfg.MaxConns)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.Addrs = slices.Clone(cfg.Addrs)
	return cfg, nil
}

// checkAddr checks that a is host:port with a port number.
func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return errors.New("want host:port")
	}
	if host == "" {
		return errors.New("empty host")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// lookupSRVFunc is the signature of net.Resolver.LookupSRV; tests inject
// their own.
type lookupSRVFunc func(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)

// resolveSRV resolves name to the sorted host:port list of its targets.
func resolveSRV(ctx context.Context, lookup lookupSRVFunc, name string) ([]string, error) {
	_, records, err := lookup(ctx, "", "", name)
	if err != nil {
		return nil, fmt.Errorf("memcached: SRV (MEMCACHE_SRV) %q: %w", name, err)
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("memcached: SRV (MEMCACHE_SRV) %q: no targets", name)
	}
	addrs := make([]string, 0, len(records))
	for _, r := range records {
		addrs = append(addrs, net.JoinHostPort(strings.TrimSuffix(r.Target, "."), strconv.Itoa(int(r.Port))))
	}
	slices.Sort(addrs)
	return addrs, nil
}
