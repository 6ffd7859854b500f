package rules

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// entries builds a descriptor from "key=value" strings.
func entries(kvs ...string) []Entry {
	out := make([]Entry, 0, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out = append(out, Entry{Key: k, Value: v})
	}
	return out
}

func loadMatch(t testing.TB, names ...string) *Config {
	t.Helper()
	var files []File
	for _, n := range names {
		files = append(files, readFile(t, filepath.Join("testdata", "match", n+".yaml")))
	}
	cfg, err := Parse(files, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// matchCase is one descriptor and what it must match. An empty fullKey
// means no match; an empty stat means the stat key is the full key.
type matchCase struct {
	give    []Entry
	fullKey string
	rpu     uint32
	stat    string
	keyEnts []Entry
}

func checkMatches(t *testing.T, cfg *Config, domain string, tests []matchCase) {
	t.Helper()
	for _, tt := range tests {
		m := cfg.Match(domain, tt.give)
		if x := cfg.Explain(domain, tt.give); x.Limit != m.Limit || (x.Limit == nil) != (x.Why != "") {
			t.Errorf("Explain(%s, %v) = %+v, disagrees with Match's %+v", domain, tt.give, x, m.Limit)
		}
		if tt.fullKey == "" {
			if m.Limit != nil || m.StatKey != "" || m.KeyEntries != nil {
				t.Errorf("Match(%s, %v) = %+v, want no match", domain, tt.give, m)
			}
			continue
		}
		if m.Limit == nil {
			t.Errorf("Match(%s, %v) = no match, want %s", domain, tt.give, tt.fullKey)
			continue
		}
		stat := tt.stat
		if stat == "" {
			stat = tt.fullKey
		}
		if m.Limit.FullKey != tt.fullKey || m.Limit.RequestsPerUnit != tt.rpu || m.StatKey != stat {
			t.Errorf("Match(%s, %v) = %s (%d/unit) counted as %s, want %s (%d/unit) counted as %s",
				domain, tt.give, m.Limit.FullKey, m.Limit.RequestsPerUnit, m.StatKey, tt.fullKey, tt.rpu, stat)
		}
		if !reflect.DeepEqual(m.KeyEntries, tt.keyEnts) {
			t.Errorf("Match(%s, %v).KeyEntries = %v, want %v", domain, tt.give, m.KeyEntries, tt.keyEnts)
		}
	}
}

// The examples of the configuration section of envoyproxy/ratelimit's
// README, as our own fixtures.

func TestMatchExample1(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "example1"), "mongo_cps", []matchCase{
		{give: entries("database=users"), fullKey: "mongo_cps.database_users", rpu: 500},
		{give: entries("database=default"), fullKey: "mongo_cps.database_default", rpu: 500},
		{give: entries("database=other")},
		{give: entries("database")},
		{give: entries("database=users"), fullKey: "mongo_cps.database_users", rpu: 500},
		{give: nil},
	})
	if m := loadMatch(t, "example1").Match("other_domain", entries("database=users")); m.Limit != nil {
		t.Errorf("Match(other_domain) = %v, want no match", m.Limit.FullKey)
	}
}

func TestMatchExample2(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "example2"), "messaging", []matchCase{
		{give: entries("message_type=marketing", "to_number=2061111111"), fullKey: "messaging.message_type_marketing.to_number", rpu: 5},
		{give: entries("message_type=marketing", "to_number=2062222222"), fullKey: "messaging.message_type_marketing.to_number", rpu: 5},
		{give: entries("to_number=2061111111"), fullKey: "messaging.to_number", rpu: 100},
		// The placeholder level has no limit of its own.
		{give: entries("message_type=marketing")},
		{give: entries("message_type=transactional", "to_number=2061111111")},
		// Longer than the tree: nothing.
		{give: entries("to_number=2061111111", "extra=1")},
	})
}

func TestMatchExample3(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "example3"), "edge_proxy_per_ip", []matchCase{
		{give: entries("remote_address=50.0.0.1"), fullKey: "edge_proxy_per_ip.remote_address", rpu: 10},
		{give: entries("remote_address=50.0.0.5"), fullKey: "edge_proxy_per_ip.remote_address_50.0.0.5", rpu: 0},
		{give: entries("remote_address="), fullKey: "edge_proxy_per_ip.remote_address", rpu: 10},
	})
}

func TestMatchExample4(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "example4_flat"), "example4", []matchCase{
		{give: entries("key=value", "subkey=subvalue")},
		{give: entries("key=value"), fullKey: "example4.key_value", rpu: 300},
	})
	checkMatches(t, loadMatch(t, "example4_nested"), "example4", []matchCase{
		{give: entries("key=value", "subkey=subvalue"), fullKey: "example4.key_value.subkey", rpu: 300},
		{give: entries("key=value")},
		{give: entries("key=other", "subkey=subvalue")},
	})
}

func TestMatchExample5(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "example5")
	checkMatches(t, cfg, "internal", []matchCase{
		{give: entries("ldap=x"), fullKey: "internal.ldap", rpu: 0},
		{give: entries("azure=x"), fullKey: "internal.azure", rpu: 100},
	})
	if l := cfg.Match("internal", entries("ldap=x")).Limit; !l.Unlimited || l.Unit != Unknown {
		t.Errorf("ldap: Unlimited = %t, Unit = %v, want true, UNKNOWN", l.Unlimited, l.Unit)
	}
	if l := cfg.Match("internal", entries("azure=x")).Limit; l.Unlimited || l.Unit != Minute {
		t.Errorf("azure: Unlimited = %t, Unit = %v, want false, MINUTE", l.Unlimited, l.Unit)
	}
}

func TestMatchExample6(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "example6")
	checkMatches(t, cfg, "example6", []matchCase{
		{give: entries("service=auth-service", "user=user-a"), fullKey: "example6.service.user_user-a", rpu: 10},
		{give: entries("service=auth-service", "user=user-b"), fullKey: "example6.service.user_user-b", rpu: 20},
		{give: entries("service=auth-service", "user=user-c")},
	})
	if !cfg.Match("example6", entries("service=s", "user=user-a")).Limit.ShadowMode {
		t.Error("user-a: ShadowMode = false, want true")
	}
	if cfg.Match("example6", entries("service=s", "user=user-b")).Limit.ShadowMode {
		t.Error("user-b: ShadowMode = true, want false")
	}
}

func TestMatchExample7(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "example7")
	a := cfg.Match("example7", entries("key_1=value_1", "user=bkthomps")).Limit
	b := cfg.Match("example7", entries("key_2=value_2", "user=bkthomps")).Limit
	if a == nil || a.Name != "specific_limit" || a.RequestsPerUnit != 5 {
		t.Fatalf("key_1: %+v, want the 5/s rule named specific_limit", a)
	}
	if b == nil || !reflect.DeepEqual(b.Replaces, []string{"specific_limit"}) || b.RequestsPerUnit != 10 {
		t.Fatalf("key_2: %+v, want the 10/s rule replacing specific_limit", b)
	}
}

func TestMatchExample8DetailedMetric(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "example8"), "example8", []matchCase{
		{give: entries("key1=unspecified_value"), fullKey: "example8.key1", rpu: 10, stat: "example8.key1_unspecified_value"},
		{give: entries("key1=unspecified_value2"), fullKey: "example8.key1", rpu: 10, stat: "example8.key1_unspecified_value2"},
		{give: entries("key1=value1"), fullKey: "example8.key1_value1", rpu: 20},
		// envoyproxy/ratelimit writes "key_" for an empty value here.
		{give: entries("key1="), fullKey: "example8.key1", rpu: 10, stat: "example8.key1_"},
	})
}

func TestMatchExample9Wildcard(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "example9"), "example9", []matchCase{
		{give: entries("key1=value_1"), fullKey: "example9.key1_value*", rpu: 20},
		{give: entries("key1=value_2"), fullKey: "example9.key1_value*", rpu: 20},
		{give: entries("key1=value"), fullKey: "example9.key1_value*", rpu: 20},
		{give: entries("key1=valu")},
		{give: entries("key1=other")},
	})
}

func TestMatchWildcard(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "wildcard"), "wild", []matchCase{
		// Exact beats every wildcard.
		{give: entries("path=/v1/exact"), fullKey: "wild.path_/v1/exact", rpu: 4},
		// A wildcard in the middle.
		{give: entries("path=/v1/users"), fullKey: "wild.path_/v*/users", rpu: 1},
		{give: entries("path=/v22/users"), fullKey: "wild.path_/v*/users", rpu: 1},
		{give: entries("path=/v/users"), fullKey: "wild.path_/v*/users", rpu: 1},
		// Several wildcards; the first pattern in the file wins.
		{give: entries("path=/v2/users/42/orders"), fullKey: "wild.path_/v*/users/*/orders*", rpu: 2},
		{give: entries("path=/v1/users/42/orders/7"), fullKey: "wild.path_/v*/users/*/orders*", rpu: 2},
		{give: entries("path=/v1/users/42"), fullKey: "wild.path_/v1/*", rpu: 3},
		{give: entries("path=/v1/"), fullKey: "wild.path_/v1/*", rpu: 3},
		// No pattern: the bare key.
		{give: entries("path=/v2/users/42"), fullKey: "wild.path", rpu: 5},
		{give: entries("path=/health"), fullKey: "wild.path", rpu: 5},
		// A leading wildcard.
		{give: entries("host=api.example.com"), fullKey: "wild.host_*.example.com", rpu: 6},
		{give: entries("host=example.com")},
		{give: entries("host=api.example.com.evil")},
		// "*" alone matches any value, the empty one too, and leads to
		// nested rules.
		{give: entries("tenant=acme", "user=bob"), fullKey: "wild.tenant_*.user", rpu: 7},
		{give: entries("tenant=", "user=bob"), fullKey: "wild.tenant_*.user", rpu: 7},
		{give: entries("tenant=acme")},
	})
}

func TestMatchValueToMetric(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "value_to_metric"), "vtm", []matchCase{
		{give: entries("route=/api/users", "http_method=GET", "user_id=42"), fullKey: "vtm.route.http_method.user_id", rpu: 60,
			stat: "vtm.route_/api/users.http_method_GET.user_id"},
		// A wildcard with value_to_metric counts under the request's value...
		{give: entries("path=/api/users"), fullKey: "vtm.path_/api/*", rpu: 30, stat: "vtm.path_/api/users"},
		// ...and without it under the pattern.
		{give: entries("path=/static/app.css"), fullKey: "vtm.path_/static/*", rpu: 300},
	})
}

func TestMatchShareThreshold(t *testing.T) {
	t.Parallel()
	checkMatches(t, loadMatch(t, "share_threshold"), "share", []matchCase{
		{give: entries("files=files/a.pdf"), fullKey: "share.files_files/*", rpu: 100,
			keyEnts: entries("files=files/*")},
		{give: entries("files=files/b.csv"), fullKey: "share.files_files/*", rpu: 100,
			keyEnts: entries("files=files/*")},
		// Sharing carries down to rules nested under the wildcard.
		{give: entries("models=models/gpt", "user=bob"), fullKey: "share.models_models/*.user", rpu: 10,
			keyEnts: entries("models=models/*", "user=bob")},
		// With detailed_metric, the pattern stands in for the shared value.
		{give: entries("models=models/gpt", "tenant=t1"), fullKey: "share.models_models/*.tenant", rpu: 50,
			stat: "share.models_models/*.tenant_t1", keyEnts: entries("models=models/*", "tenant=t1")},
		{give: entries("files=other/a.pdf")},
	})
}

func TestMatchModes(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "modes")
	l := cfg.Match("modes", entries("backend=primary")).Limit
	if l == nil || !l.QuotaMode || l.Metadata == nil {
		t.Fatalf("backend: %+v, want a quota_mode rule with metadata", l)
	}
	if l := cfg.Match("modes", entries("api_key=k")).Limit; l.Capacity() != 40 {
		t.Errorf("api_key: Capacity() = %d, want 40", l.Capacity())
	}
}

func TestMatchNilConfig(t *testing.T) {
	t.Parallel()
	var c *Config
	if m := c.Match("d", entries("a=b")); m.Limit != nil {
		t.Errorf("nil Config Match = %v, want no match", m)
	}
	if !c.Empty() || c.Domains() != nil || c.Dump() != "" || c.Limits() != nil {
		t.Error("nil Config is not empty")
	}
}

// TestMatchCompositeKeys pins a quirk of envoyproxy/ratelimit: the tree is
// keyed by "key_value", so a rule for key "a_b" also matches a=b.
func TestMatchCompositeKeys(t *testing.T) {
	t.Parallel()
	cfg, err := Parse([]File{{Name: "q.yaml", Data: []byte(`
domain: q
descriptors:
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 1}
`)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkMatches(t, cfg, "q", []matchCase{
		{give: entries("a=b"), fullKey: "q.a_b", rpu: 1},
		{give: entries("a_b=anything"), fullKey: "q.a_b", rpu: 1},
	})
}

func TestMatchDoesNotAllocate(t *testing.T) {
	cfg := loadMatch(t, "example2", "example3", "wildcard", "share_threshold")
	tests := []struct {
		domain string
		give   []Entry
	}{
		{"messaging", entries("message_type=marketing", "to_number=2061111111")},
		{"edge_proxy_per_ip", entries("remote_address=50.0.0.5")},
		{"edge_proxy_per_ip", entries("remote_address=10.1.2.3")},
		{"wild", entries("path=/v2/users/42/orders")},
		{"wild", entries("host=api.example.com")},
		{"messaging", entries("nothing=here")},
	}
	for _, tt := range tests {
		var m Match
		allocs := testing.AllocsPerRun(100, func() { m = cfg.Match(tt.domain, tt.give) })
		if allocs != 0 {
			t.Errorf("Match(%s, %v) allocates %v times, want 0", tt.domain, tt.give, allocs)
		}
		_ = m
	}
}

func TestDump(t *testing.T) {
	t.Parallel()
	cfg := loadMatch(t, "example5", "modes", "example6")
	want := `example6.service.user_user-a: unit=SECOND requests_per_unit=10, shadow_mode: true, quota_mode: false
example6.service.user_user-b: unit=SECOND requests_per_unit=20, shadow_mode: false, quota_mode: false
internal.azure: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false
internal.ldap: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false, unlimited: true
modes.api_key: unit=SECOND requests_per_unit=20, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 40
modes.backend_primary: unit=MINUTE requests_per_unit=1000, shadow_mode: false, quota_mode: true, name: primary_quota, metadata: {"service_with_quota":{"enabled":true,"name":"primary","ratio":0.5,"tags":["a","b"],"weight":3}}
modes.login: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false, algorithm: sliding_log
modes.user: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, algorithm: sliding_window, unit_multiplier: 5
`
	if got := cfg.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
	if got := len(cfg.Limits()); got != 8 {
		t.Errorf("len(Limits()) = %d, want 8", got)
	}
	if got := cfg.Domains(); !reflect.DeepEqual(got, []string{"example6", "internal", "modes"}) {
		t.Errorf("Domains() = %v", got)
	}
}
