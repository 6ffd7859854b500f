package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
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

// rulesSettings are the settings that say where the rule files are, as
// attributes of a log line.
func (s *Server) rulesSettings() []any {
	return []any{"RUNTIME_ROOT", s.set.RuntimeRoot, "RUNTIME_SUBDIRECTORY", s.set.RuntimeSubdirectory,
		"RUNTIME_APPDIRECTORY", s.set.RuntimeAppDirectory}
}

// maxNamesShown bounds the names of files that did not load in the
// warning of warnNoRules.
const maxNamesShown = 5

// warnNoRules warns when the rules directory read at start held no rule:
// every request would be answered OK, which is also what a wrong
// RUNTIME_ROOT, RUNTIME_SUBDIRECTORY or RUNTIME_APPDIRECTORY looks like.
// It names the directory read, those settings and the first files there
// that are not rule files (rules.json, say).
func (s *Server) warnNoRules() {
	snap := s.snapshot.Load()
	if snap == nil || !snap.Rules.Empty() {
		return
	}
	attrs := append([]any{"dir", snap.Source.Location}, s.rulesSettings()...)
	var other []string
	entries, _ := os.ReadDir(s.rulesFiles.Dir())
	for _, e := range entries {
		if len(other) == maxNamesShown {
			other = append(other, "...")
			break
		}
		if !e.IsDir() {
			other = append(other, e.Name())
		}
	}
	if other != nil {
		attrs = append(attrs, "not_rule_files", other)
	}
	s.log.Warn("no rules: the rules directory holds no rule file (*.yaml, *.yml), so every request is answered OK with no limit; "+
		"put the rule files there, or point RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY at them", attrs...)
}

// rulesDirError names the settings that make the rules directory in err,
// when it does not exist.
func (s *Server) rulesDirError(err error) error {
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fmt.Errorf("server: no rules directory %s (RUNTIME_ROOT=%q, RUNTIME_SUBDIRECTORY=%q, RUNTIME_APPDIRECTORY=%q): %w",
		s.rulesFiles.Dir(), s.set.RuntimeRoot, s.set.RuntimeSubdirectory, s.set.RuntimeAppDirectory, err)
}
