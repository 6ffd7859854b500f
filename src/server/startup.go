package server

import (
	"net/url"
	"strings"

	"github.com/ratelimitd/ratelimit/src/settings"
)

// The startup line is the one line the service prints at the default
// LOG_LEVEL (WARN) when all is well: where it listens, which store and
// which rules it uses. It is logged at warn level, as envoyproxy/ratelimit
// logs its "Listening for ... on" lines, because an operator who starts
// the service with the defaults must see that it started and where: slog
// has no level between info and warn, and a line that bypassed the level
// would surprise anyone who filters on it. Log pipelines built for the
// anchor already expect warning lines at startup.

// storeSummary names the store and where it is, for the startup line. It
// never prints credentials: REDIS_AUTH and the like are separate settings,
// and any user:password@ in an address is dropped.
func storeSummary(set *settings.Settings) string {
	switch set.BackendType {
	case settings.BackendRedis:
		s := "redis " + strings.ToLower(set.RedisType) + " " + set.RedisSocketType + " " + redactAddrs(set.RedisURL)
		if set.RedisTLS {
			s += " tls"
		}
		if set.RedisPerSecond {
			s += "; per second: redis " + strings.ToLower(set.RedisPerSecondType) + " " + set.RedisPerSecondSocketType + " " + redactAddrs(set.RedisPerSecondURL)
		}
		return s
	case settings.BackendMemcache:
		if set.MemcacheSrv != "" {
			return "memcache srv " + set.MemcacheSrv
		}
		return "memcache " + redactAddrs(strings.Join(set.MemcacheHostPort, ","))
	default:
		return set.BackendType
	}
}

// redactAddrs drops the user information of each comma-separated address
// (a URL's user:password@, or a bare one before host:port).
func redactAddrs(addrs string) string {
	parts := strings.Split(addrs, ",")
	for i, p := range parts {
		if u, err := url.Parse(p); err == nil && u.User != nil {
			u.User = nil
			parts[i] = u.String()
			continue
		}
		if at := strings.LastIndex(p, "@"); at >= 0 {
			parts[i] = p[at+1:]
		}
	}
	return strings.Join(parts, ",")
}

// rulesSummary says where the rules come from, for the startup line.
func (s *Server) rulesSummary() string {
	if s.set.ConfigType == settings.ConfigTypeXDS {
		return "xds " + s.set.ConfigGRPCXDSServerURL + " node " + s.set.ConfigGRPCXDSNodeID
	}
	return s.rulesFiles.Dir()
}

// domains are the domains of the rules in use, for the startup line.
func (s *Server) domains() []string {
	if snap := s.snapshot.Load(); snap != nil && snap.Rules != nil {
		return snap.Rules.Domains()
	}
	return nil
}
