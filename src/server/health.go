package server

import (
	"net/http"
	"sync"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// rlsServiceName is the full name of the rate limit gRPC service.
const rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// healthNames are the service names the gRPC health service answers for,
// all with the same status: "" (the whole server, grpc-health-probe's
// default), "ratelimit" (the name envoyproxy/ratelimit registers, which
// Kubernetes gRPC probes and meshes configured for it ask about) and the
// full RLS name.
var healthNames = []string{"", "ratelimit", rlsServiceName}

// Health combines what the service's health depends on: valid rules, a
// reachable store, and not shutting down. It drives both the gRPC health
// service and GET /healthcheck. It is safe for concurrent use.
type Health struct {
	grpc *health.Server

	// mu guards the fields below.
	mu           sync.Mutex
	rulesOK      bool
	storeOK      bool
	shuttingDown bool
}

// NewHealth returns a Health that is unhealthy until rules and store are
// reported good.
func NewHealth() *Health {
	h := &Health{grpc: health.NewServer()}
	h.mu.Lock()
	h.publish()
	h.mu.Unlock()
	return h
}

// SetRules records whether usable rules are loaded.
func (h *Health) SetRules(ok bool) { h.set(func() { h.rulesOK = ok }) }

// SetStore records whether the store answers.
func (h *Health) SetStore(ok bool) { h.set(func() { h.storeOK = ok }) }

// Shutdown marks the service as going away; it never becomes healthy again.
func (h *Health) Shutdown() {
	h.set(func() { h.shuttingDown = true })
	h.grpc.Shutdown()
}

func (h *Health) set(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
	h.publish()
}

// Healthy reports whether the service can answer correctly.
func (h *Health) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy()
}

func (h *Health) healthy() bool { return h.rulesOK && h.storeOK && !h.shuttingDown }

// publish sets the gRPC status from the fields. It runs under mu, so that
// two concurrent changes cannot publish their statuses in the opposite
// order of the changes and leave gRPC saying what /healthcheck does not.
func (h *Health) publish() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.healthy() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthNames {
		h.grpc.SetServingStatus(name, st)
	}
}

// ServeHTTP answers GET /healthcheck: 200 "OK" when healthy, 500 otherwise,
// as envoyproxy/ratelimit does.
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if h.Healthy() {
		_, _ = w.Write([]byte("OK"))
		return
	}
	http.Error(w, "unhealthy", http.StatusInternalServerError)
}
