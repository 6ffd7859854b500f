package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// No Docker engine runs here, so docker-compose.yml is checked for the
// facts the demo relies on: the names and ports Envoy's clusters call
// exist, the service gets its rules where its settings look, and they are
// valid rules for the domain Envoy asks about.

// composeFile is the subset of the Compose format the demo uses; decoding
// is strict, so a misspelled key fails.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Command     []string          `yaml:"command"`
	Entrypoint  []string          `yaml:"entrypoint"`
	DependsOn   any               `yaml:"depends_on"`
	User        string            `yaml:"user"`
	ReadOnly    bool              `yaml:"read_only"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
	Ports   []string `yaml:"ports"`
	Expose  []string `yaml:"expose"`
	Restart string   `yaml:"restart"`
}

// containerPorts are the ports a service offers to the others: exposed or
// published (the container side of host:container).
func (s composeService) containerPorts() []string {
	out := slices.Clone(s.Expose)
	for _, p := range s.Ports {
		parts := strings.Split(p, ":")
		out = append(out, parts[len(parts)-1])
	}
	return out
}

// mount returns the host path mounted at target, relative to the
// repository, or "".
func (s composeService) mount(target string) string {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && filepath.Clean(parts[1]) == filepath.Clean(target) {
			return parts[0]
		}
	}
	return ""
}

// env is a setting of the service: its environment, else the default.
func (s composeService) env(t *testing.T, name string) string {
	t.Helper()
	if v, ok := s.Environment[name]; ok {
		return v
	}
	return settingDefault(t, name)
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

func TestComposeMatchesEnvoyExample(t *testing.T) {
	c := loadCompose(t)
	svc, ok := c.Services["ratelimit"]
	if !ok {
		t.Fatal("docker-compose.yml has no ratelimit service")
	}
	envoy, ok := c.Services["envoy"]
	if !ok {
		t.Fatal("docker-compose.yml has no envoy service")
	}

	// The Envoy of the demo is the one the tests prove the example with.
	if want := "envoyproxy/envoy:v" + harness.EnvoyVersion; envoy.Image != want {
		t.Errorf("the envoy service runs %s; the tests run Envoy %s: want image %s", envoy.Image, harness.EnvoyVersion, want)
	}

	// Envoy's bootstrap is the example, and every cluster it calls is a
	// service of the file offering that port.
	src := envoy.mount("/etc/envoy/envoy.yaml")
	if src == "" {
		t.Fatal("the envoy service mounts no bootstrap at /etc/envoy/envoy.yaml")
	}
	b := loadBootstrap(t, filepath.Join("..", src))
	for _, cl := range b.GetStaticResources().GetClusters() {
		for _, e := range cl.GetLoadAssignment().GetEndpoints() {
			for _, lb := range e.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				target, ok := c.Services[sa.GetAddress()]
				port := strconv.Itoa(int(sa.GetPortValue()))
				switch {
				case !ok:
					t.Errorf("cluster %q calls %s, which is no service of docker-compose.yml", cl.GetName(), sa.GetAddress())
				case !slices.Contains(target.containerPorts(), port):
					t.Errorf("cluster %q calls %s:%s; the service offers %v", cl.GetName(), sa.GetAddress(), port, target.containerPorts())
				}
			}
		}
	}
	// The ratelimit service listens where it says it does.
	for _, name := range []string{"PORT", "GRPC_PORT"} {
		if p := svc.env(t, name); !slices.Contains(svc.containerPorts(), p) {
			t.Errorf("the ratelimit service listens on %s=%s but publishes %v", name, p, svc.containerPorts())
		}
	}
	// Only Envoy is published to the network: the other services'
	// published ports bind loopback alone (host-ip:host-port:container).
	for name, other := range c.Services {
		for _, p := range other.Ports {
			if name != "envoy" && !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q to every interface; publish it on 127.0.0.1 or not at all", name, p)
			}
		}
	}
	// Envoy's listeners are published.
	for _, l := range b.GetStaticResources().GetListeners() {
		if p := strconv.Itoa(int(l.GetAddress().GetSocketAddress().GetPortValue())); !slices.Contains(envoy.containerPorts(), p) {
			t.Errorf("Envoy listener %q on port %s is not published (ports %v)", l.GetName(), p, envoy.Ports)
		}
	}
	// The Redis it is told to use is there.
	if svc.env(t, "BACKEND_TYPE") == "redis" {
		host, port, err := net.SplitHostPort(svc.env(t, "REDIS_URL"))
		if err != nil {
			t.Fatalf("REDIS_URL: %v", err)
		}
		if r, ok := c.Services[host]; !ok || !slices.Contains(r.containerPorts(), port) {
			t.Errorf("REDIS_URL=%s: no service %s offering port %s", svc.env(t, "REDIS_URL"), host, port)
		}
	}

	// The rules are mounted where RUNTIME_* says, and they are valid rules
	// holding the domain of every rate-limit filter of the bootstrap.
	dir := filepath.Join(svc.env(t, "RUNTIME_ROOT"), svc.env(t, "RUNTIME_SUBDIRECTORY"), settingDefault(t, "RUNTIME_APPDIRECTORY"))
	rulesSrc := svc.mount(dir)
	if rulesSrc == "" {
		t.Fatalf("the ratelimit service mounts no rules at %s, where its RUNTIME_* settings read them (volumes %v)", dir, svc.Volumes)
	}
	files, err := filepath.Glob(filepath.Join("..", rulesSrc, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no rule files (%v)", rulesSrc, err)
	}
	var rf []rules.File
	for _, f := range files {
		rf = append(rf, readRules(t, f))
	}
	cfg := parseRules(t, rf...)
	for _, f := range rateLimitFilters(t, b) {
		if !cfg.HasDomain(f.domain) {
			t.Errorf("Envoy asks about domain %q; the compose rules hold %v", f.domain, cfg.Domains())
		}
	}

	// Locked down as a cluster would run it, and health checked without a
	// shell, as the image's HEALTHCHECK.
	if uid, _, _ := strings.Cut(svc.User, ":"); uid == "" || uid == "0" {
		t.Errorf("the ratelimit service runs as user %q; want a non-root uid", svc.User)
	}
	if !svc.ReadOnly {
		t.Error("the ratelimit service's root filesystem is not read_only")
	}
	if hc := svc.Healthcheck; hc == nil || !slices.Equal(hc.Test, []string{"CMD", "/bin/ratelimit", "-healthcheck"}) {
		t.Errorf("the ratelimit service's healthcheck is %v, want [CMD /bin/ratelimit -healthcheck]", fmt.Sprint(hc))
	}
}
