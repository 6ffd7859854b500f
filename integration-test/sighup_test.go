package integration

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestSIGHUPReloads: SIGHUP reloads the rules at once (a quiet period of a
// minute would hold a change back two otherwise) and the TLS files, and the
// process goes on serving; before, it ended at once (exit 129, no drain).
func TestSIGHUPReloads(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	first := ca.Server(t)
	sec := tlsSecret(t, first, nil)
	p := start(t, map[string]string{"web.yaml": webRules}, append(tlsSettings(sec, false), "RUNTIME_QUIET_PERIOD=1m")...)
	tlsClient := credentials.NewTLS(harness.ClientConfig(nil, ca))
	c := rlsv3.NewRateLimitServiceClient(p.conn(t, tlsClient))

	writeRules(t, p.root, "web.yaml", strings.Replace(webRules, "requests_per_unit: 3", "requests_per_unit: 7", 1))
	second := ca.Server(t)
	sec.Update(t, secretContents(second, nil))
	p.signal(t, syscall.SIGHUP)
	p.waitRules(t, "web.user: unit=HOUR requests_per_unit=7,", time.Now())
	eventually(t, "the new certificate served", 15*time.Second, func() bool {
		serial, err := p.servedWith(t, harness.ClientConfig(nil, ca))
		return err == nil && serial.Cmp(second.Leaf.SerialNumber) == 0
	})
	resp, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "after-hup"))
	if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 7 {
		t.Errorf("after SIGHUP: %v, %v; want the new limit 7 on the connection made before", resp, err)
	}
	if code := p.healthCode(); code != http.StatusOK {
		t.Errorf("/healthcheck %d after SIGHUP, want 200", code)
	}
	if !strings.Contains(p.logs(), "reload asked (SIGHUP)") {
		t.Errorf("SIGHUP not logged:\n%s", p.logs())
	}
}

// TestTLSRotationRefusesDates: a rotation to an expired or a not yet valid
// certificate is refused, logged and counted; the certificate in use keeps
// serving, and its end is exported.
func TestTLSRotationRefusesDates(t *testing.T) {
	ca := harness.NewCA(t, "CA")
	first := ca.Server(t)
	sec := tlsSecret(t, first, nil)
	p := start(t, map[string]string{"web.yaml": webRules}, tlsSettings(sec, false)...)
	if got, want := p.stats(t)["ratelimit.server.tls_cert_not_after"], first.Leaf.NotAfter.Unix(); got != want {
		t.Errorf("tls_cert_not_after = %d, want %d", got, want)
	}
	now := time.Now()
	for i, bad := range []*harness.Cert{
		ca.ServerValid(t, now.Add(-48*time.Hour), now.Add(-time.Hour)),
		ca.ServerValid(t, now.Add(time.Hour), now.Add(48*time.Hour)),
	} {
		sec.Update(t, secretContents(bad, nil))
		eventually(t, "the refusal counted", 15*time.Second, func() bool {
			return p.stats(t)["ratelimit.server.tls_reload_error"] == int64(i+1)
		})
		if serial, err := p.servedWith(t, harness.ClientConfig(nil, ca)); err != nil || serial.Cmp(first.Leaf.SerialNumber) != 0 {
			t.Errorf("after a rotation to certificate %d: serving %v, %v; want the first", i, serial, err)
		}
	}
	for _, want := range []string{"expired on", "not valid before"} {
		if !strings.Contains(p.logs(), want) {
			t.Errorf("logs do not say %q:\n%s", want, p.logs())
		}
	}
}
