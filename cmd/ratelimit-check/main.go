// Command ratelimit-check validates a directory of rate limit rules, like
// envoyproxy/ratelimit's config_check_cmd, prints the rules the service
// would serve, or compares two directories, so that a change can be
// checked before it ships. It reads and parses the files with the code the
// service uses (provider.ReadFiles and rules.Parse with the same options),
// so it cannot accept what the service refuses or the reverse.
//
//	ratelimit-check -config_dir DIR         check; exit 0 valid, 1 invalid, 2 usage
//	ratelimit-check -config_dir DIR -dump   print the rules as /rlconfig does; same exit codes
//	ratelimit-check -diff OLD_DIR NEW_DIR   print what changes; exit 0 no difference,
//	                                        1 differences, 2 invalid rules or usage
//	ratelimit-check -replay CAPTURE -config_dir NEW [-against OLD]
//	                                        run a capture (GET /api/v1/capture) against NEW
//	                                        (and OLD) and report per rule; exit 0 the same
//	                                        answers as OLD (or the capture), 1 differences,
//	                                        2 invalid rules, a bad capture or usage
//	ratelimit-check -explain REQUEST -config_dir DIR | -debug_addr HOST:PORT
//	                                        say how a request (JSON, as POST /json takes
//	                                        it) would be answered, and why: the rule each
//	                                        descriptor matched or why none did, the limits
//	                                        and their counters (of a running instance with
//	                                        -debug_addr); exit 0 OK, 1 OVER_LIMIT, 2 invalid
//	                                        rules, a bad request or usage
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/provider"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/writebehind"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage:
  ratelimit-check -config_dir DIR [-dump] [-merge_domain_configs] [-ignore_dot_files] [-write_behind]
  ratelimit-check -diff [-merge_domain_configs] [-ignore_dot_files] OLD_DIR NEW_DIR
  ratelimit-check -replay CAPTURE|- -config_dir NEW [-against OLD] [-json] [-top N] [...]
  ratelimit-check -explain REQUEST|- (-config_dir DIR | -debug_addr HOST:PORT) [-json]`

// The exit codes of -diff, as diff(1)'s: CI pipelines tell "changed" from
// "broken" by them.
const (
	diffSame    = 0
	diffChanged = 1
	diffTrouble = 2
)

// run runs the command and returns the exit code: for a check or -dump, 0
// when the rules are valid, 1 when they are not, 2 for bad usage; for
// -diff, see diffSame, diffChanged and diffTrouble.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	var dir string
	var merge, ignoreDotFiles, dump, diff, writeBehind bool
	var rp replayFlags
	var ex explainFlags
	// config_dir and merge_domain_configs are envoyproxy/ratelimit's names.
	fs.StringVar(&dir, "config_dir", "", "directory of rule files (*.yaml, *.yml) to check")
	fs.StringVar(&dir, "config-dir", "", "same as -config_dir")
	fs.BoolVar(&merge, "merge_domain_configs", false, "let several files share a domain (MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&merge, "merge-domain-configs", false, "same as -merge_domain_configs")
	fs.BoolVar(&ignoreDotFiles, "ignore_dot_files", false, "skip files whose names start with a dot (RUNTIME_IGNOREDOTFILES)")
	// The service refuses other algorithms than fixed windows while
	// WRITE_BEHIND_INTERVAL is on: so does the check, in the same
	// environment or with the flag.
	wb, _ := time.ParseDuration(os.Getenv("WRITE_BEHIND_INTERVAL"))
	fs.BoolVar(&writeBehind, "write_behind", wb > 0, "check the rules as the service counting with WRITE_BEHIND_INTERVAL does: fixed_window only (default: whether $WRITE_BEHIND_INTERVAL is set above 0)")
	fs.BoolVar(&dump, "dump", false, "print every rule, one line each, as the debug endpoint /rlconfig does")
	fs.BoolVar(&diff, "diff", false, "compare the rules of OLD_DIR and NEW_DIR: rules added (+), removed (-) and changed (~)")
	rp.register(fs)
	ex.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	opts := rules.Options{MergeDomains: merge}
	if writeBehind {
		opts.Supports, opts.StoreName, opts.Unsupported = writebehind.Supports, "shared", writebehind.Unsupported
	}
	load := func(dir string) (int, *rules.Config, error) {
		cfg := provider.FileConfig{Root: dir, IgnoreDotFiles: ignoreDotFiles, Options: opts}
		files, err := provider.ReadFiles(cfg)
		if err != nil {
			return 0, nil, err
		}
		c, err := rules.Parse(files, cfg.Options)
		return len(files), c, err
	}

	if ex.request != "" {
		if dump || diff || rp.capture != "" || fs.NArg() > 0 || (dir == "") == (ex.debugAddr == "") {
			fmt.Fprintln(stderr, usage)
			return explainTrouble
		}
		ex.json = rp.json
		return runExplain(ex, dir, load, explainStdin, stdout, stderr)
	}
	if ex.debugAddr != "" {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if rp.capture != "" {
		if dump || diff || dir == "" || fs.NArg() > 0 {
			fmt.Fprintln(stderr, usage)
			return replayTrouble
		}
		return runReplay(rp, dir, load, stdout, stderr)
	}
	if rp.against != "" {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if diff {
		if dump || dir != "" || fs.NArg() != 2 {
			fmt.Fprintln(stderr, usage)
			return diffTrouble
		}
		return runDiff(fs.Arg(0), fs.Arg(1), load, stdout, stderr)
	}
	if dir == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	n, c, err := load(dir)
	if err != nil {
		fmt.Fprintf(stderr, "%d problem(s) in %s\n", printProblems(stderr, err), dir)
		return 1
	}
	if dump {
		fmt.Fprint(stdout, c.Dump())
		return 0
	}
	domains := c.Domains()
	quotas := ""
	if q := len(c.QuotaRules()); q > 0 {
		// Only when there are some: the line is otherwise the one tools
		// already read.
		quotas = fmt.Sprintf(", %d quota rule(s)", q)
	}
	fmt.Fprintf(stdout, "ok: %d file(s), %d domain(s), %d rule(s)%s in %s\n", n, len(domains), len(c.Limits()), quotas, dir)
	if len(domains) > 0 {
		fmt.Fprintf(stdout, "domains: %s\n", strings.Join(domains, ", "))
	}
	return 0
}

// runDiff loads both directories and prints their differences, one per
// line (see rules.Change.String), then a summary.
func runDiff(oldDir, newDir string, load func(string) (int, *rules.Config, error), stdout, stderr io.Writer) int {
	cfgs, ok := loadDirs(load, stderr, oldDir, newDir)
	if !ok {
		return diffTrouble
	}
	changes := rules.Diff(cfgs[0], cfgs[1])
	if len(changes) == 0 {
		fmt.Fprintf(stdout, "no difference between %s and %s\n", oldDir, newDir)
		return diffSame
	}
	count := map[rules.ChangeKind]int{}
	restarts := 0
	for _, c := range changes {
		fmt.Fprintln(stdout, c)
		count[c.Kind]++
		if c.Restarts {
			restarts++
		}
	}
	fmt.Fprintf(stdout, "%d change(s) from %s to %s: %d added, %d removed, %d changed, %d restarting counters\n",
		len(changes), oldDir, newDir, count[rules.Added], count[rules.Removed], count[rules.Changed], restarts)
	if cfgs[1].Empty() && !cfgs[0].Empty() {
		// The service refuses such a reload unless told otherwise; say so
		// before a pipeline ships it believing it drops every limit.
		fmt.Fprintf(stderr, "warning: %s has no domain left; a running service keeps its rules on such a reload unless RUNTIME_ALLOW_EMPTY_RELOAD=true\n", newDir)
	}
	return diffChanged
}

// loadDirs loads the rules of each directory ("" gives nil), printing the
// problems of those that do not load; ok is false if any did not.
func loadDirs(load func(string) (int, *rules.Config, error), stderr io.Writer, dirs ...string) (cfgs []*rules.Config, ok bool) {
	cfgs, ok = make([]*rules.Config, len(dirs)), true
	for i, dir := range dirs {
		if dir == "" {
			continue
		}
		_, c, err := load(dir)
		if err != nil {
			fmt.Fprintf(stderr, "%d problem(s) in %s\n", printProblems(stderr, err), dir)
			ok = false
		}
		cfgs[i] = c
	}
	return cfgs, ok
}

// printProblems prints each problem of a joined error on its own line and
// returns how many there were.
func printProblems(w io.Writer, err error) int {
	var j interface{ Unwrap() []error }
	if !errors.As(err, &j) {
		fmt.Fprintln(w, err)
		return 1
	}
	for _, e := range j.Unwrap() {
		fmt.Fprintln(w, e)
	}
	return len(j.Unwrap())
}
