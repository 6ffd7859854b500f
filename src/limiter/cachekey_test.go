package limiter

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

func TestCacheKey(t *testing.T) {
	t.Parallel()
	kv := func(pairs ...string) []rules.Entry {
		var es []rules.Entry
		for i := 0; i < len(pairs); i += 2 {
			es = append(es, rules.Entry{Key: pairs[i], Value: pairs[i+1]})
		}
		return es
	}
	lim := func(u rules.Unit, mult uint32, a rules.Algorithm) *rules.Limit {
		return &rules.Limit{RequestsPerUnit: 10, Unit: u, UnitMultiplier: mult, Algorithm: a}
	}
	tests := []struct {
		name    string
		prefix  string
		domain  string
		entries []rules.Entry
		limit   *rules.Limit
		now     int64
		want    string
	}{
		// The first rows are envoyproxy/ratelimit's own test expectations
		// (redis and memcached tests: "domain_key_value_1234", a minute at
		// 1234 -> 1200, prefix "prefix:").
		{"anchor_second", "", "domain", kv("key", "value"), lim(rules.Second, 1, rules.FixedWindow), 1234, "domain_key_value_1234"},
		{"anchor_minute", "", "domain", kv("key", "value"), lim(rules.Minute, 1, rules.FixedWindow), 1234, "domain_key_value_1200"},
		{"anchor_hour", "", "domain", kv("key2", "value2", "subkey2", "subvalue2"), lim(rules.Hour, 1, rules.FixedWindow), 1234, "domain_key2_value2_subkey2_subvalue2_0"},
		{"anchor_day", "", "domain", kv("key3", "value3"), lim(rules.Day, 1, rules.FixedWindow), 1000000, "domain_key3_value3_950400"},
		{"anchor_prefix", "prefix:", "domain", kv("key", "value"), lim(rules.Second, 1, rules.FixedWindow), 1234, "prefix:domain_key_value_1234"},
		{"no_entries", "", "d", nil, lim(rules.Second, 1, rules.FixedWindow), 7, "d_7"},
		{"empty_value", "", "d", kv("k", ""), lim(rules.Second, 1, rules.FixedWindow), 7, "d_k__7"},
		{"week", "", "d", kv("k", "v"), lim(rules.Week, 1, rules.FixedWindow), 1_700_000_000, "d_k_v_1699488000"},
		{"month_is_30_days", "", "d", kv("k", "v"), lim(rules.Month, 1, rules.FixedWindow), 1_700_000_000, "d_k_v_1697760000"},
		{"year_is_365_days", "", "d", kv("k", "v"), lim(rules.Year, 1, rules.FixedWindow), 1_700_000_000, "d_k_v_1671408000"},
		{"multiplier_5_minutes", "", "d", kv("k", "v"), lim(rules.Minute, 5, rules.FixedWindow), 1_700_000_299, "d_k_v_1700000100"},
		{"multiplier_30_seconds", "", "d", kv("k", "v"), lim(rules.Second, 30, rules.FixedWindow), 1_700_000_029, "d_k_v_1700000010"},
		{"multiplier_zero_is_one", "", "d", kv("k", "v"), lim(rules.Minute, 0, rules.FixedWindow), 1_700_000_029, "d_k_v_1699999980"},
		{"unknown_unit_is_one_second", "", "d", kv("k", "v"), lim(rules.Unknown, 1, rules.FixedWindow), 1_700_000_029, "d_k_v_1700000029"},
		{"sliding_window", "rl_", "api", kv("user", "alice"), lim(rules.Minute, 1, rules.SlidingWindow), 1_700_000_029, "rl_api_user_alice_60_sliding_window"},
		{"sliding_log", "", "api", kv("user", "alice"), lim(rules.Hour, 6, rules.SlidingLog), 1_700_000_029, "api_user_alice_21600_sliding_log"},
		{"token_bucket", "", "api", kv("user", "alice", "path", "/a"), lim(rules.Second, 1, rules.TokenBucket), 1, "api_user_alice_path_/a_1_token_bucket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := string(CacheKey(nil, tt.prefix, tt.domain, tt.entries, tt.limit, time.Unix(tt.now, 999_999_999)))
			if got != tt.want {
				t.Errorf("CacheKey() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCacheKeyAppends(t *testing.T) {
	l := &rules.Limit{Unit: rules.Second, UnitMultiplier: 1}
	dst := []byte("keep:")
	got := CacheKey(dst, "", "d", []rules.Entry{{Key: "k", Value: "v"}}, l, time.Unix(5, 0))
	if string(got) != "keep:d_k_v_5" {
		t.Errorf("CacheKey(%q, ...) = %q, want %q", "keep:", got, "keep:d_k_v_5")
	}
	if raceEnabled {
		return // allocation counts are meaningless under -race
	}
	buf := make([]byte, 0, 64)
	allocs := testing.AllocsPerRun(100, func() {
		buf = CacheKey(buf[:0], "prefix_", "domain", []rules.Entry{{Key: "remote_address", Value: "10.0.0.1"}}, l, time.Unix(1_700_000_000, 0))
	})
	if allocs != 0 {
		t.Errorf("CacheKey into a large enough buffer: %v allocs, want 0", allocs)
	}
}

// anchorKey is envoyproxy/ratelimit's GenerateCacheKey written out plainly:
// the reference FuzzCacheKey holds CacheKey to.
func anchorKey(prefix, domain string, entries []rules.Entry, divider, now int64) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for _, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(e.Value)
		b.WriteByte('_')
	}
	b.WriteString(strconv.FormatInt((now/divider)*divider, 10))
	return b.String()
}

func FuzzCacheKey(f *testing.F) {
	f.Add("", "domain", "key", "value", "", "", uint8(rules.Second), uint32(1), uint8(rules.FixedWindow), int64(1234))
	f.Add("prefix:", "domain", "key", "value", "subkey", "subvalue", uint8(rules.Minute), uint32(1), uint8(rules.FixedWindow), int64(1234))
	f.Add("rl_", "api", "user", "alice", "", "", uint8(rules.Minute), uint32(5), uint8(rules.SlidingWindow), int64(1_700_000_029))
	f.Add("", "api", "a_b", "c_", "_", "1", uint8(rules.Day), uint32(2), uint8(rules.TokenBucket), int64(1_700_000_029))
	f.Add("", "d", "k", "v", "", "", uint8(rules.Year), uint32(4_000_000_000), uint8(rules.SlidingLog), int64(-5))
	f.Fuzz(func(t *testing.T, prefix, domain, k1, v1, k2, v2 string, unit uint8, mult uint32, alg uint8, now int64) {
		u := rules.Unit(unit % 8)
		a := rules.Algorithm(alg % uint8(len(rules.Algorithms)))
		l := &rules.Limit{Unit: u, UnitMultiplier: mult, Algorithm: a}
		entries := []rules.Entry{{Key: k1, Value: v1}}
		if k2 != "" || v2 != "" {
			entries = append(entries, rules.Entry{Key: k2, Value: v2})
		}
		tm := time.Unix(now, 0)
		got := CacheKey(nil, prefix, domain, entries, l, tm)
		if again := CacheKey(make([]byte, 0, 3), prefix, domain, entries, l, tm); !bytes.Equal(got, again) {
			t.Fatalf("CacheKey not deterministic: %q then %q", got, again)
		}
		divider := u.Seconds() * max(int64(mult), 1)
		if divider < 1 {
			divider = 1
		}
		if a == rules.FixedWindow {
			if want := anchorKey(prefix, domain, entries, divider, now); string(got) != want {
				t.Fatalf("CacheKey() = %q, want the anchor's %q", got, want)
			}
			return
		}
		head := anchorKey(prefix, domain, entries, 1, 0)
		head = head[:len(head)-1] // without the "0" window start
		want := head + strconv.FormatInt(divider, 10) + "_" + a.String()
		if string(got) != want {
			t.Fatalf("CacheKey() = %q, want %q", got, want)
		}
		if last := got[len(got)-1]; last >= '0' && last <= '9' {
			t.Fatalf("CacheKey() = %q ends with a digit: it could be a fixed-window key", got)
		}
	})
}
