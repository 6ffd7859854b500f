package limiter

import (
	"bytes"
	"slices"
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

func TestEscapedCacheKey(t *testing.T) {
	t.Parallel()
	kv := func(pairs ...string) []rules.Entry {
		var es []rules.Entry
		for i := 0; i < len(pairs); i += 2 {
			es = append(es, rules.Entry{Key: pairs[i], Value: pairs[i+1]})
		}
		return es
	}
	second := &rules.Limit{RequestsPerUnit: 10, Unit: rules.Second, UnitMultiplier: 1}
	tests := []struct {
		name    string
		prefix  string
		domain  string
		entries []rules.Entry
		limit   *rules.Limit
		want    string
	}{
		{"plain_parts_as_anchor", "rl_", "api", kv("user", "alice"), &rules.Limit{Unit: rules.Minute, UnitMultiplier: 1, Algorithm: rules.SlidingWindow}, "rl_api_user_alice_60_sliding_window"},
		{"underscore_in_value", "", "d", kv("k", "a_b"), second, `d_k_a\_b_7`},
		{"backslash_in_value", "", "d", kv("k", `a\b`), second, `d_k_a\\b_7`},
		{"backslash_then_underscore", "", "d", kv("k", `\_`), second, `d_k_\\\__7`},
		{"value_ends_with_backslash", "", "d", kv("k", `v\`, "k2", "w"), second, `d_k_v\\_k2_w_7`},
		{"underscores_in_domain_and_key", "", "my_domain", kv("remote_address", "10.0.0.1"), second, `my\_domain_remote\_address_10.0.0.1_7`},
		{"prefix_kept_as_is", `p_\`, "d", kv("k", "v"), second, `p_\d_k_v_7`},
		{"empty_value", "", "d", kv("k", ""), second, "d_k__7"},
		{"no_entries", "", "d", nil, second, "d_7"},
		{"token_bucket", "", "d", kv("k", "a_b"), &rules.Limit{Unit: rules.Second, UnitMultiplier: 1, Algorithm: rules.TokenBucket}, `d_k_a\_b_1_token_bucket`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := string(EscapedCacheKey(nil, tt.prefix, tt.domain, tt.entries, tt.limit, time.Unix(7, 0)))
			if got != tt.want {
				t.Errorf("EscapedCacheKey() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestEscapedKeysCannotCollide: descriptors that share an anchor key, one
// value's '_' taking the place of a border, have keys of their own when
// escaped.
func TestEscapedKeysCannotCollide(t *testing.T) {
	t.Parallel()
	l := &rules.Limit{Unit: rules.Hour, UnitMultiplier: 1}
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		a, b []rules.Entry
	}{
		{"value_holds_the_next_entry", // the k1 -> k2 rule
			[]rules.Entry{{Key: "k1", Value: "x_k2_y"}, {Key: "k2", Value: "z"}},
			[]rules.Entry{{Key: "k1", Value: "x"}, {Key: "k2", Value: "y_k2_z"}}},
		{"one_entry_against_two",
			[]rules.Entry{{Key: "k1", Value: "v_k2_w"}},
			[]rules.Entry{{Key: "k1", Value: "v"}, {Key: "k2", Value: "w"}}},
		{"key_against_value",
			[]rules.Entry{{Key: "a_b", Value: "c"}},
			[]rules.Entry{{Key: "a", Value: "b_c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if a, b := CacheKey(nil, "", "d", tt.a, l, now), CacheKey(nil, "", "d", tt.b, l, now); !bytes.Equal(a, b) {
				t.Fatalf("anchor keys %q and %q differ: the case shows no collision", a, b)
			}
			if a, b := EscapedCacheKey(nil, "", "d", tt.a, l, now), EscapedCacheKey(nil, "", "d", tt.b, l, now); bytes.Equal(a, b) {
				t.Errorf("EscapedCacheKey gives %q for both %v and %v", a, tt.a, tt.b)
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
	allocs = testing.AllocsPerRun(100, func() {
		buf = EscapedCacheKey(buf[:0], "prefix_", "my_domain", []rules.Entry{{Key: "remote_address", Value: `10.0.0.1_\`}}, l, time.Unix(1_700_000_000, 0))
	})
	if allocs != 0 {
		t.Errorf("EscapedCacheKey into a large enough buffer: %v allocs, want 0", allocs)
	}
}

// splitEscaped reads an escaped key back, after its prefix: it splits it
// at every unescaped '_' and unescapes the parts. ok is false when a '\'
// escapes neither '\' nor '_'.
func splitEscaped(b []byte) (parts []string, ok bool) {
	var part []byte
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '\\':
			if i+1 == len(b) || b[i+1] != '\\' && b[i+1] != '_' {
				return nil, false
			}
			i++
			part = append(part, b[i])
		case '_':
			parts = append(parts, string(part))
			part = part[:0]
		default:
			part = append(part, c)
		}
	}
	return append(parts, string(part)), true
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
	f.Add("p_\\", "d", "k1", "x_k2_y", "k2", "z", uint8(rules.Hour), uint32(1), uint8(rules.FixedWindow), int64(1_700_000_000))
	f.Add("", "my_d", "k", "v\\", "_", "\\_", uint8(rules.Minute), uint32(1), uint8(rules.TokenBucket), int64(60))
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
		} else {
			head := anchorKey(prefix, domain, entries, 1, 0)
			head = head[:len(head)-1] // without the "0" window start
			want := head + strconv.FormatInt(divider, 10) + "_" + a.String()
			if string(got) != want {
				t.Fatalf("CacheKey() = %q, want %q", got, want)
			}
			if last := got[len(got)-1]; last >= '0' && last <= '9' {
				t.Fatalf("CacheKey() = %q ends with a digit: it could be a fixed-window key", got)
			}
		}

		// The escaped format reads back into exactly its parts: so two
		// descriptors that differ anywhere never share a key.
		esc := EscapedCacheKey(nil, prefix, domain, entries, l, tm)
		if again := EscapedCacheKey(make([]byte, 0, 3), prefix, domain, entries, l, tm); !bytes.Equal(esc, again) {
			t.Fatalf("EscapedCacheKey not deterministic: %q then %q", esc, again)
		}
		if !bytes.HasPrefix(esc, []byte(prefix)) {
			t.Fatalf("EscapedCacheKey() = %q does not start with the prefix %q", esc, prefix)
		}
		parts, ok := splitEscaped(esc[len(prefix):])
		want := []string{domain}
		for _, e := range entries {
			want = append(want, e.Key, e.Value)
		}
		suffix := string(got[bytes.LastIndexByte(got, '_')+1:]) // the window start
		if a != rules.FixedWindow {
			suffix = strconv.FormatInt(divider, 10) + "_" + a.String()
		}
		want = append(want, strings.Split(suffix, "_")...)
		if !ok || !slices.Equal(parts, want) {
			t.Fatalf("EscapedCacheKey() = %q reads back as %q (ok %v), want %q", esc, parts, ok, want)
		}
		// Folding the second entry into the first value: one anchor key,
		// two escaped ones.
		if len(entries) == 2 {
			folded := []rules.Entry{{Key: k1, Value: v1 + "_" + k2 + "_" + v2}}
			if !bytes.Equal(CacheKey(nil, prefix, domain, folded, l, tm), got) {
				t.Fatalf("anchor key of %v differs from %q", folded, got)
			}
			if bytes.Equal(EscapedCacheKey(nil, prefix, domain, folded, l, tm), esc) {
				t.Fatalf("EscapedCacheKey gives %q for both %v and %v", esc, folded, entries)
			}
		}
	})
}

// TestSplitListKey splits the keys of every algorithm of a list, in both
// formats, and refuses the keys of single limits.
func TestSplitListKey(t *testing.T) {
	t.Parallel()
	now := time.Unix(1699920030, 0)
	entries := []rules.Entry{{Key: "user", Value: "a}_1_b{"}, {Key: "path", Value: "/x_y"}}
	for _, format := range []KeyFormat{AnchorKeys, EscapedKeys} {
		build := CacheKey
		if format == EscapedKeys {
			build = EscapedCacheKey
		}
		for _, alg := range rules.Algorithms {
			one := &rules.Limit{RequestsPerUnit: 5, Unit: rules.Minute, UnitMultiplier: 3, Algorithm: alg}
			one.Limits = []*rules.Limit{one} // InList
			key := string(build(nil, "rl_", "api", entries, one, now))
			shared, limit, ok := SplitListKey(key, alg)
			wantShared := key[:strings.LastIndexByte(key, '}')+1]
			wantLimit := "3_minute"
			if alg != rules.FixedWindow {
				wantLimit += "_" + alg.String()
			}
			if !ok || shared != wantShared || limit != wantLimit {
				t.Errorf("SplitListKey(%q, %v) = %q, %q, %t; want %q, %q", key, alg, shared, limit, ok, wantShared, wantLimit)
			}
			// The same limit in the next window: the same parts.
			next := string(build(nil, "rl_", "api", entries, one, now.Add(time.Hour)))
			if s2, l2, _ := SplitListKey(next, alg); s2 != shared || l2 != limit {
				t.Errorf("SplitListKey(%q) = %q, %q; want the parts of %q", next, s2, l2, key)
			}
			// A shadow limit of the same window: its own key, whose
			// limit part ends with "_shadow".
			shadow := *one
			shadow.Shadow = true
			sk := string(build(nil, "rl_", "api", entries, &shadow, now))
			if s, l, ok := SplitListKey(sk, alg); !ok || s != shared || l != limit+"_shadow" || sk == key {
				t.Errorf("SplitListKey(%q, %v) = %q, %q, %t; want %q, %q", sk, alg, s, l, ok, shared, limit+"_shadow")
			}
			single := &rules.Limit{RequestsPerUnit: 5, Unit: rules.Minute, UnitMultiplier: 3, Algorithm: alg}
			if k := string(build(nil, "rl_", "api", entries, single, now)); isList(k, alg) {
				t.Errorf("SplitListKey(%q, %v): a single limit's key split as a list's", k, alg)
			}
		}
	}
	for _, k := range []string{"", "}", "rl_{a}", "rl_{a}_", "rl_{a}_x_second", "rl_{a}_1_fortnight", "rl_{a}_1_second_", "rl_{a}_-_1_second",
		"rl_{a}_shadow", "rl_{a}_1_shadow", "rl_{a}_1_second_shadow_shadow"} {
		if isList(k, rules.FixedWindow) || isList(k, rules.TokenBucket) {
			t.Errorf("SplitListKey(%q) split a key that is not a list's", k)
		}
	}
	if s, l, ok := SplitListKey("rl_{a}_-60_1_second", rules.FixedWindow); !ok || s != "rl_{a}" || l != "1_second" {
		t.Errorf("SplitListKey of a negative window start = %q, %q, %t", s, l, ok)
	}
}

func isList(key string, a rules.Algorithm) bool {
	_, _, ok := SplitListKey(key, a)
	return ok
}
