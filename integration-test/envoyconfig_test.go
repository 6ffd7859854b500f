package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	httpratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// This file reads Envoy configuration as Envoy does (YAML -> JSON -> the
// v3 protos, unknown fields refused, every typed_config unpacked with the
// extension types registered by the imports above) and evaluates the
// rate-limit actions of a route on a sample request, so that tests can
// check which descriptors a config really sends.

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

// sampleRequest is an HTTP request as the rate-limit actions see it.
type sampleRequest struct {
	path    string
	headers map[string]string // lower-case names
	remote  string            // the downstream address
}

// header returns a request header, with the pseudo-header :path.
func (r sampleRequest) header(name string) (string, bool) {
	if name == ":path" {
		return r.path, true
	}
	v, ok := r.headers[strings.ToLower(name)]
	return v, ok
}

// route returns the first route of the virtual host matching "*" whose
// path match the request meets (routes are tried in order, as in Envoy).
// Only the matchers the examples use are known: path and prefix.
func route(t *testing.T, rc *routev3.RouteConfiguration, r sampleRequest) (*routev3.VirtualHost, *routev3.Route) {
	t.Helper()
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			m := rt.GetMatch()
			switch p := m.GetPathSpecifier().(type) {
			case *routev3.RouteMatch_Path:
				if r.path == p.Path {
					return vh, rt
				}
			case *routev3.RouteMatch_Prefix:
				if strings.HasPrefix(r.path, p.Prefix) {
					return vh, rt
				}
			default:
				t.Fatalf("route %q: the evaluator knows path and prefix matches, not %T", rt.GetName(), p)
			}
		}
	}
	return nil, nil
}

// descriptors evaluates rate-limit configurations on r as Envoy does: each
// RateLimit of stage 0 makes one descriptor, one entry per action in
// order, unless an action produces nothing, which drops the descriptor
// (a missing header, a header_value_match that does not match).
// Unsupported actions fail the test rather than being guessed at.
func descriptors(t *testing.T, limits []*routev3.RateLimit, r sampleRequest) [][]rules.Entry {
	t.Helper()
	var out [][]rules.Entry
next:
	for _, rl := range limits {
		if rl.GetStage().GetValue() != 0 {
			continue
		}
		var d []rules.Entry
		for _, a := range rl.GetActions() {
			switch x := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RemoteAddress_:
				d = append(d, rules.Entry{Key: "remote_address", Value: r.remote})
			case *routev3.RateLimit_Action_GenericKey_:
				key := x.GenericKey.GetDescriptorKey()
				if key == "" {
					key = "generic_key"
				}
				d = append(d, rules.Entry{Key: key, Value: x.GenericKey.GetDescriptorValue()})
			case *routev3.RateLimit_Action_RequestHeaders_:
				v, ok := r.header(x.RequestHeaders.GetHeaderName())
				if !ok {
					if x.RequestHeaders.GetSkipIfAbsent() {
						continue
					}
					continue next
				}
				d = append(d, rules.Entry{Key: x.RequestHeaders.GetDescriptorKey(), Value: v})
			case *routev3.RateLimit_Action_HeaderValueMatch_:
				hv := x.HeaderValueMatch
				expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
				if headersMatch(t, hv.GetHeaders(), r) != expect {
					continue next
				}
				key := hv.GetDescriptorKey()
				if key == "" {
					key = "header_match"
				}
				d = append(d, rules.Entry{Key: key, Value: hv.GetDescriptorValue()})
			default:
				t.Fatalf("the evaluator does not know the action %T", x)
			}
		}
		if len(d) > 0 {
			out = append(out, d)
		}
	}
	return out
}

// headersMatch reports whether every matcher matches r. Only the string
// matchers the examples use are known.
func headersMatch(t *testing.T, ms []*routev3.HeaderMatcher, r sampleRequest) bool {
	t.Helper()
	for _, m := range ms {
		v, present := r.header(m.GetName())
		var ok bool
		switch {
		case m.GetPresentMatch():
			ok = present
		case m.GetStringMatch() != nil:
			ok = present && stringMatch(t, m.GetStringMatch(), v)
		default:
			t.Fatalf("header matcher %q: the evaluator knows present_match and string_match", m.GetName())
		}
		if ok == m.GetInvertMatch() {
			return false
		}
	}
	return true
}

func stringMatch(t *testing.T, m *matcherv3.StringMatcher, v string) bool {
	t.Helper()
	if m.GetIgnoreCase() {
		t.Fatal("the evaluator does not know ignore_case")
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return v == p.Exact
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, p.Prefix)
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(v, p.Suffix)
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(v, p.Contains)
	default:
		t.Fatalf("the evaluator does not know the string match %T", p)
		return false
	}
}

// networkDescriptors are the network filter's fixed descriptors.
func networkDescriptors(n *netratelimitv3.RateLimit) [][]rules.Entry {
	var out [][]rules.Entry
	for _, d := range n.GetDescriptors() {
		out = append(out, entries(d))
	}
	return out
}

func entries(d *ratelimitv3.RateLimitDescriptor) []rules.Entry {
	var out []rules.Entry
	for _, e := range d.GetEntries() {
		out = append(out, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return out
}

// routeLimits are the rate limits Envoy applies on a route with the
// filter's default vh_rate_limits (OVERRIDE): the route's, or the virtual
// host's when the route has none.
func routeLimits(vh *routev3.VirtualHost, rt *routev3.Route) []*routev3.RateLimit {
	if limits := rt.GetRoute().GetRateLimits(); len(limits) > 0 {
		return limits
	}
	return vh.GetRateLimits()
}
