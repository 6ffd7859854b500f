package harness

import (
	"fmt"
	"net"
	"strconv"

	"gopkg.in/yaml.v3"
)

// RewriteBootstrap returns a shipped bootstrap (YAML) made to run on this machine:
// its admin and every listener on 127.0.0.1 port 0, and the endpoints of
// each static cluster at the host:port clusters gives for its name. The
// rest is kept. A cluster missing from clusters is an error: the bootstrap
// must not call anything the caller did not stand up.
func RewriteBootstrap(bootstrap []byte, clusters map[string]string) (string, error) {
	var root map[string]any
	if err := yaml.Unmarshal(bootstrap, &root); err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	loopback := func(sa map[string]any) {
		sa["address"] = "127.0.0.1"
		sa["port_value"] = 0
	}
	admin, err := yamlMap(root, "admin", "address", "socket_address")
	if err != nil {
		return "", err
	}
	loopback(admin)
	static, err := yamlMap(root, "static_resources")
	if err != nil {
		return "", err
	}
	listeners, err := yamlList(static["listeners"])
	if err != nil {
		return "", err
	}
	for _, l := range listeners {
		sa, err := yamlMap(l, "address", "socket_address")
		if err != nil {
			return "", err
		}
		loopback(sa)
	}
	cls, err := yamlList(static["clusters"])
	if err != nil {
		return "", err
	}
	for _, c := range cls {
		name, _ := c["name"].(string)
		addr, ok := clusters[name]
		if !ok {
			return "", fmt.Errorf("harness: cluster %q: no address for it", name)
		}
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return "", fmt.Errorf("harness: cluster %q: %w", name, err)
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return "", fmt.Errorf("harness: cluster %q: port %q: %w", name, p, err)
		}
		if err := pointEndpoints(c, host, port); err != nil {
			return "", fmt.Errorf("harness: cluster %q: %w", name, err)
		}
	}
	out, err := yaml.Marshal(root)
	if err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	return string(out), nil
}

// pointEndpoints sets every endpoint of cluster c to host:port.
func pointEndpoints(c map[string]any, host string, port int) error {
	la, err := yamlMap(c, "load_assignment")
	if err != nil {
		return err
	}
	eps, err := yamlList(la["endpoints"])
	if err != nil {
		return err
	}
	for _, e := range eps {
		lbs, err := yamlList(e["lb_endpoints"])
		if err != nil {
			return err
		}
		for _, lb := range lbs {
			sa, err := yamlMap(lb, "endpoint", "address", "socket_address")
			if err != nil {
				return err
			}
			sa["address"], sa["port_value"] = host, port
		}
	}
	return nil
}

// yamlMap walks nested YAML maps along path.
func yamlMap(m map[string]any, path ...string) (map[string]any, error) {
	for _, k := range path {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("harness: no map at %q of %v", k, path)
		}
		m = next
	}
	return m, nil
}

// yamlList is a YAML list of maps.
func yamlList(v any) ([]map[string]any, error) {
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("harness: not a list: %T", v)
	}
	out := make([]map[string]any, len(items))
	for i, it := range items {
		if out[i], ok = it.(map[string]any); !ok {
			return nil, fmt.Errorf("harness: list item %d is %T, not a map", i, it)
		}
	}
	return out, nil
}
