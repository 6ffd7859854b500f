package integration

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// Failure as Envoy's clients experience it: the service killed, stopped,
// restarted, slower than Envoy's timeout, its store down; through three
// filters that differ only in what they do on an error: fail open
// (failure_mode_deny: false, Envoy's default), fail closed (true: 500) and
// fail closed with status_on_error 503.

// failureListeners are the three listeners' names and their filters' error
// settings.
var failureListeners = []struct {
	name  string
	extra string
	// onError is the HTTP code a client gets when the service fails.
	onError int
}{
	{name: "open", extra: "failure_mode_deny: false", onError: http.StatusOK},
	{name: "closed", extra: "failure_mode_deny: true", onError: http.StatusInternalServerError},
	{name: "closed_503", extra: "failure_mode_deny: true\n              status_on_error: {code: ServiceUnavailable}", onError: http.StatusServiceUnavailable},
}

// failureTimeout is the filters' timeout: Envoy's own default is 20 ms,
// which a -race build on a busy two-core machine does not always meet.
const failureTimeout = 300 * time.Millisecond

// failureBootstrap has one listener per failureListeners entry, each with
// the rate-limit filter (domain hdr, (user=x-user)) and its error settings.
func failureBootstrap(t *testing.T, up *upstream, p *proc) string {
	t.Helper()
	var listeners strings.Builder
	for _, l := range failureListeners {
		fmt.Fprintf(&listeners, `
  - name: %s
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: %s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-user, descriptor_key: user}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: hdr
              stat_prefix: %s
              timeout: %s
              %s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {envoy_grpc: {cluster_name: ratelimit}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router`,
			l.name, l.name, l.name, fmt.Sprintf("%gs", failureTimeout.Seconds()), l.extra)
	}
	return `
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:` + listeners.String() + `
  clusters:` + httpCluster("upstream", up.addr) + rlsCluster("ratelimit", p.grpc) + "\n"
}

// failureEnvoy is Envoy with failureBootstrap and the addresses of its
// listeners by name.
type failureEnvoy struct {
	*envoyProc
	addrs map[string]string
}

// codes sends one request through each listener as user and returns the
// HTTP codes by listener.
func (e failureEnvoy) codes(t *testing.T, user string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, l := range failureListeners {
		out[l.name] = httpGet(t, e.addrs[l.name], "/", map[string]string{"x-user": user}).code
	}
	return out
}

// wantErrorPath checks that each listener answered as it does when the
// service fails.
func (e failureEnvoy) wantErrorPath(t *testing.T, what string, got map[string]int) {
	t.Helper()
	for _, l := range failureListeners {
		if got[l.name] != l.onError {
			t.Errorf("%s: %s answered %d, want %d", what, l.name, got[l.name], l.onError)
		}
	}
}

// wantAnswers checks that each listener passed the request (the service
// answered OK).
func (e failureEnvoy) wantAnswers(t *testing.T, what string, got map[string]int) {
	t.Helper()
	for _, l := range failureListeners {
		if got[l.name] != http.StatusOK {
			t.Errorf("%s: %s answered %d, want 200 (decided by the service)", what, l.name, got[l.name])
		}
	}
}

// errorCounts are Envoy's rate-limit error counters of each listener's
// filter (cluster.upstream.ratelimit.<stat_prefix>.error).
func (e failureEnvoy) errorCounts(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, l := range failureListeners {
		out[l.name] = e.counter(t, "cluster.upstream.ratelimit."+l.name+".error")
	}
	return out
}

// awaitAnswers sends requests through the fail-closed listener until the
// service decides one (200 or 429, not Envoy's 500), and returns how many
// failed first and for how long.
func (e failureEnvoy) awaitAnswers(t *testing.T, within time.Duration) (failed int, took time.Duration) {
	t.Helper()
	began := time.Now()
	harness.WaitForNil(t, within, "an answer through Envoy after the service came back", func() error {
		switch code := httpGet(t, e.addrs["closed"], "/", map[string]string{"x-user": "recovery"}).code; code {
		case http.StatusOK, http.StatusTooManyRequests:
			return nil
		default:
			failed++
			return fmt.Errorf("%d errors, the last HTTP %d", failed, code)
		}
	})
	return failed, time.Since(began)
}

func TestRealEnvoyFailures(t *testing.T) {
	r := harness.StartRedis(t, harness.RedisOptions{})
	proxy := harness.StartProxy(t, r.Addr)
	env := append(redisEnv(r, "REDIS_TIMEOUT=100ms"), "REDIS_URL="+proxy.Addr)
	rulesFiles := map[string]string{"hdr.yaml": headerRules}
	p := start(t, rulesFiles, env...)
	up := startUpstream(t)
	e := failureEnvoy{envoyProc: startEnvoy(t, failureBootstrap(t, up, p)), addrs: map[string]string{}}
	for _, l := range failureListeners {
		e.addrs[l.name] = e.listener(t, l.name)
	}
	e.wantAnswers(t, "healthy", e.codes(t, "healthy"))

	t.Run("store_down", func(t *testing.T) {
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		// The service answers Unavailable at once, well within Envoy's
		// timeout: Envoy takes its error path.
		began := time.Now()
		e.wantErrorPath(t, "Redis down", e.codes(t, "store-down"))
		t.Logf("three requests with Redis down: %v", time.Since(began))
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		p.waitHealth(t, http.StatusOK)
		failed, took := e.awaitAnswers(t, 30*time.Second)
		t.Logf("after Redis came back and /healthcheck said 200: %d errors through Envoy, %v to the first answer", failed, took)
	})

	t.Run("store_slower_than_envoy", func(t *testing.T) {
		proxy.SetLatency(3 * failureTimeout)
		e.wantErrorPath(t, "Redis slower than Envoy's timeout", e.codes(t, "slow-store"))
		proxy.SetLatency(0)
		failed, took := e.awaitAnswers(t, 30*time.Second)
		t.Logf("after the latency ended: %d errors through Envoy, %v to the first answer", failed, took)
	})

	t.Run("service_stopped", func(t *testing.T) {
		before := e.errorCounts(t)
		p.signal(t, syscall.SIGSTOP)
		e.wantErrorPath(t, "service stopped (SIGSTOP)", e.codes(t, "stopped"))
		after := e.errorCounts(t)
		for _, l := range failureListeners {
			if after[l.name] != before[l.name]+1 {
				t.Errorf("%s: ratelimit.error went from %d to %d, want one more", l.name, before[l.name], after[l.name])
			}
		}
		p.signal(t, syscall.SIGCONT)
		failed, took := e.awaitAnswers(t, 30*time.Second)
		t.Logf("after SIGCONT: %d errors through Envoy, %v to the first answer", failed, took)
	})

	t.Run("service_killed_and_restarted", func(t *testing.T) {
		p.signal(t, syscall.SIGKILL)
		p.wait(t, 30*time.Second)
		// Connection refused: Envoy fails at once, whatever its timeout.
		began := time.Now()
		e.wantErrorPath(t, "service killed", e.codes(t, "killed"))
		t.Logf("three requests with the service killed: %v", time.Since(began))
		p = launchWith(t, launchOpts{reuse: p}, rulesFiles, env...)
		p.waitHealth(t, http.StatusOK)
		// Envoy connects again on the next request: once /healthcheck
		// says 200, requests through Envoy are answered.
		failed, took := e.awaitAnswers(t, 30*time.Second)
		t.Logf("after the restart's /healthcheck 200: %d errors through Envoy, %v to the first answer", failed, took)
	})

	if n := e.counter(t, "cluster.upstream.ratelimit.open.failure_mode_allowed"); n == 0 {
		t.Error("envoy cluster.upstream.ratelimit.open.failure_mode_allowed = 0: the fail-open listener never counted a pass on error")
	}
}
