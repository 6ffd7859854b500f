package harness

import (
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestRewrite(t *testing.T) {
	data, err := os.ReadFile("../examples/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := RewriteBootstrap(data, map[string]string{"upstream": "127.0.0.1:5001", "ratelimit": "[::1]:5002"})
	if err != nil {
		t.Fatal(err)
	}
	var b struct {
		Admin struct {
			Address struct {
				SocketAddress map[string]any `yaml:"socket_address"`
			} `yaml:"address"`
		} `yaml:"admin"`
		StaticResources struct {
			Listeners []struct {
				Address struct {
					SocketAddress map[string]any `yaml:"socket_address"`
				} `yaml:"address"`
			} `yaml:"listeners"`
			Clusters []struct {
				Name           string `yaml:"name"`
				Type           string `yaml:"type"`
				LoadAssignment struct {
					Endpoints []struct {
						LbEndpoints []struct {
							Endpoint struct {
								Address struct {
									SocketAddress map[string]any `yaml:"socket_address"`
								} `yaml:"address"`
							} `yaml:"endpoint"`
						} `yaml:"lb_endpoints"`
					} `yaml:"endpoints"`
				} `yaml:"load_assignment"`
			} `yaml:"clusters"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	loopback := map[string]any{"address": "127.0.0.1", "port_value": 0}
	check := func(what string, got, want map[string]any) {
		t.Helper()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %v, want %v", what, k, got[k], v)
			}
		}
	}
	check("admin", b.Admin.Address.SocketAddress, loopback)
	if len(b.StaticResources.Listeners) == 0 {
		t.Fatal("no listeners")
	}
	for _, l := range b.StaticResources.Listeners {
		check("listener", l.Address.SocketAddress, loopback)
	}
	want := map[string]map[string]any{
		"upstream":  {"address": "127.0.0.1", "port_value": 5001},
		"ratelimit": {"address": "::1", "port_value": 5002},
	}
	for _, c := range b.StaticResources.Clusters {
		if c.Type != "STRICT_DNS" {
			t.Errorf("cluster %s: type %q; the rest of the bootstrap must be kept", c.Name, c.Type)
		}
		for _, e := range c.LoadAssignment.Endpoints {
			for _, lb := range e.LbEndpoints {
				check("cluster "+c.Name, lb.Endpoint.Address.SocketAddress, want[c.Name])
			}
		}
	}
	if !strings.Contains(out, "http2_protocol_options") {
		t.Error("the service's cluster lost its HTTP/2 options")
	}

	if _, err := RewriteBootstrap(data, map[string]string{"upstream": "127.0.0.1:5001"}); err == nil || !strings.Contains(err.Error(), `cluster "ratelimit"`) {
		t.Errorf("RewriteBootstrap without the ratelimit cluster's address: %v, want an error naming it", err)
	}
	if _, err := RewriteBootstrap([]byte("admin: [1"), nil); err == nil {
		t.Error("RewriteBootstrap of YAML that does not parse: no error")
	}
	if _, err := RewriteBootstrap([]byte("static_resources: {}"), nil); err == nil {
		t.Error("RewriteBootstrap of a bootstrap without admin: no error")
	}
}
