// Command ratelimit-check validates a directory of rate limit rules, like
// envoyproxy/ratelimit's config_check_cmd: it prints every problem with
// its file and line and exits 1, or prints a summary and exits 0.
//
//	ratelimit-check -config_dir /srv/runtime_data/current/ratelimit/config
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ratelimitd/ratelimit/src/provider"
	"github.com/ratelimitd/ratelimit/src/rules"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run checks the rules and returns the exit code: 0 when they are valid,
// 1 when they are not, 2 for bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var dir string
	var merge, ignoreDotFiles bool
	// config_dir and merge_domain_configs are envoyproxy/ratelimit's names.
	fs.StringVar(&dir, "config_dir", "", "directory of rule files (*.yaml, *.yml) to check")
	fs.StringVar(&dir, "config-dir", "", "same as -config_dir")
	fs.BoolVar(&merge, "merge_domain_configs", false, "let several files share a domain (MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&merge, "merge-domain-configs", false, "same as -merge_domain_configs")
	fs.BoolVar(&ignoreDotFiles, "ignore_dot_files", false, "skip files whose names start with a dot (RUNTIME_IGNOREDOTFILES)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if dir == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: ratelimit-check -config_dir DIR [-merge_domain_configs] [-ignore_dot_files]")
		return 2
	}

	cfg := provider.FileConfig{
		Root:           dir,
		IgnoreDotFiles: ignoreDotFiles,
		Options:        rules.Options{MergeDomains: merge},
	}
	files, err := provider.ReadFiles(cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	c, err := rules.Parse(files, cfg.Options)
	if err != nil {
		n := printProblems(stderr, err)
		fmt.Fprintf(stderr, "%d problem(s) in %s\n", n, dir)
		return 1
	}
	domains := c.Domains()
	fmt.Fprintf(stdout, "ok: %d file(s), %d domain(s), %d rule(s) in %s\n", len(files), len(domains), len(c.Limits()), dir)
	if len(domains) > 0 {
		fmt.Fprintf(stdout, "domains: %s\n", strings.Join(domains, ", "))
	}
	return 0
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
