package provider

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
)

const testNode = "envoy-ratelimit"

// webConfig is a RateLimitConfig for domain web: userLimit per minute for
// each user, and 100 per second for each path.
func webConfig(userLimit uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   "web",
		Domain: "web",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: userLimit}},
			{Key: "path", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 100}},
		},
	}
}

// collector records what a watcher reports.
type collector struct {
	mu      sync.Mutex
	configs []*rules.Config
	errs    []error
	changed chan struct{}
}

func newCollector() *collector { return &collector{changed: make(chan struct{})} }

func (c *collector) onLoad(snap Snapshot) {
	cfg := snap.Rules
	c.mu.Lock()
	c.configs = append(c.configs, cfg)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *collector) onError(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *collector) last() *rules.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.configs) == 0 {
		return nil
	}
	return c.configs[len(c.configs)-1]
}

// errors returns the errors reported so far, connection errors apart.
func (c *collector) ruleErrors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []error
	for _, err := range c.errs {
		if !errors.Is(err, ErrXDSConnection) {
			out = append(out, err)
		}
	}
	return out
}

// wait waits until cond holds, checking it at each report, for at most
// within.
func (c *collector) wait(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		changed := c.changed
		c.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("no %s within %v; errors: %v", what, within, c.errs)
		}
	}
}

// userLimit returns the limit of web's user rule in cfg, or 0.
func userLimit(cfg *rules.Config) uint32 {
	m := cfg.Match("web", []rules.Entry{{Key: "user", Value: "alice"}})
	if m.Limit == nil {
		return 0
	}
	return m.Limit.RequestsPerUnit
}

// fastBackoff keeps the tests short; no jitter, so that counts of
// attempts are predictable.
var fastBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond}

func watchXDS(t *testing.T, cfg XDSConfig) (*XDSWatcher, *collector) {
	t.Helper()
	c := newCollector()
	if cfg.NodeID == "" {
		cfg.NodeID = testNode
	}
	if cfg.Backoff == (Backoff{}) {
		cfg.Backoff = fastBackoff
	}
	w, err := WatchXDS(t.Context(), cfg, c.onLoad, c.onError)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, c
}

func TestRateLimitConfigType(t *testing.T) {
	if RateLimitConfigType != resourcev3.RateLimitConfigType {
		t.Errorf("RateLimitConfigType = %q, want go-control-plane's %q", RateLimitConfigType, resourcev3.RateLimitConfigType)
	}
}

// TestXDSSnapshots drives the watcher through the life of a deployment:
// the first snapshot, a change, an invalid snapshot (NACKed, the rules in
// use stay, and go-control-plane's immediate resending of it does not spin
// the pair), a fix, and an empty snapshot.
func TestXDSSnapshots(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	v1 := srv.SetConfigs(t, testNode, webConfig(5))
	w, c := watchXDS(t, XDSConfig{
		ServerURL:    srv.Addr,
		NodeMetadata: map[string]string{"zone": "eu-1"},
		Headers:      map[string]string{"authorization": "Bearer t0ken"},
	})

	c.wait(t, 10*time.Second, "first snapshot", func() bool { return userLimit(c.last()) == 5 })
	ack := srv.WaitRequest(t, 0, 5*time.Second, "ACK of "+v1, func(r harness.XDSRequest) bool { return harness.ACKed(r, testNode, v1) })
	first := srv.Requests()[0]
	if first.GetTypeUrl() != RateLimitConfigType || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "eu-1" {
		t.Errorf("first request = %v, want type %s and node metadata zone=eu-1", first.DiscoveryRequest, RateLimitConfigType)
	}
	if got := ack.Metadata.Get("authorization"); len(got) != 1 || got[0] != "Bearer t0ken" {
		t.Errorf("stream metadata authorization = %q, want the header", got)
	}

	t.Run("change", func(t *testing.T) {
		start := time.Now()
		v := srv.SetConfigs(t, testNode, webConfig(7))
		c.wait(t, 2*time.Second, "changed limit", func() bool { return userLimit(c.last()) == 7 })
		t.Logf("snapshot %s applied in %v", v, time.Since(start).Round(time.Millisecond))
		srv.WaitRequest(t, 0, 5*time.Second, "ACK of "+v, func(r harness.XDSRequest) bool { return harness.ACKed(r, testNode, v) })
		if s := w.Stats(); s.Version != v || s.Loads != 2 {
			t.Errorf("Stats() = %+v, want version %s after 2 loads", s, v)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		good := w.Stats().Version
		bad := webConfig(9)
		bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
		from := len(srv.Requests())
		v := srv.SetConfigs(t, testNode, bad)
		nack := srv.WaitRequest(t, from, 5*time.Second, "NACK of "+v, harness.XDSRequest.NACK)
		want := `xds: config "web" (domain web): descriptor "web.user": rate_limit: missing unit (second, minute, hour, day, week, month or year)`
		if got := nack.GetErrorDetail().GetMessage(); got != want {
			t.Errorf("NACK error_detail = %q, want %q", got, want)
		}
		if nack.GetVersionInfo() != good {
			t.Errorf("NACK version_info = %q, want the version in use, %q", nack.GetVersionInfo(), good)
		}
		errs := c.ruleErrors()
		if len(errs) != 1 || errs[0].Error() != want {
			t.Errorf("errors reported = %v, want [%s]", errs, want)
		}
		var re *rules.Error
		if len(errs) == 1 && !errors.As(errs[0], &re) {
			t.Errorf("error %v does not wrap a *rules.Error", errs[0])
		}
		if got := userLimit(c.last()); got != 7 {
			t.Errorf("limit after the invalid snapshot = %d, want 7 (the rules in use)", got)
		}

		// The cache answers each NACK with the same snapshot; the watcher
		// answers again only after a wait (100 ms here, Backoff.Initial),
		// so about 15 NACKs in 1.5 s, not thousands.
		time.Sleep(1500 * time.Millisecond)
		nacks := 0
		for _, r := range srv.Requests()[from:] {
			if r.NACK() {
				nacks++
			}
		}
		if nacks < 2 || nacks > 20 {
			t.Errorf("%d NACKs in 1.5 s of a resent invalid snapshot, want 2..20 (one per 100 ms)", nacks)
		}
		if s := w.Stats(); s.Failures != 1 || len(c.ruleErrors()) != 1 {
			t.Errorf("Stats().Failures = %d, errors reported %d, want 1 and 1: a resent refusal is not reported again", s.Failures, len(c.ruleErrors()))
		}

		start := time.Now()
		fixed := srv.SetConfigs(t, testNode, webConfig(11))
		c.wait(t, 2*time.Second, "fixed snapshot", func() bool { return userLimit(c.last()) == 11 })
		t.Logf("fixed snapshot %s applied in %v", fixed, time.Since(start).Round(time.Millisecond))
	})

	t.Run("empty", func(t *testing.T) {
		// Deleting the last policy in Envoy Gateway sends no resources:
		// the server means no limits, and says so on purpose.
		srv.SetConfigs(t, testNode)
		c.wait(t, 5*time.Second, "empty snapshot", func() bool { return c.last().Empty() })
	})
}

// TestXDSReconnect stops the server mid-run: the rules in use stay, the
// watcher retries on its back-off (not in a loop), and once the server is
// back it subscribes again and takes new snapshots.
func TestXDSReconnect(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	srv.SetConfigs(t, testNode, webConfig(5))
	w, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr})
	c.wait(t, 10*time.Second, "first snapshot", func() bool { return userLimit(c.last()) == 5 })

	srv.Stop()
	c.wait(t, 5*time.Second, "connection error", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.errs) > 0 && errors.Is(c.errs[len(c.errs)-1], ErrXDSConnection)
	})
	before := w.Stats().Attempts
	time.Sleep(1500 * time.Millisecond)
	// 100, 200, 400, 400... ms: about 5 attempts in 1.5 s.
	if n := w.Stats().Attempts - before; n < 2 || n > 10 {
		t.Errorf("%d connection attempts in 1.5 s while the server is down, want 2..10 (one per back-off)", n)
	}
	if got := userLimit(c.last()); got != 5 || len(c.configs) != 1 {
		t.Errorf("rules while the server is down: limit %d after %d loads, want 5 after 1", got, len(c.configs))
	}

	srv.Restart(t)
	start := time.Now()
	srv.SetConfigs(t, testNode, webConfig(8))
	c.wait(t, 5*time.Second, "snapshot after the restart", func() bool { return userLimit(c.last()) == 8 })
	t.Logf("reconnected and applied in %v", time.Since(start).Round(time.Millisecond))
	if s := w.Stats(); s.Connects < 2 || !s.Connected {
		t.Errorf("Stats() = %+v, want at least 2 connects and connected", s)
	}
}

// TestXDSTLS connects with mutual TLS, as to Envoy Gateway, and refuses a
// server whose certificate does not chain to the CA given or does not
// hold the name asked for.
func TestXDSTLS(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{TLS: true})
	srv.SetConfigs(t, testNode, webConfig(5))
	files := srv.TLS
	clientTLS := func(ca, name string) *XDSTLS {
		return &XDSTLS{CertFile: files.ClientCertFile, KeyFile: files.ClientKeyFile, CAFile: ca, ServerName: name}
	}

	t.Run("mutual", func(t *testing.T) {
		_, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr, TLS: clientTLS(files.CAFile, "")})
		c.wait(t, 10*time.Second, "snapshot over TLS", func() bool { return userLimit(c.last()) == 5 })
	})
	t.Run("san", func(t *testing.T) {
		_, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr, TLS: clientTLS(files.CAFile, "xds.test")})
		c.wait(t, 10*time.Second, "snapshot over TLS with a SAN", func() bool { return userLimit(c.last()) == 5 })
	})

	other, err := harness.WriteTLS(t.TempDir(), "localhost")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		tls  *XDSTLS
		want string
	}{
		{"wrong_ca", clientTLS(other.CAFile, ""), "certificate signed by unknown authority"},
		{"wrong_san", clientTLS(files.CAFile, "other.test"), "other.test"},
		// Envoy Gateway's server requires a client certificate.
		{"no_client_cert", &XDSTLS{CAFile: files.CAFile}, "certificate required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opened := srv.StreamsOpened()
			w, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr, TLS: tt.tls})
			c.wait(t, 10*time.Second, "TLS error", func() bool {
				err := w.Stats().LastError
				return err != nil && strings.Contains(err.Error(), tt.want)
			})
			if n := srv.StreamsOpened() - opened; n != 0 || c.last() != nil {
				t.Errorf("%d streams opened and rules %v with %s, want none", n, c.last(), tt.name)
			}
		})
	}

	t.Run("missing_file", func(t *testing.T) {
		_, err := WatchXDS(t.Context(), XDSConfig{ServerURL: srv.Addr, NodeID: testNode, TLS: clientTLS(files.CAFile+".missing", "")}, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "ca.crt.missing") {
			t.Errorf("WatchXDS with a missing CA file = %v, want an error naming it", err)
		}
	})
}

// TestXDSMaxMessageSize bounds what the server may send: a message larger
// than MaxMessageBytes is refused by gRPC before it is decoded, and no
// rules load from it.
func TestXDSMaxMessageSize(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	big := webConfig(5)
	for range 200 {
		big.Descriptors = append(big.Descriptors, &rlsconfv3.RateLimitDescriptor{
			Key: "k" + strings.Repeat("x", 20) + string(rune('a'+len(big.Descriptors)%26)) + strings.Repeat("y", len(big.Descriptors)),
		})
	}
	srv.SetConfigs(t, testNode, big)
	w, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr, MaxMessageBytes: 4096})
	c.wait(t, 10*time.Second, "size error", func() bool {
		err := w.Stats().LastError
		return err != nil && strings.Contains(err.Error(), "larger than max")
	})
	if c.last() != nil {
		t.Errorf("rules loaded from a message above the bound")
	}
	// A refused update, not a connection problem: reported and counted
	// once however often it is fetched again (the server sends it at each
	// reconnection, on the back-off).
	waitFor(t, "three fetches of the update", func() bool { return w.Stats().Attempts >= 3 })
	if errs := c.ruleErrors(); len(errs) != 1 || !errors.Is(errs[0], ErrXDSTooLarge) {
		t.Errorf("errors reported = %v, want one ErrXDSTooLarge", errs)
	}
	if s := w.Stats(); s.Failures != 1 {
		t.Errorf("Stats().Failures = %d after %d fetches, want 1", s.Failures, s.Attempts)
	}

	_, c = watchXDS(t, XDSConfig{ServerURL: srv.Addr})
	c.wait(t, 10*time.Second, "snapshot under gRPC's default bound", func() bool { return userLimit(c.last()) == 5 })
}

// TestXDSUnitsAndFields serves, from a real xDS server, a limit in each
// unit Envoy Gateway sends (WEEK, MONTH and YEAR among them) and each
// descriptor field a rule file also has, then a later push that changes
// them: both are in force as sent. (go-control-plane's ratelimit proto
// at v0.1.0 stopped at DAY, and a MONTH refused the whole update.)
func TestXDSUnitsAndFields(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	md := func(tier string) *structpb.Struct {
		s, err := structpb.NewStruct(map[string]any{"tier": tier, "cost": 2})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	policy := func(u rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	cfg := func(quota bool, tier string, month rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: "eg", Domain: "eg", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "second", RateLimit: policy(rlsconfv3.RateLimitUnit_SECOND, 1)},
			{Key: "minute", RateLimit: policy(rlsconfv3.RateLimitUnit_MINUTE, 2)},
			{Key: "hour", RateLimit: policy(rlsconfv3.RateLimitUnit_HOUR, 3)},
			{Key: "day", RateLimit: policy(rlsconfv3.RateLimitUnit_DAY, 4)},
			{Key: "week", RateLimit: policy(rlsconfv3.RateLimitUnit_WEEK, 5)},
			{Key: "month", QuotaMode: quota, Metadata: md(tier), ShadowMode: !quota, DetailedMetric: quota, RateLimit: policy(month, 6)},
			{Key: "year", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_YEAR, RequestsPerUnit: 7,
				Name: "yearly", Replaces: []*rlsconfv3.RateLimitReplace{{Name: "other"}}}},
			{Key: "free", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
		}}
	}
	limit := func(c *rules.Config, key string) *rules.Limit {
		return c.Match("eg", []rules.Entry{{Key: key, Value: "v"}}).Limit
	}
	srv.SetConfigs(t, testNode, cfg(true, "gold", rlsconfv3.RateLimitUnit_MONTH))
	_, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr})
	c.wait(t, 10*time.Second, "the first snapshot", func() bool { return c.last() != nil })
	got := c.last()
	for key, want := range map[string]time.Duration{
		"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
		"week": 7 * 24 * time.Hour, "month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
	} {
		if l := limit(got, key); l == nil || l.Window() != want {
			t.Errorf("%s: limit %+v, want a window of %v", key, l, want)
		}
	}
	m := limit(got, "month")
	if !m.QuotaMode || m.ShadowMode || !m.DetailedMetric || m.Metadata["tier"] != "gold" || m.Metadata["cost"] != 2.0 {
		t.Errorf("month: quota_mode %t shadow_mode %t detailed_metric %t metadata %v, want true, false, true and tier gold, cost 2",
			m.QuotaMode, m.ShadowMode, m.DetailedMetric, m.Metadata)
	}
	if y := limit(got, "year"); y.Name != "yearly" || len(y.Replaces) != 1 || y.Replaces[0] != "other" {
		t.Errorf("year: name %q replaces %v, want yearly replacing other", y.Name, y.Replaces)
	}
	if f := limit(got, "free"); f == nil || !f.Unlimited {
		t.Errorf("free: %+v, want unlimited", f)
	}

	// A later push changes the unit and the flags: in force as sent.
	srv.SetConfigs(t, testNode, cfg(false, "silver", rlsconfv3.RateLimitUnit_YEAR))
	c.wait(t, 10*time.Second, "the later push", func() bool { return limit(c.last(), "month").Unit == rules.Year })
	m = limit(c.last(), "month")
	if m.QuotaMode || !m.ShadowMode || m.DetailedMetric || m.Metadata["tier"] != "silver" {
		t.Errorf("month after the push: quota_mode %t shadow_mode %t detailed_metric %t metadata %v, want false, true, false and tier silver",
			m.QuotaMode, m.ShadowMode, m.DetailedMetric, m.Metadata)
	}
	if errs := c.ruleErrors(); len(errs) != 0 {
		t.Errorf("refusals: %v", errs)
	}
}

// TestSourceOf converts every field the proto shares with a rule file,
// each unit by its number, and builds the same rules as the same file.
func TestSourceOf(t *testing.T) {
	t.Parallel()
	md, err := structpb.NewStruct(map[string]any{"tier": "gold", "cost": 3, "tags": []any{"a", true}, "nested": map[string]any{"x": nil}})
	if err != nil {
		t.Fatal(err)
	}
	policy := func(u rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	pb := &rlsconfv3.RateLimitConfig{Name: "cfg", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "a", Value: "1", ShadowMode: true, DetailedMetric: true, RateLimit: &rlsconfv3.RateLimitPolicy{
			Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 3, Name: "n", Replaces: []*rlsconfv3.RateLimitReplace{{Name: "m"}},
		}},
		{Key: "b", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}, Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "c", RateLimit: policy(rlsconfv3.RateLimitUnit_SECOND, 1)},
		}},
		{Key: "minute", RateLimit: policy(rlsconfv3.RateLimitUnit_MINUTE, 2)},
		{Key: "hour", RateLimit: policy(rlsconfv3.RateLimitUnit_HOUR, 4)},
		{Key: "week", RateLimit: policy(rlsconfv3.RateLimitUnit_WEEK, 10)},
		{Key: "month", QuotaMode: true, Metadata: md, RateLimit: policy(rlsconfv3.RateLimitUnit_MONTH, 100)},
		{Key: "year", RateLimit: policy(rlsconfv3.RateLimitUnit_YEAR, 1000)},
	}}
	fromXDS, err := rules.Build([]rules.Source{sourceOf(pb)}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `d.a_1: unit=DAY requests_per_unit=3, shadow_mode: true, quota_mode: false, name: n, replaces: m, detailed_metric: true
d.b: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false, unlimited: true
d.b.c: unit=SECOND requests_per_unit=1, shadow_mode: false, quota_mode: false
d.hour: unit=HOUR requests_per_unit=4, shadow_mode: false, quota_mode: false
d.minute: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false
d.month: unit=MONTH requests_per_unit=100, shadow_mode: false, quota_mode: true, metadata: {"cost":3,"nested":{"x":null},"tags":["a",true],"tier":"gold"}
d.week: unit=WEEK requests_per_unit=10, shadow_mode: false, quota_mode: false
d.year: unit=YEAR requests_per_unit=1000, shadow_mode: false, quota_mode: false
`
	if got := fromXDS.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}

	// The same rules written as a file: the same limits, field for field.
	fromFile, err := rules.Parse([]rules.File{{Name: "d.yaml", Data: []byte(`domain: d
descriptors:
  - {key: a, value: "1", shadow_mode: true, detailed_metric: true,
     rate_limit: {unit: day, requests_per_unit: 3, name: n, replaces: [{name: m}]}}
  - key: b
    rate_limit: {unlimited: true}
    descriptors: [{key: c, rate_limit: {unit: second, requests_per_unit: 1}}]
  - {key: minute, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: hour, rate_limit: {unit: hour, requests_per_unit: 4}}
  - {key: week, rate_limit: {unit: week, requests_per_unit: 10}}
  - key: month
    quota_mode: true
    metadata: {tier: gold, cost: 3, tags: [a, true], nested: {x: null}}
    rate_limit: {unit: month, requests_per_unit: 100}
  - {key: year, rate_limit: {unit: year, requests_per_unit: 1000}}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, file := fromXDS.Dump(), fromFile.Dump(); got != file {
		t.Errorf("rules from xDS:\n%s\nfrom the same file:\n%s", got, file)
	}
	for _, key := range []string{"a", "b", "week", "month", "year"} {
		x := fromXDS.Match("d", []rules.Entry{{Key: key, Value: "1"}}).Limit
		f := fromFile.Match("d", []rules.Entry{{Key: key, Value: "1"}}).Limit
		if x.Window() != f.Window() || x.QuotaMode != f.QuotaMode || x.Unlimited != f.Unlimited {
			t.Errorf("%s: from xDS window %v quota_mode %t unlimited %t, from a file %v %t %t",
				key, x.Window(), x.QuotaMode, x.Unlimited, f.Window(), f.QuotaMode, f.Unlimited)
		}
	}

	// Every unit the proto names has that number in rules.Unit, the
	// number sourceOf reads.
	for n, name := range rlsconfv3.RateLimitUnit_name {
		if got := rules.Unit(n).String(); got != name {
			t.Errorf("rules.Unit(%d) is %s, the proto's %d is %s", n, got, n, name)
		}
	}

	// A unit number no unit has is invalid, named by its number.
	pb.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit(8)
	w := &XDSWatcher{}
	_, _, _, err = w.build(anyOf(t, pb))
	wantErr := `xds: config "cfg" (domain d): descriptor "d.a_1": rate_limit: invalid unit "8" (want second, minute, hour, day, week, month or year)`
	if err == nil || err.Error() != wantErr {
		t.Errorf("build(unit 8) = %v, want %q", err, wantErr)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := newBackoff(Backoff{Initial: 100 * time.Millisecond, Max: 350 * time.Millisecond})
	var got []time.Duration
	for range 5 {
		got = append(got, b.wait())
	}
	want := []time.Duration{100, 200, 350, 350, 350}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits = %v, want %v ms", got, want)
		}
	}
	b.reset()
	if d := b.wait(); d != 100*time.Millisecond {
		t.Errorf("wait after reset = %v, want 100ms", d)
	}

	j := newBackoff(Backoff{Initial: time.Second, Max: 4 * time.Second, RandomFactor: 0.5, Jitter: true})
	seen := map[time.Duration]bool{}
	for i := range 200 {
		if i%3 == 0 {
			j.reset()
		}
		base := time.Second << (i % 3) // 1s after a reset, then 2s, 4s
		d := j.wait()
		if d < base/2 || d > min(base*3/2, 4*time.Second) {
			t.Fatalf("jittered wait %v for %v, want within ±50%% and at most 4s", d, base)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("%d distinct jittered waits of 200, want them spread", len(seen))
	}

	if d := newBackoff(Backoff{}).wait(); d != 10*time.Second {
		t.Errorf("zero Backoff waits %v, want the anchor's 10s", d)
	}

	// Answering a repeated refusal: from 1 s up to Initial.
	r := repeatBackoff(Backoff{Initial: 10 * time.Second, Max: time.Minute})
	got = got[:0]
	for range 6 {
		got = append(got, r.wait())
	}
	want = []time.Duration{1, 2, 4, 8, 10, 10}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("repeat waits = %v, want %v s", got, want)
		}
	}
	if d := repeatBackoff(fastBackoff).wait(); d != fastBackoff.Initial {
		t.Errorf("repeat wait with Initial %v = %v, want %v", fastBackoff.Initial, d, fastBackoff.Initial)
	}
}

func anyOf(t *testing.T, msgs ...*rlsconfv3.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(msgs))
	for i, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// TestXDSAlternatingRefusals: a server alternating between two invalid
// snapshots is answered as one repeating one, on the back-off (it used to
// be answered at once, 724 NACKs a second each with an error reported),
// and each refusal is reported once.
func TestXDSAlternatingRefusals(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	srv.SetConfigs(t, testNode, webConfig(5))
	w, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr})
	c.wait(t, 10*time.Second, "first snapshot", func() bool { return userLimit(c.last()) == 5 })

	bad := func(limit uint32) *rlsconfv3.RateLimitConfig {
		cfg := webConfig(limit)
		cfg.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
		return cfg
	}
	from := len(srv.Requests())
	began := time.Now()
	for i := 0; time.Since(began) < 1500*time.Millisecond; i++ {
		srv.SetConfigs(t, testNode, bad(uint32(1+i%2)))
		time.Sleep(5 * time.Millisecond) // the churn's pace, on the watcher's real clock
	}
	took := time.Since(began)
	nacks := 0
	for _, r := range srv.Requests()[from:] {
		if r.NACK() {
			nacks++
		}
	}
	// One NACK at once, then one per 100 ms (fastBackoff) at most.
	if most := int(took/(100*time.Millisecond)) + 2; nacks > most {
		t.Errorf("%d NACKs in %v of alternating invalid snapshots, want at most %d (one per 100 ms)", nacks, took, most)
	}
	if errs := c.ruleErrors(); len(errs) != 2 {
		t.Errorf("%d refusals reported, want 2 (one per distinct snapshot): %v", len(errs), errs)
	}
	if got := userLimit(c.last()); got != 5 {
		t.Errorf("limit after the refusals = %d, want 5 (the rules in use)", got)
	}
	// A valid snapshot is taken at once, refusals or not.
	srv.SetConfigs(t, testNode, webConfig(8))
	c.wait(t, 5*time.Second, "the valid snapshot", func() bool { return userLimit(c.last()) == 8 })
	if s := w.Stats(); s.LastError != nil {
		t.Errorf("Stats().LastError = %v after a valid snapshot", s.LastError)
	}
}

// TestXDSProblemsCapped: an update with a hundred problems is reported
// with its first MaxReportedProblems and a count of the rest, not a line of
// megabytes.
func TestXDSProblemsCapped(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	cfg := webConfig(5)
	for i := range 100 {
		cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("k%d", i),
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_UNKNOWN, RequestsPerUnit: 1}})
	}
	srv.SetConfigs(t, testNode, cfg)
	_, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr})
	c.wait(t, 10*time.Second, "the refusal", func() bool { return len(c.ruleErrors()) > 0 })
	msg := c.ruleErrors()[0].Error()
	if n := strings.Count(msg, "\n") + 1; n != MaxReportedProblems+1 {
		t.Errorf("the refusal has %d lines, want %d:\n%s", n, MaxReportedProblems+1, msg)
	}
	if !strings.HasSuffix(msg, "… and 80 more problems (100 in all; ratelimit-check lists every one)") {
		t.Errorf("the refusal does not end with the count of the rest:\n%s", msg)
	}
}

// TestXDSRefusedDomain: an update with a domain the service cannot serve
// beside valid ones applies the valid ones, keeps the refused domain's
// rules in force (none for a domain never served), and NACKs naming the
// domain and why; the NACK's version_info stays the last version applied
// whole. The resent update is not applied again; a fixed one is applied
// whole and ACKed.
func TestXDSRefusedDomain(t *testing.T) {
	srv := harness.StartXDS(t, harness.XDSOptions{})
	api := func(limit uint32) *rlsconfv3.RateLimitConfig {
		cfg := webConfig(limit)
		cfg.Name, cfg.Domain = "api", "api"
		return cfg
	}
	badWeb := webConfig(9)
	badWeb.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit(9)
	apiLimit := func(cfg *rules.Config) uint32 {
		if l := cfg.Match("api", []rules.Entry{{Key: "user", Value: "bob"}}).Limit; l != nil {
			return l.RequestsPerUnit
		}
		return 0
	}
	whyWeb := `xds: config "web" (domain web): descriptor "web.user": rate_limit: invalid unit "9" (want second, minute, hour, day, week, month or year)`

	v1 := srv.SetConfigs(t, testNode, webConfig(5), api(10))
	w, c := watchXDS(t, XDSConfig{ServerURL: srv.Addr})
	c.wait(t, 10*time.Second, "first snapshot", func() bool { return userLimit(c.last()) == 5 && apiLimit(c.last()) == 10 })

	from := len(srv.Requests())
	v2 := srv.SetConfigs(t, testNode, badWeb, api(20))
	nack := srv.WaitRequest(t, from, 5*time.Second, "NACK of "+v2, harness.XDSRequest.NACK)
	want := `xds: domain "web" refused and kept as in force; the update's other domains are applied` + "\n" + whyWeb
	if got := nack.GetErrorDetail().GetMessage(); got != want {
		t.Errorf("NACK error_detail =\n%s\nwant\n%s", got, want)
	}
	if nack.GetVersionInfo() != v1 {
		t.Errorf("NACK version_info = %q, want %q, the last version applied whole", nack.GetVersionInfo(), v1)
	}
	if got := c.last(); userLimit(got) != 5 || apiLimit(got) != 20 {
		t.Errorf("after %s: web's limit %d, api's %d; want 5 (kept) and 20 (applied)", v2, userLimit(got), apiLimit(got))
	}
	if errs := c.ruleErrors(); len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("errors reported = %v, want [%s]", errs, want)
	}
	if s := w.Stats(); s.Loads != 2 || s.Failures != 1 || s.Version != v1 {
		t.Errorf("Stats() = %+v, want 2 loads, 1 failure, version %s", s, v1)
	}

	// The cache sends the update again after each NACK: NACKed again,
	// on the back-off, neither applied nor reported again.
	srv.WaitRequest(t, from, 5*time.Second, "a second NACK of "+v2, func(r harness.XDSRequest) bool {
		return r.NACK() && r.GetResponseNonce() != nack.GetResponseNonce()
	})
	if s := w.Stats(); s.Loads != 2 || s.Failures != 1 {
		t.Errorf("after the update was sent again: Stats() = %+v, want 2 loads and 1 failure", s)
	}

	// A domain dropped from the update goes even while another is
	// refused; a refused domain the service never served has no rules.
	fresh := webConfig(3)
	fresh.Name, fresh.Domain = "fresh", "fresh"
	fresh.Descriptors[1].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	from = len(srv.Requests())
	v3 := srv.SetConfigs(t, testNode, badWeb, fresh)
	srv.WaitRequest(t, from, 5*time.Second, "NACK of "+v3+" naming both domains", func(r harness.XDSRequest) bool {
		return r.NACK() && strings.HasPrefix(r.GetErrorDetail().GetMessage(), `xds: domains "fresh", "web" refused`)
	})
	c.wait(t, 5*time.Second, "api dropped", func() bool { return apiLimit(c.last()) == 0 })
	if got := c.last(); userLimit(got) != 5 || len(got.Domains()) != 1 {
		t.Errorf("after %s: domains %v, web's limit %d; want web alone, at 5", v3, got.Domains(), userLimit(got))
	}

	// Fixed: applied whole, ACKed.
	v4 := srv.SetConfigs(t, testNode, webConfig(7), api(30))
	srv.WaitRequest(t, 0, 5*time.Second, "ACK of "+v4, func(r harness.XDSRequest) bool { return harness.ACKed(r, testNode, v4) })
	if got := c.last(); userLimit(got) != 7 || apiLimit(got) != 30 {
		t.Errorf("after %s: web's limit %d, api's %d; want 7 and 30", v4, userLimit(got), apiLimit(got))
	}

	// A first update with a refused domain serves the valid ones.
	srv2 := harness.StartXDS(t, harness.XDSOptions{})
	srv2.SetConfigs(t, testNode, badWeb, api(40))
	_, c2 := watchXDS(t, XDSConfig{ServerURL: srv2.Addr})
	c2.wait(t, 10*time.Second, "the valid domain", func() bool { return c2.last() != nil })
	if got := c2.last(); apiLimit(got) != 40 || userLimit(got) != 0 {
		t.Errorf("first update: api's limit %d, web's %d; want 40 and none", apiLimit(got), userLimit(got))
	}
}

// TestXDSBuildWhole: what cannot be laid on one domain refuses the update
// whole: a resource that does not decode, or rules of several domains
// that together pass a bound. With MERGE_DOMAIN_CONFIG a domain is all
// its resources: one refused keeps the others of its domain too.
func TestXDSBuildWhole(t *testing.T) {
	t.Parallel()
	api := webConfig(10)
	api.Name, api.Domain = "api", "api"
	bad := webConfig(9)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	w := &XDSWatcher{}

	res := append(anyOf(t, api), &anypb.Any{TypeUrl: RateLimitConfigType, Value: []byte{0xff}})
	if cfg, _, _, err := w.build(res); cfg != nil || err == nil || !strings.Contains(err.Error(), "xds: resource 2:") {
		t.Errorf("build with a resource that does not decode = %v, %v; want no rules and resource 2 named", cfg, err)
	}

	// Each domain alone is within MaxDescriptors, both together not.
	big := func(domain string) *rlsconfv3.RateLimitConfig {
		cfg := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain}
		for i := range rules.MaxDescriptors/2 + 1 {
			cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("k%d", i)})
		}
		return cfg
	}
	if cfg, _, _, err := w.build(anyOf(t, big("a"), big("b"))); cfg != nil || err == nil || !strings.Contains(err.Error(), "descriptors in all") {
		t.Errorf("build over MaxDescriptors = %v, %v; want no rules and the bound named", cfg, err)
	}

	// Merged domains: web's two resources, one refused: web keeps what is
	// in force, its valid resource included.
	path := &rlsconfv3.RateLimitConfig{Name: "web-path", Domain: "web", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "path", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 7}},
	}}
	user := &rlsconfv3.RateLimitConfig{Name: "web-user", Domain: "web", Descriptors: webConfig(5).Descriptors[:1]}
	w = &XDSWatcher{cfg: XDSConfig{Options: rules.Options{MergeDomains: true}}}
	_, domains, _, err := w.build(anyOf(t, user, path, api))
	if err != nil {
		t.Fatal(err)
	}
	w.inForce = domains
	path.Descriptors[0].RateLimit.RequestsPerUnit = 8
	cfg, _, refused, err := w.build(anyOf(t, bad, path, api))
	if err == nil || len(refused) != 1 || refused[0] != "web" {
		t.Fatalf("build with one of web's resources refused: refused %v, %v", refused, err)
	}
	if l := cfg.Match("web", []rules.Entry{{Key: "path", Value: "/"}}).Limit; l == nil || l.RequestsPerUnit != 7 || userLimit(cfg) != 5 {
		t.Errorf("web's path limit %+v and user limit %d, want 7 and 5, the rules in force", l, userLimit(cfg))
	}
}

// TestHashResources: an update sent again in another order (as
// go-control-plane's cache does) is the same update; other contents are
// not.
func TestHashResources(t *testing.T) {
	t.Parallel()
	api := webConfig(10)
	api.Name, api.Domain = "api", "api"
	ab, ba := anyOf(t, webConfig(5), api), anyOf(t, api, webConfig(5))
	if hashResources(ab) != hashResources(ba) {
		t.Errorf("one update in two orders hashes differently")
	}
	for _, other := range [][]*anypb.Any{anyOf(t, webConfig(5)), anyOf(t, webConfig(6), api), anyOf(t, webConfig(5), api, api), nil} {
		if hashResources(other) == hashResources(ab) {
			t.Errorf("%d resources hash as the update", len(other))
		}
	}
}
