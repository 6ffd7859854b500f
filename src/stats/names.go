package stats

import (
	"regexp"
	"strings"
)

// Names as envoyproxy/ratelimit writes them, which both exports start
// from: statsd sends them, and a Prometheus mapping (statsd_exporter's
// format) matches them. Neither export depends on the other.

// ipv4 matches what the anchor takes for an IPv4 address in a name.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// anchorName is a name as the anchor writes it (its SanitizeStatName):
// ':' and '|' replaced by '_', and the dots of anything that looks like an
// IPv4 address too, so that remote_address_10.0.0.1 is one level,
// remote_address_10_0_0_1, and not four.
func anchorName(s string) string {
	if strings.ContainsAny(s, ":|") {
		s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	}
	if !strings.Contains(s, ".") || !ipv4.MatchString(s) {
		return s
	}
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}
