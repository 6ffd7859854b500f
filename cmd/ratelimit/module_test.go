package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testOnlyRequirements are the service module's requirements that only its
// unit tests import, each with why it belongs to the service's module
// rather than to the tests' (integration-test/go.mod).
var testOnlyRequirements = map[string]string{
	// The Memcached store's tests prove that this client puts every key on
	// the server envoyproxy/ratelimit's client (gomemcache) picks, so that
	// both count on the same servers during a rolling upgrade. They test
	// unexported functions, so they live beside the store.
	"github.com/bradfitz/gomemcache": "the Memcached store's key placement tests",
	// The xDS management server the tests run (harness/xds.go) is
	// go-control-plane's own, the one Envoy Gateway serves rules with; the
	// provider's and the server's tests speak to it, so the harness lives
	// in this module. The service itself uses go-control-plane's envoy and
	// ratelimit modules only.
	"github.com/envoyproxy/go-control-plane": "the tests' xDS management server",
}

// goModule runs the go command in the service's module alone (no
// workspace) and returns its output.
func goModule(t *testing.T, args ...string) []byte {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// TestModuleRequiresWhatTheServiceUses keeps the service's module lean
// (issue 27): its go.mod is tidy, and each requirement it lists directly
// is imported by a package of the service (its commands and src/), not
// only by tests, but for testOnlyRequirements. What the integration tests,
// the examples' checks and the tools need belongs to their own modules.
func TestModuleRequiresWhatTheServiceUses(t *testing.T) {
	goModule(t, "mod", "tidy", "-diff")

	var mod struct {
		Require []struct {
			Path     string
			Indirect bool
		}
	}
	if err := json.Unmarshal(goModule(t, "mod", "edit", "-json"), &mod); err != nil {
		t.Fatal(err)
	}
	// The service is cmd/ and src/; harness/, storetest/ and loadgen/, in
	// the same module for the tests and tools, must not bring a requirement
	// of their own.
	used := map[string]bool{}
	for _, m := range strings.Fields(string(goModule(t, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./cmd/...", "./src/..."))) {
		used[m] = true
	}
	for _, r := range mod.Require {
		if r.Indirect || used[r.Path] {
			continue
		}
		if why, ok := testOnlyRequirements[r.Path]; ok {
			t.Logf("%s: required by tests only (%s)", r.Path, why)
			continue
		}
		t.Errorf("go.mod requires %s, which no package of the service imports: move what needs it to integration-test/, tools/ or examples/ (a module each)", r.Path)
	}
}
