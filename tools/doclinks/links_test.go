// Package doclinks checks the repository's Markdown: every relative link
// names a file that exists and, when it has a fragment, a heading (or an
// explicit anchor) of that file, so moving a section between pages cannot
// leave a reader at a dead link.
package doclinks

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^(#{1,6}) (.*)$`)
	anchorRE  = regexp.MustCompile(`<a (?:name|id)="([^"]+)"`)
	dropRE    = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces as hyphens.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = dropRE.ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// anchors lists the fragments a Markdown file answers, with GitHub's -1,
// -2 suffixes for repeated headings; fenced code is skipped.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	fenced := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			base := slug(m[2])
			name := base
			for i := 1; out[name]; i++ {
				name = base + "-" + strconv.Itoa(i)
			}
			out[name] = true
		}
		for _, m := range anchorRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
	}
	return out
}

// prose drops fenced code, where a ](x) is not a link.
func prose(text string) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(line)
		}
	}
	return b.String()
}

func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != root || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d Markdown files under %s, want the README and docs/", len(files), root)
	}
	cache := map[string]map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, m := range linkRE.FindAllStringSubmatch(prose(string(b)), -1) {
			u := m[1]
			if strings.Contains(u, "://") || strings.HasPrefix(u, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(u, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link %s: no such file", rel, u)
				continue
			}
			if frag == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			a, ok := cache[target]
			if !ok {
				tb, err := os.ReadFile(target)
				if err != nil {
					t.Fatal(err)
				}
				a = anchors(string(tb))
				cache[target] = a
			}
			if !a[frag] {
				t.Errorf("%s: link %s: %s has no heading with that anchor", rel, u, filepath.Base(target))
			}
		}
	}
}
