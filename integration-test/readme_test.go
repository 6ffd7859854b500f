package integration

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The README's five-minute tour, run as a newcomer runs it: its shell
// commands, with curl, against the built service on a copy of config/,
// and what they print compared with what the README shows.

// tourStep is a command of the tour and the output the README shows for
// it ("" when it shows none).
type tourStep struct {
	cmd, want string
}

// readmeTour returns the commands of the README's tour section, in order:
// a line "$ cmd" (with its continuation lines) is followed by its output;
// a line without "$ " is a command of no shown output.
func readmeTour(t *testing.T) []tourStep {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	start := strings.Index(s, "## A five-minute tour")
	if start < 0 {
		t.Fatal("README.md has no section \"A five-minute tour\"")
	}
	s = s[start:]
	if end := strings.Index(s[2:], "\n## "); end >= 0 {
		s = s[:end+2]
	}
	var steps []tourStep
	inBlock, shown := false, false
	for line := range strings.Lines(s) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock, shown = !inBlock, false
		case !inBlock || line == "":
		case len(steps) > 0 && strings.HasSuffix(steps[len(steps)-1].cmd, `\`):
			steps[len(steps)-1].cmd += "\n" + line
		case strings.HasPrefix(line, "$ "):
			steps = append(steps, tourStep{cmd: strings.TrimPrefix(line, "$ ")})
			shown = true
		case shown:
			w := &steps[len(steps)-1].want
			*w = strings.TrimPrefix(*w+"\n"+line, "\n")
		default:
			steps = append(steps, tourStep{cmd: line})
		}
	}
	return steps
}

// TestReadmeTour runs the tour's 429 loop, its change of the limit and its
// metrics, and checks that each prints what the README shows: the loop a
// 429 after the rule's limit, whenever it runs (no window boundary may let
// it through), the loop after the change the new limit, the metrics the
// counts of both.
func TestReadmeTour(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README's tour uses curl: install it (apt-get install curl)")
	}
	rules, err := os.ReadFile("../config/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, map[string]string{"example.yaml": string(rules)})
	// The README's commands run in a folder holding config/, with the
	// service's addresses for the defaults it names.
	sh := func(cmd string) string {
		t.Helper()
		cmd = strings.NewReplacer("localhost:8080", p.http, "127.0.0.1:6070", p.debug).Replace(cmd)
		c := exec.Command("bash", "-c", cmd)
		c.Dir = p.root
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return strings.TrimSpace(string(out))
	}
	find := func(steps []tourStep, prefix string) tourStep {
		t.Helper()
		for _, s := range steps {
			if strings.HasPrefix(s.cmd, prefix) {
				return s
			}
		}
		t.Fatalf("the README's tour has no command %q...", prefix)
		return tourStep{}
	}
	steps := readmeTour(t)

	loop := find(steps, "for i in $(seq")
	if !strings.Contains(loop.want, "429") || !strings.HasPrefix(loop.want, "200") {
		t.Errorf("the README's loop shows %q: want 200s, then 429s", loop.want)
	}
	if got := sh(loop.cmd); got != loop.want {
		t.Errorf("the README's loop printed %q; the README shows %q", got, loop.want)
	}

	// The change of the limit, and the same loop for another address.
	sh(find(steps, "sed -i").cmd)
	eventually(t, "the changed rules in use", 30*time.Second, func() bool {
		_, body := getHost(t, "http://"+p.debug+"/rlconfig", "")
		return strings.Contains(body, "login.remote_address: unit=MINUTE requests_per_unit=2,")
	})
	m := regexp.MustCompile(`# then the same loop for (\S+): (.*)$`).FindStringSubmatch(find(steps, "sleep").cmd)
	if m == nil {
		t.Fatal(`the README's "sleep" line does not say "then the same loop for ADDRESS: OUTPUT"`)
	}
	if got := sh(strings.ReplaceAll(loop.cmd, "1.2.3.5", m[1])); got != m[2] {
		t.Errorf("the README's loop for %s printed %q after the change; the README shows %q", m[1], got, m[2])
	}
	if got := sh(strings.TrimSpace(strings.Split(find(steps, "curl -s 127.0.0.1:6070/rlconfig").cmd, "#")[0])); !strings.Contains(got, "requests_per_unit=2") {
		t.Errorf("the README's /rlconfig command printed %q; want the changed limit", got)
	}

	metrics := find(steps, "curl -s 127.0.0.1:6070/metrics")
	if got := sh(metrics.cmd); got != metrics.want {
		t.Errorf("the README's metrics command printed\n%s\nthe README shows\n%s", got, metrics.want)
	}
}
