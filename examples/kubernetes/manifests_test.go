package kubernetes

import (
	"bytes"
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// kustomization is the part of kustomization.yaml the manifests use,
// decoded strictly.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
}

// loadManifests decodes every resource the kustomization lists.
func loadManifests(t *testing.T) (*kustomization, *objects) {
	t.Helper()
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.Kind != "Kustomization" || len(k.Resources) == 0 {
		t.Fatalf("kustomization.yaml: kind %q with %d resources", k.Kind, len(k.Resources))
	}
	objs := newObjects()
	for _, r := range k.Resources {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatalf("kustomization.yaml lists %s: %v", r, err)
		}
		decodeObjects(t, r, b, objs)
	}
	return &k, objs
}

func TestManifests(t *testing.T) {
	k, objs := loadManifests(t)
	checkRatelimit(t, objs, want{
		name:           "ratelimit",
		rulesConfigMap: "ratelimit-config",
		backend:        "redis",
		hpa:            true,
	})
	// Redis: the rate-limit pods alone may reach it (whoever can write to
	// it can reset any client's counters).
	redis := objs.deployments["redis"]
	np := objs.networkPolicies["redis"]
	if redis == nil || np == nil || !selects(np.Spec.PodSelector.MatchLabels, redis.Spec.Template.Labels) {
		t.Fatal("no NetworkPolicy selects the Redis pods")
	}
	rl := objs.deployments["ratelimit"].Spec.Template.Labels
	for _, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Error("NetworkPolicy redis: a rule lets in any source")
		}
		for _, peer := range r.From {
			if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil || !selects(peer.PodSelector.MatchLabels, rl) {
				t.Errorf("NetworkPolicy redis lets in %v, want the rate-limit pods alone", peer)
			}
		}
	}
	if k.Namespace != "" && objs.namespaces[k.Namespace] == nil {
		t.Errorf("the kustomization puts everything in namespace %s, which it does not create", k.Namespace)
	}
}

// TestManifestsListEveryFile: a manifest left out of kustomization.yaml
// is never applied.
func TestManifestsListEveryFile(t *testing.T) {
	k, _ := loadManifests(t)
	listed := map[string]bool{"kustomization.yaml": true}
	for _, r := range k.Resources {
		listed[r] = true
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && bytes.HasSuffix([]byte(n), []byte(".yaml")) && !listed[n] {
			t.Errorf("%s is not listed in kustomization.yaml", n)
		}
	}
}
