package server

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimit/src/settings"
	"github.com/ratelimitd/ratelimit/src/stats"
)

// newStatsd returns what sends the statistics to statsd or DogStatsD as
// the settings ask, or nil when none is asked for (USE_STATSD=false, or
// DISABLE_STATS=true).
func (s *Server) newStatsd() *stats.Statsd {
	set := s.set
	sink := set.StatsdSink()
	if sink == "" {
		return nil
	}
	cfg := stats.StatsdConfig{
		Addr:      net.JoinHostPort(set.StatsdHost, strconv.Itoa(set.StatsdPort)),
		Network:   set.StatsdProtocol,
		Interval:  set.StatsFlushInterval,
		DogStatsD: sink == "dogstatsd",
		Tags:      labels(set.ExtraTags),
		Log:       s.log,
		Quiet:     !set.StatsdAsked(),
	}
	if cfg.DogStatsD {
		// The anchor's DogStatsD client (datadog-go) speaks UDP whatever
		// STATSD_PROTOCOL says; so does the Datadog agent.
		cfg.Network = "udp"
		for _, m := range set.Mogrifiers() {
			cfg.Mogrifiers = append(cfg.Mogrifiers, mogrifier(m))
		}
	}
	s.log.Info("sending statistics", "to", sink, "addr", cfg.Addr, "protocol", cfg.Network, "interval", cfg.Interval)
	return stats.NewStatsd(s.stats, cfg)
}

// labels turns a map of tags into labels sorted by name.
func labels(m map[string]string) []stats.Label {
	out := make([]stats.Label, 0, len(m))
	for k, v := range m {
		out = append(out, stats.Label{Name: k, Value: v})
	}
	slices.SortFunc(out, func(a, b stats.Label) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func mogrifier(m settings.Mogrifier) stats.Mogrifier {
	return stats.Mogrifier{Pattern: m.Pattern, Name: m.Name, Tags: labels(m.Tags)}
}
