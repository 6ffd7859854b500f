package provider

import (
	"errors"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// The kinds of Source.
const (
	// SourceFiles is a rules directory (Watch).
	SourceFiles = "files"
	// SourceXDS is an xDS management server.
	SourceXDS = "xds"
)

// Snapshot is a whole, validated set of rules with where it came from.
// Providers hand snapshots to their caller, which publishes each one
// whole; Rules is never nil.
type Snapshot struct {
	Rules  *rules.Config
	Source Source
}

// Source says where a snapshot's rules came from, for operators: the
// debug endpoint /rlconfig prints it above the rules.
type Source struct {
	// Kind is SourceFiles or SourceXDS.
	Kind string
	// Location is where the rules were read: for files, the rules
	// directory as configured, followed by " -> " and the directory it
	// resolves to when symbolic links on the way lead elsewhere
	// (current -> v2); for xDS, the management server.
	Location string
	// Version tells contents apart: for files, "sha256:" and 16 hex
	// digits of a hash of the rule files' names and bytes, so that
	// instances serving the same files show the same version whatever the
	// files' dates; for xDS, the version_info of the accepted response.
	Version string
	// LoadedAt is when the snapshot was loaded.
	LoadedAt time.Time
}

// MaxReportedProblems bounds the problems a refused load reports (in the
// log, in /rlconfig and in an xDS NACK): the first ones, then a count of
// the rest. A file or an update can hold any number of them; what tells an
// operator what to fix is the first few and how many there are.
// ratelimit-check reports every one.
const MaxReportedProblems = 20

// capProblems keeps the first MaxReportedProblems of a joined error and
// says how many more there were.
func capProblems(err error) error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	parts := j.Unwrap()
	if len(parts) <= MaxReportedProblems {
		return err
	}
	kept := append(parts[:MaxReportedProblems:MaxReportedProblems],
		fmt.Errorf("… and %d more problems (%d in all; ratelimit-check lists every one)", len(parts)-MaxReportedProblems, len(parts)))
	return errors.Join(kept...)
}
