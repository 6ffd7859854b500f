package server

import (
	"io"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/provider"
)

// loadError is a failed load of rules and when it was reported.
type loadError struct {
	err error
	at  time.Time
}

// rlconfigTime is how /rlconfig writes times: RFC 3339 in UTC, to the
// millisecond, so that instances in other time zones compare at a glance.
const rlconfigTime = "2006-01-02T15:04:05.000Z07:00"

// writeRulesDump writes the body of /rlconfig to w: a header of lines
// starting with "#" saying where the rules in use came from, when they
// loaded and the last failed load since then, if any; then the rules, one
// line each, exactly as envoyproxy/ratelimit's /rlconfig and
// rules.Config.Dump write them, a line at a time, so that the endpoint
// holds no copy of a large rule set. Tools that read the anchor's lines
// skip the header by dropping the lines that start with "#".
func writeRulesDump(w io.Writer, snap *provider.Snapshot, failed *loadError) error {
	var b strings.Builder
	header := func(name, value string) {
		b.WriteString("# ")
		b.WriteString(name)
		b.WriteString(": ")
		// An error may span lines (one per problem); each goes on a
		// header line of its own, so that none can pass for a rule.
		for i, line := range strings.Split(strings.TrimRight(value, "\n"), "\n") {
			if i > 0 {
				b.WriteString("\n#   ")
			}
			b.WriteString(line)
		}
		b.WriteByte('\n')
	}
	if snap != nil {
		header("source", snap.Source.Kind+" "+snap.Source.Location)
		if snap.Source.Version != "" {
			header("version", snap.Source.Version)
		}
		header("loaded", snap.Source.LoadedAt.UTC().Format(rlconfigTime))
	}
	if failed != nil {
		header("last load error", failed.at.UTC().Format(rlconfigTime)+" "+failed.err.Error())
	}
	if snap == nil {
		b.WriteString("no rules loaded\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil || snap == nil {
		return err
	}
	return snap.Rules.WriteDump(w)
}
