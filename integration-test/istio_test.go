package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	httpratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// The Istio example (examples/istio) is read as Istio and Envoy read it:
// each EnvoyFilter's spec strictly with Istio's own API types, and the
// Envoy config its patches embed with go-control-plane's, validated.
// Real Envoy runs its patches applied to a listener of the test's in
// envoyistio_test.go.

const istioExample = "../examples/istio"

// envoyFilter is an EnvoyFilter object: the Kubernetes envelope, and the
// spec decoded with Istio's types.
type envoyFilter struct {
	name, namespace string
	spec            *networkingv1alpha3.EnvoyFilter
}

func loadEnvoyFilter(t *testing.T, path string) envoyFilter {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var obj struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if obj.APIVersion != "networking.istio.io/v1alpha3" || obj.Kind != "EnvoyFilter" {
		t.Fatalf("%s: %s %s, want networking.istio.io/v1alpha3 EnvoyFilter", path, obj.APIVersion, obj.Kind)
	}
	spec := &networkingv1alpha3.EnvoyFilter{}
	if err := protojson.Unmarshal(obj.Spec, spec); err != nil {
		t.Fatalf("%s: spec: %v", path, err)
	}
	return envoyFilter{name: obj.Metadata.Name, namespace: obj.Metadata.Namespace, spec: spec}
}

// patchJSON is a patch's value as JSON, for go-control-plane's decoder.
func patchJSON(t *testing.T, p *networkingv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch) []byte {
	t.Helper()
	b, err := protojson.Marshal(p.GetPatch().GetValue())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// istioFilter is what one EnvoyFilter gives Envoy: the rate-limit filter
// and the rate limits of the virtual hosts it patches.
type istioFilter struct {
	file    string
	context networkingv1alpha3.EnvoyFilter_PatchContext
	filter  *httpratelimitv3.RateLimit
	vhost   *routev3.VirtualHost
}

func loadIstioFilter(t *testing.T, file string) istioFilter {
	t.Helper()
	ef := loadEnvoyFilter(t, filepath.Join(istioExample, file))
	out := istioFilter{file: file}
	if len(ef.spec.GetWorkloadSelector().GetLabels()) == 0 {
		t.Errorf("%s: no workloadSelector: the patches would apply to every proxy of the namespace", file)
	}
	for i, p := range ef.spec.GetConfigPatches() {
		where := fmt.Sprintf("%s: configPatches[%d] (%s)", file, i, p.GetApplyTo())
		out.context = p.GetMatch().GetContext()
		switch p.GetApplyTo() {
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			if op := p.GetPatch().GetOperation(); op != networkingv1alpha3.EnvoyFilter_Patch_INSERT_BEFORE {
				t.Errorf("%s: operation %s, want INSERT_BEFORE", where, op)
			}
			if sub := p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName(); sub != "envoy.filters.http.router" {
				t.Errorf("%s: inserted before %q, want before the router: a filter after it never runs", where, sub)
			}
			hf := &hcmv3.HttpFilter{}
			decodeEnvoy(t, where, patchJSON(t, p), hf)
			out.filter = unpack(t, hf.GetTypedConfig(), &httpratelimitv3.RateLimit{})
		case networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST:
			if op := p.GetPatch().GetOperation(); op != networkingv1alpha3.EnvoyFilter_Patch_MERGE {
				t.Errorf("%s: operation %s, want MERGE", where, op)
			}
			// A MERGE value is a fragment (no name, no domains): decode it
			// strictly, and validate what it adds.
			vh := &routev3.VirtualHost{}
			if err := protojson.Unmarshal(patchJSON(t, p), vh); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			for _, rl := range vh.GetRateLimits() {
				if err := validateDeep(rl); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
			out.vhost = vh
		default:
			t.Fatalf("%s: the test knows HTTP_FILTER and VIRTUAL_HOST patches", where)
		}
	}
	if out.filter == nil || out.vhost == nil {
		t.Fatalf("%s: want a rate-limit HTTP filter and a virtual host's rate_limits", file)
	}
	return out
}

// configMapObject is a ConfigMap object as the rules patch writes it; decoded
// strictly, so a misspelled field fails. (The Kubernetes types are left to
// examples/kubernetes, to keep this package's build light.)
type configMapObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
}

// istioRules are the rules the Istio example adds to the ConfigMap.
func istioRules(t *testing.T) *rules.Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(istioExample, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm configMapObject
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatalf("rules.yaml: %v", err)
	}
	var files []rules.File
	for name, text := range cm.Data {
		files = append(files, rules.File{Name: name, Data: []byte(text)})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return parseRules(t, files...)
}

// ratelimitCluster is the cluster name Istio gives the service of
// examples/kubernetes: outbound|PORT||NAME.NAMESPACE.svc.cluster.local.
func ratelimitCluster(t *testing.T) string {
	t.Helper()
	var k struct {
		Namespace string `json:"namespace"`
	}
	readYAML(t, "../examples/kubernetes/kustomization.yaml", &k)
	var svc struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Ports []struct {
				Name string `json:"name"`
				Port int    `json:"port"`
			} `json:"ports"`
		} `json:"spec"`
	}
	readYAML(t, "../examples/kubernetes/service.yaml", &svc)
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			return fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", p.Port, svc.Metadata.Name, k.Namespace)
		}
	}
	t.Fatal("examples/kubernetes/service.yaml has no grpc port")
	return ""
}

// readYAML decodes the fields of a file that v declares, ignoring others.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestIstioExample(t *testing.T) {
	cfg := istioRules(t)
	cluster := ratelimitCluster(t)
	filters := map[string]istioFilter{}
	for _, file := range []string{"gateway-envoyfilter.yaml", "sidecar-envoyfilter.yaml"} {
		f := loadIstioFilter(t, file)
		filters[file] = f
		svc := f.filter.GetRateLimitService()
		if got := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != cluster {
			t.Errorf("%s: the filter calls cluster %q; Istio names the service of examples/kubernetes %q", file, got, cluster)
		}
		if svc.GetTransportApiVersion().String() != "V3" {
			t.Errorf("%s: transport_api_version %v, want V3", file, svc.GetTransportApiVersion())
		}
		if f.filter.GetTimeout() == nil {
			t.Errorf("%s: no timeout", file)
		}
		if !cfg.HasDomain(f.filter.GetDomain()) {
			t.Errorf("%s: domain %q is not in rules.yaml (%v)", file, f.filter.GetDomain(), cfg.Domains())
		}
	}
	if c := filters["gateway-envoyfilter.yaml"].context; c != networkingv1alpha3.EnvoyFilter_GATEWAY {
		t.Errorf("gateway-envoyfilter.yaml patches context %s, want GATEWAY", c)
	}
	if c := filters["sidecar-envoyfilter.yaml"].context; c != networkingv1alpha3.EnvoyFilter_SIDECAR_INBOUND {
		t.Errorf("sidecar-envoyfilter.yaml patches context %s, want SIDECAR_INBOUND", c)
	}
}

// TestIstioKustomization: the overlay lists every file of the folder and
// builds on the Kubernetes example.
func TestIstioKustomization(t *testing.T) {
	var k struct {
		Resources []string `json:"resources"`
		Patches   []struct {
			Path string `json:"path"`
		} `json:"patches"`
	}
	readYAML(t, filepath.Join(istioExample, "kustomization.yaml"), &k)
	listed := map[string]bool{"kustomization.yaml": true}
	for _, r := range k.Resources {
		listed[r] = true
	}
	for _, p := range k.Patches {
		listed[p.Path] = true
	}
	if !listed["../kubernetes"] {
		t.Error("examples/istio/kustomization.yaml does not build on ../kubernetes")
	}
	files, _ := filepath.Glob(filepath.Join(istioExample, "*.yaml"))
	for _, f := range files {
		if !listed[filepath.Base(f)] {
			t.Errorf("%s is not listed in examples/istio/kustomization.yaml", filepath.Base(f))
		}
	}
	// The rules patch names the ConfigMap the Deployment mounts.
	var cm configMapObject
	readYAML(t, filepath.Join(istioExample, "rules.yaml"), &cm)
	base, err := os.ReadFile("../examples/kubernetes/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^  name: ` + regexp.QuoteMeta(cm.Metadata.Name) + `$`).Match(base) {
		t.Errorf("rules.yaml patches ConfigMap %q, which examples/kubernetes does not define", cm.Metadata.Name)
	}
}
