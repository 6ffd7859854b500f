package redis

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// TestListKeysShareASlot: the keys of one descriptor's limits hash to one
// Cluster slot whatever the prefix and the values hold, so that the batch
// layer applies them in one script; other descriptors' keys spread.
func TestListKeysShareASlot(t *testing.T) {
	t.Parallel()
	cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(`domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50, algorithm: token_bucket}
`)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lim := cfg.Match("d", []rules.Entry{{Key: "k", Value: "v"}}).Limit
	now := time.Unix(1_700_000_029, 0)
	slots := map[int]bool{}
	for _, prefix := range []string{"", "rl_", "a{b_", "{x}_"} {
		for _, value := range []string{"v", "}", "{", "{}", "a}b{c", "x{y}z", "}{"} {
			entries := []rules.Entry{{Key: "k", Value: value}}
			for _, format := range []func([]byte, string, string, []rules.Entry, *rules.Limit, time.Time) []byte{limiter.CacheKey, limiter.EscapedCacheKey} {
				first := keySlot(string(format(nil, prefix, "d", entries, lim.Limits[0], now)))
				for _, l := range lim.Limits[1:] {
					key := string(format(nil, prefix, "d", entries, l, now))
					if s := keySlot(key); s != first {
						t.Errorf("prefix %q value %q: key %q in slot %d, the list's first in %d", prefix, value, key, s, first)
					}
				}
				slots[first] = true
			}
		}
	}
	if len(slots) < 5 {
		t.Errorf("the descriptors' keys fall in %d slots, want them spread", len(slots))
	}
}
