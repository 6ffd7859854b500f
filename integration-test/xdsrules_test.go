package integration

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimit/harness"
)

// quotaRules are two quota_mode rules, quota_a (1 an hour) and quota_b (2
// an hour, with metadata), as a rule file; quotaConfig is the same as an
// xDS resource.
const quotaRules = `domain: quota
descriptors:
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    metadata: {plan: gold}
    rate_limit: {unit: hour, requests_per_unit: 2}
`

func quotaConfig(t *testing.T) *rlsconfv3.RateLimitConfig {
	md, err := structpb.NewStruct(map[string]any{"plan": "gold"})
	if err != nil {
		t.Fatal(err)
	}
	return &rlsconfv3.RateLimitConfig{Name: "quota", Domain: "quota", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "quota_a", QuotaMode: true, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1}},
		{Key: "quota_b", QuotaMode: true, Metadata: md, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 2}},
	}}
}

// quotaRoute limits every request by (quota_a=x-a) and (quota_b=x-b): two
// descriptors in one call.
const quotaRoute = `
              - match: {prefix: /}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-a, descriptor_key: quota_a}
                  - actions:
                    - request_headers: {header_name: x-b, descriptor_key: quota_b}`

// TestRealEnvoyQuotaMode puts real Envoy in front of the service, with the
// quota_mode rules from a file and from an xDS server: a request whose
// quota_a is over its limit while quota_b is within gets through (200),
// with Envoy's x-ratelimit headers saying 0 remain and quota_b's metadata
// in the filter's dynamic metadata; once both are over, 429. As
// envoyproxy/ratelimit answers: OK overall, quota_a's status OVER_LIMIT.
func TestRealEnvoyQuotaMode(t *testing.T) {
	up := startUpstream(t)
	env := []string{"RESPONSE_DYNAMIC_METADATA=true"}
	for _, tt := range []struct {
		name  string
		start func(t *testing.T) *proc
	}{
		{"file", func(t *testing.T) *proc { return start(t, map[string]string{"quota.yaml": quotaRules}, env...) }},
		{"xds", func(t *testing.T) *proc {
			xds := harness.StartXDS(t, harness.XDSOptions{})
			xds.SetConfigs(t, egNode, quotaConfig(t))
			p := launch(t, nil, append(env, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode)...)
			p.waitHealth(t, http.StatusOK)
			return p
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.start(t)
			e, accessLog := startEnvoyHTTP(t, envoyHTTP{Routes: quotaRoute, Filters: rateLimitFilter("quota", `
              enable_x_ratelimit_headers: DRAFT_VERSION_03`)}, up, p)
			addr := e.listener(t, "http")
			headers := map[string]string{"x-a": "alice", "x-b": "alice"}
			var got []envoyResponse
			for range 3 {
				got = append(got, httpGet(t, addr, "/", headers))
			}
			for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
				if got[i].code != want {
					t.Fatalf("request %d: HTTP %d, want %d (quota_a over from the 2nd, quota_b from the 3rd)", i+1, got[i].code, want)
				}
			}
			// Over quota_a, within quota_b: through, and told so.
			noHeader(t, "200 over quota_a", got[1].header, "x-envoy-ratelimited")
			wantHeader(t, "200 over quota_a", got[1].header, "x-ratelimit-remaining", "0")
			wantHeader(t, "200 over quota_a", got[1].header, "x-ratelimit-limit", `1, 1;w=3600, 2;w=3600`)
			wantHeader(t, "429", got[2].header, "x-envoy-ratelimited", "true")
			if ok, over := e.counter(t, "cluster.upstream.ratelimit.ok"), e.counter(t, "cluster.upstream.ratelimit.over_limit"); ok != 2 || over != 1 {
				t.Errorf("Envoy's ratelimit.ok %d and over_limit %d, want 2 and 1", ok, over)
			}
			eventually(t, "the access log", 10*time.Second, func() bool {
				b, _ := os.ReadFile(accessLog)
				return strings.Count(string(b), "\n") >= 3
			})
			b, _ := os.ReadFile(accessLog)
			lines := strings.Split(string(b), "\n")
			if !strings.HasPrefix(lines[1], "200 ") || !strings.Contains(lines[1], `"metadata":{"plan":"gold"}`) || strings.Contains(lines[1], "quotaMode") {
				t.Errorf("access log of the request over quota_a: %q, want 200 with quota_b's metadata and no quota keys", lines[1])
			}
			if strings.Contains(lines[2], `"plan"`) {
				t.Errorf("access log of the 429: %q, want no rule metadata (no descriptor within its limit)", lines[2])
			}
		})
	}
}

// TestXDSUnitsAndFieldsOverTheWire runs the built binary on rules from a
// real xDS server in each unit Envoy Gateway sends, WEEK, MONTH and YEAR
// among them, with quota_mode and metadata, then a later push that changes
// them: each answers as the same rule from a file would.
func TestXDSUnitsAndFieldsOverTheWire(t *testing.T) {
	policy := func(u rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	units := func(month rlsconfv3.RateLimitUnit, monthly uint32) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: "units", Domain: "units", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "week", RateLimit: policy(rlsconfv3.RateLimitUnit_WEEK, 1)},
			{Key: "month", RateLimit: policy(month, monthly)},
			{Key: "year", RateLimit: policy(rlsconfv3.RateLimitUnit_YEAR, 1)},
		}}
	}
	xds := harness.StartXDS(t, harness.XDSOptions{})
	xds.SetConfigs(t, egNode, units(rlsconfv3.RateLimitUnit_MONTH, 1), quotaConfig(t))
	p := launch(t, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode,
		"RESPONSE_DYNAMIC_METADATA=true")
	p.waitHealth(t, http.StatusOK)
	c := p.client(t)
	for _, l := range []string{"units.week: unit=WEEK requests_per_unit=1,", "units.month: unit=MONTH requests_per_unit=1,",
		"units.year: unit=YEAR requests_per_unit=1,", `quota.quota_b: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: true, metadata: {"plan":"gold"}`} {
		p.waitRules(t, l, time.Now())
	}
	for _, u := range []struct {
		key  string
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{{"week", rlsv3.RateLimitResponse_RateLimit_WEEK}, {"month", rlsv3.RateLimitResponse_RateLimit_MONTH}, {"year", rlsv3.RateLimitResponse_RateLimit_YEAR}} {
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			resp, err := c.ShouldRateLimit(callCtx(t), request("units", u.key, "alice"))
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCurrentLimit().GetUnit() != u.unit {
				t.Errorf("%s hit %d of 1: %v, limit %v; want %v, a limit per %v", u.key, i+1, resp.GetOverallCode(),
					resp.GetStatuses()[0].GetCurrentLimit(), want, u.unit)
			}
		}
	}

	// quota_mode and metadata as from a file: over quota_a, within quota_b,
	// the request passes, quota_a's status says OVER_LIMIT, and quota_b's
	// metadata comes back.
	both := &rlsv3.RateLimitRequest{Domain: "quota", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		request("quota", "quota_a", "bob").Descriptors[0], request("quota", "quota_b", "bob").Descriptors[0],
	}}
	if _, err := c.ShouldRateLimit(callCtx(t), both); err != nil {
		t.Fatal(err)
	}
	resp, err := c.ShouldRateLimit(callCtx(t), both)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := resp.GetDynamicMetadata().AsMap()["metadata"].(map[string]any)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || md["plan"] != "gold" {
		t.Errorf("over quota_a, within quota_b: overall %v, quota_a %v, metadata %v; want OK, OVER_LIMIT and plan gold",
			resp.GetOverallCode(), resp.GetStatuses()[0].GetCode(), resp.GetDynamicMetadata().AsMap())
	}

	// A later push: month becomes a yearly limit of 3, quota_b loses its
	// quota mode, its limit rises and its metadata changes.
	later := quotaConfig(t)
	later.Descriptors[1].QuotaMode = false
	later.Descriptors[1].RateLimit.RequestsPerUnit = 10
	later.Descriptors[1].Metadata.Fields["plan"] = structpb.NewStringValue("silver")
	start := time.Now()
	xds.SetConfigs(t, egNode, units(rlsconfv3.RateLimitUnit_YEAR, 3), later)
	took := p.waitRules(t, "units.month: unit=YEAR requests_per_unit=3,", start)
	p.waitRules(t, `quota.quota_b: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false, metadata: {"plan":"silver"}`, start)
	t.Logf("the later push applied in %v", took.Round(time.Millisecond))
	resp, err = c.ShouldRateLimit(callCtx(t), request("units", "month", "alice"))
	if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_YEAR {
		t.Errorf("month after the push: %v, %v; want a limit per YEAR", resp, err)
	}
	// quota_b within, not a quota rule any more; quota_a alone a quota
	// rule, over: denied.
	resp, err = c.ShouldRateLimit(callCtx(t), both)
	if err != nil {
		t.Fatal(err)
	}
	md, _ = resp.GetDynamicMetadata().AsMap()["metadata"].(map[string]any)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || md["plan"] != "silver" {
		t.Errorf("after the push: overall %v, metadata %v; want OVER_LIMIT (quota_a, the only quota rule, over) and plan silver",
			resp.GetOverallCode(), resp.GetDynamicMetadata().AsMap())
	}
}

// TestXDSRefusedDomainOverTheWire: the built binary given an update with
// one domain it cannot serve beside a changed valid one applies the valid
// one, keeps answering the refused one with its rules in force, logs and
// counts the refusal, says so in /rlconfig, and NACKs naming the domain.
func TestXDSRefusedDomainOverTheWire(t *testing.T) {
	api := func(limit uint32) *rlsconfv3.RateLimitConfig {
		cfg := xdsWeb(limit, 100)
		cfg.Name, cfg.Domain = "api", "api"
		return cfg
	}
	xds := harness.StartXDS(t, harness.XDSOptions{})
	xds.SetConfigs(t, egNode, xdsWeb(1, 100), api(1))
	p := launch(t, nil, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+xds.Addr, "CONFIG_GRPC_XDS_NODE_ID="+egNode,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s")
	p.waitHealth(t, http.StatusOK)
	c := p.client(t)

	bad := xdsWeb(50, 100)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit(9)
	from := len(xds.Requests())
	xds.SetConfigs(t, egNode, bad, api(5))
	nack := xds.WaitRequest(t, from, 10*time.Second, "NACK", harness.XDSRequest.NACK)
	want := `xds: domain "web" refused and kept as in force; the update's other domains are applied` + "\n" +
		`xds: config "web" (domain web): descriptor "web.user": rate_limit: invalid unit "9"`
	if got := nack.GetErrorDetail().GetMessage(); !strings.HasPrefix(got, want) {
		t.Errorf("NACK error_detail %q, want it to start with %q", got, want)
	}
	p.waitRules(t, "api.user: unit=HOUR requests_per_unit=5,", time.Now())
	_, body := p.get(t, "http://"+p.debug+"/rlconfig")
	for _, line := range []string{`# version: 2 (domain "web" refused)`, `# last load error: `, `#   xds: config "web" (domain web)`, "web.user: unit=HOUR requests_per_unit=1,"} {
		if !strings.Contains(body, line) {
			t.Errorf("/rlconfig lacks %q:\n%s", line, body)
		}
	}
	s := p.stats(t)
	if s["ratelimit.service.config_load_success"] != 2 || s["ratelimit.service.config_load_error"] != 1 {
		t.Errorf("config_load_success %d and config_load_error %d, want 2 and 1", s["ratelimit.service.config_load_success"], s["ratelimit.service.config_load_error"])
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if code := p.code(t, c, request("web", "user", "alice")); code != want {
			t.Errorf("web (kept, 1 an hour) hit %d: %v, want %v", i+1, code, want)
		}
	}
	for i := range 5 {
		if code := p.code(t, c, request("api", "user", "alice")); code != rlsv3.RateLimitResponse_OK {
			t.Errorf("api (applied, 5 an hour) hit %d: %v, want OK", i+1, code)
		}
	}
	if !strings.Contains(p.logs(), `domain \"web\" refused`) {
		t.Errorf("the refusal is not logged:\n%s", p.logs())
	}
}
