package integration

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/ratelimitd/ratelimit/harness"
)

// aliasBomb is a rules file of about 40 KB whose one list, used 200 times,
// expands to 200,000 descriptors (it built every one of them, and a 103 KB
// one built 1,000,000 rules: RSS 143 MB -> 1.23 GB).
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("domain: web\ndescriptors:\n  - key: base\n    descriptors: &list\n")
	for i := range 1000 {
		fmt.Fprintf(&b, "      - {key: k%d, rate_limit: {unit: hour, requests_per_unit: 1}}\n", i)
	}
	for i := range 200 {
		fmt.Fprintf(&b, "  - key: copy%d\n    descriptors: *list\n", i)
	}
	return b.String()
}

// TestRulesBoundsOverTheWire: a rules file that expands past the bound is
// refused on reload (the rules in use answer on) and by ratelimit-check;
// a chain of 5,000 nested descriptors over xDS (48 KB; RSS went to 481 MB)
// is NACKed naming the depth, and the service's memory stays where it was.
func TestRulesBoundsOverTheWire(t *testing.T) {
	slow(t)
	t.Run("alias_expansion", func(t *testing.T) {
		p := start(t, map[string]string{"web.yaml": webRules}, "RUNTIME_QUIET_PERIOD=50ms")
		writeRules(t, p.root, "web.yaml", aliasBomb())
		eventually(t, "the reload refused", 30*time.Second, func() bool {
			return p.stats(t)["ratelimit.service.config_load_error"] == 1
		})
		if !strings.Contains(p.logs(), "more than 100000 descriptors") {
			t.Errorf("the refusal does not say why:\n%s", p.logs())
		}
		resp, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "kept"))
		if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Errorf("after the refused reload: %v, %v; want the rules in use", resp, err)
		}

		// ratelimit-check refuses it too, with the file's name.
		dir := t.TempDir()
		writeRules(t, dir, "bomb.yaml", aliasBomb())
		out, err := exec.Command("go", "run", "github.com/ratelimitd/ratelimit/cmd/ratelimit-check", "-config_dir", filepath.Join(dir, "config")).CombinedOutput()
		if code := exitCode(err); code != 1 || !strings.Contains(string(out), "bomb.yaml:") {
			t.Errorf("ratelimit-check: exit %d, %s; want 1 naming bomb.yaml", code, out)
		}
	})

	t.Run("xds_depth", func(t *testing.T) {
		xds := harness.StartXDS(t, harness.XDSOptions{})
		xds.SetConfigs(t, egNode, xdsWeb(3, 100))
		p := launchWith(t, launchOpts{binary: plainBinary(t)}, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr,
			"CONFIG_GRPC_XDS_NODE_ID="+egNode, "REQUEST_TIMEOUT=2s")
		p.waitHealth(t, http.StatusOK)
		before := p.statusKB(t, "VmRSS")
		var chain []*rlsconfv3.RateLimitDescriptor
		for i := range 5000 {
			chain = []*rlsconfv3.RateLimitDescriptor{{Key: fmt.Sprintf("k%d", 5000-i), Descriptors: chain}}
		}
		deep := xdsWeb(3, 100)
		deep.Descriptors = append(deep.Descriptors, chain...)
		from := len(xds.Requests())
		xds.SetConfigs(t, egNode, deep)
		nack := xds.WaitRequest(t, from, 30*time.Second, "NACK", harness.XDSRequest.NACK)
		if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, `xds: config "web" (domain web)`) || !strings.Contains(msg, "more than 64") {
			t.Errorf("NACK %q, want the config and the depth", msg)
		}
		if after := p.statusKB(t, "VmRSS"); after > before+64<<10 {
			t.Errorf("RSS %d kB -> %d kB for a 5,000-deep chain", before, after)
		}
	})
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
