package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	httpratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"
)

// This file reads Envoy configuration as Envoy does (YAML -> JSON -> the
// v3 protos, unknown fields refused, every typed_config unpacked with the
// extension types registered by the imports above), for the checks of the
// examples that Envoy itself does not make (their timeouts, clusters and
// domains). What descriptors a config sends is left to real Envoy
// (envoy_test.go): the Go evaluation of route actions that stood in for
// it is gone.

// yamlToJSON converts one YAML document to JSON, as Envoy does before it
// parses a YAML config as proto JSON.
func yamlToJSON(t *testing.T, name string, data []byte) []byte {
	t.Helper()
	var v any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		t.Fatalf("%s: more than one YAML document", name)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b
}

// decodeEnvoy decodes JSON into m strictly (an unknown or misspelled field
// is an error) and validates it with the protos' own rules, as Envoy does,
// including every Any it holds, recursively.
func decodeEnvoy(t *testing.T, name string, js []byte, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(js, m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := validateDeep(m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// validator is what protoc-gen-validate generates on every message.
type validator interface{ ValidateAll() error }

// validateDeep runs ValidateAll on m and on the message inside every Any
// field under it (ValidateAll does not look inside an Any: a typed_config
// is checked only when unpacked).
func validateDeep(m proto.Message) error {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var errs []error
	var walk func(protoreflect.Message)
	walk = func(msg protoreflect.Message) {
		if a, ok := msg.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a.GetTypeUrl(), err))
				return
			}
			if err := validateDeep(inner); err != nil {
				errs = append(errs, err)
			}
			return
		}
		msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message())
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
	return errors.Join(errs...)
}

// loadBootstrap reads, decodes and validates an Envoy bootstrap file.
func loadBootstrap(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	decodeEnvoy(t, path, yamlToJSON(t, path, data), b)
	return b
}

// unpack unmarshals a typed_config, which validateDeep has already checked.
func unpack[M proto.Message](t *testing.T, a *anypb.Any, m M) M {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: %v", a.GetTypeUrl(), err)
	}
	return m
}

// rlsFilter is what a rate-limit filter of a listener asks: its domain,
// the gRPC cluster it calls, and, for the HTTP filter, the routes whose
// actions make the descriptors; for the network filter, its descriptors.
type rlsFilter struct {
	listener string
	domain   string
	cluster  string
	http     *httpratelimitv3.RateLimit
	network  *netratelimitv3.RateLimit
	routes   *routev3.RouteConfiguration
}

// rateLimitFilters finds every rate-limit filter of the bootstrap's
// listeners, HTTP and network.
func rateLimitFilters(t *testing.T, b *bootstrapv3.Bootstrap) []rlsFilter {
	t.Helper()
	var out []rlsFilter
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				switch f.GetTypedConfig().GetTypeUrl() {
				case "type.googleapis.com/envoy.extensions.filters.network.ratelimit.v3.RateLimit":
					n := unpack(t, f.GetTypedConfig(), &netratelimitv3.RateLimit{})
					out = append(out, rlsFilter{listener: l.GetName(), domain: n.GetDomain(), network: n,
						cluster: n.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()})
				case "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager":
					hcm := unpack(t, f.GetTypedConfig(), &hcmv3.HttpConnectionManager{})
					for _, hf := range hcm.GetHttpFilters() {
						if hf.GetTypedConfig().GetTypeUrl() != "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit" {
							continue
						}
						h := unpack(t, hf.GetTypedConfig(), &httpratelimitv3.RateLimit{})
						out = append(out, rlsFilter{listener: l.GetName(), domain: h.GetDomain(), http: h, routes: hcm.GetRouteConfig(),
							cluster: h.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()})
					}
				}
			}
		}
	}
	return out
}
