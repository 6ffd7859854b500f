// Package kubernetes tests the Kubernetes manifests of this folder and the
// Helm chart in charts/ratelimit against each other and against the
// service's own settings. The package holds tests only.
package kubernetes

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// objects are the Kubernetes objects of a set of manifests, by kind and name.
type objects struct {
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	pdbs            map[string]*policyv1.PodDisruptionBudget
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors map[string]*serviceMonitor
	namespaces      map[string]*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	networkPolicies map[string]*networkingv1.NetworkPolicy
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) the chart renders; decoding is as strict as
// for the core types, so a misspelled field fails.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace,omitempty"`
		Labels    map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// docSeparator splits a YAML stream into documents.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// decodeObjects decodes every document of a YAML stream into its typed
// object, strictly: an unknown or misspelled field, or a kind the tests do
// not know, fails the test.
func decodeObjects(t *testing.T, name string, data []byte, into *objects) {
	t.Helper()
	for i, doc := range docSeparator.Split(string(data), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: document %d: %v", name, i+1, err)
		}
		if head.Kind == "" && strings.TrimSpace(stripComments(doc)) == "" {
			continue // empty, as templates that render nothing leave
		}
		where := fmt.Sprintf("%s: document %d (%s)", name, i+1, head.Kind)
		strict := func(obj any) {
			t.Helper()
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		}
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			strict(o)
			put(t, where, into.deployments, o.Name, o)
		case "v1 Service":
			o := &corev1.Service{}
			strict(o)
			put(t, where, into.services, o.Name, o)
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			strict(o)
			put(t, where, into.configMaps, o.Name, o)
		case "v1 Secret":
			o := &corev1.Secret{}
			strict(o)
			put(t, where, into.secrets, o.Name, o)
		case "v1 Namespace":
			o := &corev1.Namespace{}
			strict(o)
			put(t, where, into.namespaces, o.Name, o)
		case "v1 ServiceAccount":
			o := &corev1.ServiceAccount{}
			strict(o)
			put(t, where, into.serviceAccounts, o.Name, o)
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			strict(o)
			put(t, where, into.pdbs, o.Name, o)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			o := &autoscalingv2.HorizontalPodAutoscaler{}
			strict(o)
			put(t, where, into.hpas, o.Name, o)
		case "networking.k8s.io/v1 NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			strict(o)
			put(t, where, into.networkPolicies, o.Name, o)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o := &serviceMonitor{}
			strict(o)
			put(t, where, into.serviceMonitors, o.Metadata.Name, o)
		default:
			t.Fatalf("%s: apiVersion %q kind %q is not one the tests know", where, head.APIVersion, head.Kind)
		}
	}
}

func newObjects() *objects {
	return &objects{
		deployments:     map[string]*appsv1.Deployment{},
		services:        map[string]*corev1.Service{},
		configMaps:      map[string]*corev1.ConfigMap{},
		secrets:         map[string]*corev1.Secret{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		hpas:            map[string]*autoscalingv2.HorizontalPodAutoscaler{},
		serviceMonitors: map[string]*serviceMonitor{},
		namespaces:      map[string]*corev1.Namespace{},
		serviceAccounts: map[string]*corev1.ServiceAccount{},
		networkPolicies: map[string]*networkingv1.NetworkPolicy{},
	}
}

func put[T any](t *testing.T, where string, m map[string]T, name string, o T) {
	t.Helper()
	if name == "" {
		t.Fatalf("%s: no metadata.name", where)
	}
	if _, dup := m[name]; dup {
		t.Fatalf("%s: a second object named %q", where, name)
	}
	m[name] = o
}

func stripComments(doc string) string {
	var b bytes.Buffer
	for line := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
