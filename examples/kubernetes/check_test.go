package kubernetes

import (
	"fmt"
	"maps"
	"net"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/settings"
)

// shutdownDrain is the service's drain after SIGTERM (src/server's
// shutdownDrain, documented in docs/DEPLOY.md): the pod's grace period must
// be longer.
const shutdownDrain = 10

// want is what a set of manifests must describe, beyond what every set
// must get right.
type want struct {
	// name of the Deployment and Service.
	name string
	// rulesConfigMap is the ConfigMap of the rules; external when the
	// manifests do not hold it (an existing one).
	rulesConfigMap string
	external       bool
	// backend is BACKEND_TYPE as the service resolves it.
	backend string
	// replicas, when not 0, is the Deployment's count (no HPA).
	replicas int32
	// hpa: an HPA owns the count.
	hpa bool
	// tls: the gRPC listener serves TLS from this Secret.
	tlsSecret string
	// serviceMonitor: one selects the Service's metrics port.
	serviceMonitor bool
	// json: the Service publishes PORT for /json clients; otherwise it
	// publishes only what Envoy and Prometheus call.
	json bool
	// noNetworkPolicy: no NetworkPolicy selects the pods (the chart with
	// networkPolicy.enabled false); otherwise one lets in exactly the
	// ports the Service publishes.
	noNetworkPolicy bool
}

// loadSettings resolves the container's environment as the service does
// (settings.Load, defaults and validation included): an invalid
// combination or an unknown variable fails here, as it would at startup.
func loadSettings(t *testing.T, c *corev1.Container) *settings.Settings {
	t.Helper()
	known := map[string]bool{}
	st := reflect.TypeFor[settings.Settings]()
	for i := range st.NumField() {
		if tag := st.Field(i).Tag.Get("envconfig"); tag != "" {
			known[tag] = true
		}
	}
	for _, e := range c.Env {
		if !known[e.Name] {
			t.Errorf("env %s is no setting of the service (a typo is ignored silently)", e.Name)
		}
		v := e.Value
		if e.ValueFrom != nil {
			// A secret's value: anything valid will do for the check.
			v = "from-" + e.Name
		}
		t.Setenv(e.Name, v)
	}
	set, err := settings.Load()
	if err != nil {
		t.Fatalf("the container's environment does not start the service: %v", err)
	}
	return set
}

// container returns the named container of a pod template.
func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// portNumber resolves a probe's or Service's port (a name or a number)
// against the container's ports; 0 when it names none.
func portNumber(c *corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

func containerPort(c *corev1.Container, name string) int32 {
	return portNumber(c, intstr.FromString(name))
}

// selects reports whether a label selector matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkRatelimit checks the service's objects against each other and
// against the service's settings.
func checkRatelimit(t *testing.T, objs *objects, w want) {
	t.Helper()
	d := objs.deployments[w.name]
	if d == nil {
		t.Fatalf("no Deployment %q", w.name)
	}
	pod := &d.Spec.Template.Spec
	podLabels := d.Spec.Template.Labels
	if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("Deployment %s: selector %v does not select its pods' labels %v", d.Name, d.Spec.Selector, podLabels)
	}
	c := container(pod, "ratelimit")
	if c == nil {
		t.Fatalf("Deployment %s: no container named ratelimit", d.Name)
	}
	set := loadSettings(t, c)

	// Ports: the container declares the ports the service listens on.
	if got := containerPort(c, "http"); got != int32(set.Port) {
		t.Errorf("container port http = %d, the service listens on PORT %d", got, set.Port)
	}
	if got := containerPort(c, "grpc"); got != int32(set.GRPCPort) {
		t.Errorf("container port grpc = %d, the service listens on GRPC_PORT %d", got, set.GRPCPort)
	}
	if set.UsePrometheus {
		_, p, err := net.SplitHostPort(set.PrometheusAddr)
		if err != nil {
			t.Fatalf("PROMETHEUS_ADDR: %v", err)
		}
		if got := containerPort(c, "metrics"); strconv.Itoa(int(got)) != p {
			t.Errorf("container port metrics = %d, PROMETHEUS_ADDR is %s", got, set.PrometheusAddr)
		}
	}
	if set.BackendType != w.backend {
		t.Errorf("BACKEND_TYPE resolves to %s, want %s", set.BackendType, w.backend)
	}

	// Probes: readiness and liveness on /healthcheck; the gRPC health
	// service asked about "ratelimit" unless the listener serves TLS
	// (the kubelet's gRPC probe speaks plaintext only).
	for name, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: want an HTTP GET of /healthcheck, got %v", name, p)
			continue
		}
		if p.HTTPGet.Path != "/healthcheck" || portNumber(c, p.HTTPGet.Port) != int32(set.Port) {
			t.Errorf("%s: GET %s on port %s, want /healthcheck on PORT %d", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), set.Port)
		}
		if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			t.Errorf("%s: HTTPS, but the HTTP listener serves plain HTTP", name)
		}
	}
	var grpcProbes int
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.GRPC == nil {
			continue
		}
		grpcProbes++
		if p.GRPC.Port != int32(set.GRPCPort) || p.GRPC.Service == nil || *p.GRPC.Service != "ratelimit" {
			t.Errorf("gRPC probe on port %d service %s, want GRPC_PORT %d service ratelimit", p.GRPC.Port, deref(p.GRPC.Service), set.GRPCPort)
		}
	}
	switch {
	case set.GRPCServerUseTLS && grpcProbes > 0:
		t.Error("a gRPC probe with GRPC_SERVER_USE_TLS: the kubelet's gRPC probe cannot speak TLS, so it always fails")
	case !set.GRPCServerUseTLS && grpcProbes == 0:
		t.Error("no gRPC health probe on the service name ratelimit")
	}

	// Shutdown and security.
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= shutdownDrain {
		t.Errorf("terminationGracePeriodSeconds = %s, want more than the %d s drain", deref(g), shutdownDrain)
	}
	nonRoot := pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot
	if c.SecurityContext != nil && c.SecurityContext.RunAsNonRoot != nil {
		nonRoot = *c.SecurityContext.RunAsNonRoot
	}
	if !nonRoot {
		t.Error("runAsNonRoot is not set")
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext %v: want readOnlyRootFilesystem true, allowPrivilegeEscalation false", sc)
	}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[res]; !ok || q.IsZero() {
			t.Errorf("no %s request", res)
		}
		if q, ok := c.Resources.Limits[res]; !ok || q.IsZero() {
			t.Errorf("no %s limit", res)
		}
	}

	// Rules: the ConfigMap mounted as a whole directory where the
	// RUNTIME_* settings read.
	dir := path.Join(set.RulesRoot(), set.RuntimeSubdirectory, set.RuntimeAppDirectory)
	vol := mountedVolume(t, pod, c, dir)
	if vol == nil {
		t.Errorf("nothing is mounted at %s, where RUNTIME_* read the rules", dir)
	} else if vol.ConfigMap == nil || vol.ConfigMap.Name != w.rulesConfigMap {
		t.Errorf("the rules volume is %v, want the ConfigMap %s", vol.VolumeSource, w.rulesConfigMap)
	}
	cm := objs.configMaps[w.rulesConfigMap]
	switch {
	case w.external && cm != nil:
		t.Errorf("ConfigMap %s is rendered, but it should be the existing one", cm.Name)
	case !w.external && cm == nil:
		t.Errorf("no ConfigMap %s", w.rulesConfigMap)
	case !w.external:
		var files []rules.File
		for k, v := range cm.Data {
			if strings.HasSuffix(k, ".yaml") || strings.HasSuffix(k, ".yml") {
				files = append(files, rules.File{Name: k, Data: []byte(v)})
			}
		}
		slices.SortFunc(files, func(a, b rules.File) int { return strings.Compare(a.Name, b.Name) })
		if len(files) == 0 {
			t.Errorf("ConfigMap %s holds no *.yaml rule file", cm.Name)
		}
		if _, err := rules.Parse(files, rules.Options{MergeDomains: set.MergeDomainConfig}); err != nil {
			t.Errorf("ConfigMap %s: the service refuses its rules: %v", cm.Name, err)
		}
	}

	// TLS: the certificate and key come from the Secret's volume.
	if w.tlsSecret != "" {
		if !set.GRPCServerUseTLS {
			t.Error("GRPC_SERVER_USE_TLS is not true")
		}
		for _, f := range []string{set.GRPCServerTLSCert, set.GRPCServerTLSKey} {
			v := mountedVolume(t, pod, c, path.Dir(f))
			if v == nil || v.Secret == nil || v.Secret.SecretName != w.tlsSecret {
				t.Errorf("%s is not in a mount of the Secret %s", f, w.tlsSecret)
			}
		}
	}

	// The Service selects the pods and targets declared ports.
	svc := objs.services[w.name]
	if svc == nil {
		t.Fatalf("no Service %q", w.name)
	}
	if !selects(svc.Spec.Selector, podLabels) {
		t.Errorf("Service %s: selector %v does not select the pods %v", svc.Name, svc.Spec.Selector, podLabels)
	}
	var grpcServed bool
	for _, p := range svc.Spec.Ports {
		target := portNumber(c, p.TargetPort)
		if target == 0 {
			t.Errorf("Service %s port %s: target %s is no container port", svc.Name, p.Name, p.TargetPort.String())
		}
		if target == int32(set.GRPCPort) {
			grpcServed = true
			// Istio picks the protocol from the name or appProtocol.
			if p.Name != "grpc" && !strings.HasPrefix(p.Name, "grpc-") {
				t.Errorf("Service %s: the gRPC port is named %q; Istio needs grpc or grpc-*", svc.Name, p.Name)
			}
		}
	}
	if !grpcServed {
		t.Errorf("Service %s does not serve the gRPC port", svc.Name)
	}
	checkPublished(t, objs, svc, c, set, podLabels, w)

	// Disruptions and scaling.
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	if w.replicas != 0 && replicas != w.replicas {
		t.Errorf("Deployment replicas = %d, want %d", replicas, w.replicas)
	}
	hpa := objs.hpas[w.name]
	switch {
	case w.hpa && hpa == nil:
		t.Error("no HorizontalPodAutoscaler")
	case !w.hpa && hpa != nil:
		t.Error("a HorizontalPodAutoscaler, but a fixed count was asked for")
	case hpa != nil:
		if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != d.Name {
			t.Errorf("HPA scales %s %s, want Deployment %s", hpa.Spec.ScaleTargetRef.Kind, hpa.Spec.ScaleTargetRef.Name, d.Name)
		}
		if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas > hpa.Spec.MaxReplicas {
			t.Errorf("HPA min %v max %d", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
		} else {
			replicas = *hpa.Spec.MinReplicas
		}
	}
	if pdb := objs.pdbs[w.name]; pdb != nil {
		if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("PodDisruptionBudget selector %v does not select the pods %v", pdb.Spec.Selector, podLabels)
		}
		if m := pdb.Spec.MinAvailable; m != nil && m.Type == intstr.Int && m.IntVal >= replicas {
			t.Errorf("PodDisruptionBudget minAvailable %d with %d replicas: no node could ever be drained", m.IntVal, replicas)
		}
	} else if replicas > 1 {
		t.Error("several replicas but no PodDisruptionBudget")
	}

	// The store the service is told to use is there, if the manifests
	// run it.
	switch set.BackendType {
	case settings.BackendRedis:
		checkAddr(t, objs, "REDIS_URL", set.RedisURL)
	case settings.BackendMemcache:
		for _, a := range set.MemcacheHostPort {
			checkAddr(t, objs, "MEMCACHE_HOST_PORT", a)
		}
	}

	// Metrics: a ServiceMonitor scrapes the metrics port of the Service.
	switch sm := objs.serviceMonitors[w.name]; {
	case w.serviceMonitor && sm == nil:
		t.Error("no ServiceMonitor")
	case !w.serviceMonitor && sm != nil:
		t.Error("a ServiceMonitor, but none was asked for")
	case sm != nil:
		if !set.UsePrometheus {
			t.Error("a ServiceMonitor without USE_PROMETHEUS=true: nothing serves its port")
		}
		if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
			t.Errorf("ServiceMonitor selector %v does not select the Service's labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		for _, e := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
				return p.Name == e.Port && portNumber(c, p.TargetPort) == containerPort(c, "metrics")
			}) {
				t.Errorf("ServiceMonitor scrapes port %q, which is not the Service's metrics port", e.Port)
			}
			if e.Path != "" && e.Path != set.PrometheusPath {
				t.Errorf("ServiceMonitor scrapes %s, PROMETHEUS_PATH is %s", e.Path, set.PrometheusPath)
			}
		}
	}
}

// mountedVolume returns the volume mounted whole at dir in c, or nil. A
// subPath mount does not count: the kubelet never updates it.
func mountedVolume(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, dir string) *corev1.Volume {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) != path.Clean(dir) {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("%s is mounted with subPath %s: the kubelet never updates it, so reloads would never come", dir, m.SubPath)
		}
		for i := range pod.Volumes {
			if pod.Volumes[i].Name == m.Name {
				return &pod.Volumes[i]
			}
		}
		t.Errorf("volume mount %s names no volume", m.Name)
	}
	return nil
}

// checkAddr: a host:port of a store that the manifests run (a Service of
// that name) has that port.
func checkAddr(t *testing.T, objs *objects, setting, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s=%s: %v", setting, addr, err)
		return
	}
	svc := objs.services[strings.Split(host, ".")[0]]
	if svc == nil {
		return // a store outside the manifests
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port }) {
		t.Errorf("%s=%s: Service %s has no port %s", setting, addr, svc.Name, port)
	}
}

// deref formats an optional field: its value, or "unset".
func deref[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// checkPublished: the Service publishes PORT only for /json clients (the
// kubelet probes the pods themselves), never the debug port; and, unless
// the values turn it off, a NetworkPolicy on the pods lets in exactly the
// ports the Service publishes, over TCP.
func checkPublished(t *testing.T, objs *objects, svc *corev1.Service, c *corev1.Container, set *settings.Settings, podLabels map[string]string, w want) {
	t.Helper()
	published := map[int32]bool{}
	for _, p := range svc.Spec.Ports {
		published[portNumber(c, p.TargetPort)] = true
	}
	if published[int32(set.Port)] != w.json {
		t.Errorf("Service %s publishes PORT %d: %v, want %v (only for /json clients)", svc.Name, set.Port, published[int32(set.Port)], w.json)
	}
	if published[int32(set.DebugPort)] {
		t.Errorf("Service %s publishes the debug port %d", svc.Name, set.DebugPort)
	}
	var policies []*networkingv1.NetworkPolicy
	for _, np := range objs.networkPolicies {
		if selects(np.Spec.PodSelector.MatchLabels, podLabels) {
			policies = append(policies, np)
		}
	}
	if w.noNetworkPolicy {
		if len(policies) != 0 {
			t.Errorf("%d NetworkPolicies select the pods, want none", len(policies))
		}
		return
	}
	if len(policies) != 1 {
		t.Fatalf("%d NetworkPolicies select the pods, want 1", len(policies))
	}
	np := policies[0]
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy %s: policyTypes %v, want Ingress", np.Name, np.Spec.PolicyTypes)
	}
	admitted := map[int32]bool{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("NetworkPolicy %s: a rule without ports lets in every port", np.Name)
		}
		for _, p := range r.Ports {
			if p.Port == nil || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
				t.Errorf("NetworkPolicy %s: port %v protocol %v, want a TCP port", np.Name, p.Port, p.Protocol)
				continue
			}
			n := portNumber(c, *p.Port)
			if n == 0 {
				t.Errorf("NetworkPolicy %s: port %s is no container port", np.Name, p.Port.String())
			}
			admitted[n] = true
		}
	}
	if !maps.Equal(admitted, published) {
		t.Errorf("NetworkPolicy %s lets in ports %v; the Service publishes %v", np.Name, slices.Sorted(maps.Keys(admitted)), slices.Sorted(maps.Keys(published)))
	}
}
