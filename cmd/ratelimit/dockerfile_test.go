package main

import (
	"os"
	"strings"
	"testing"
)

// dockerfile is the image's build file, from the repository root.
const dockerfile = "../../Dockerfile"

// instructions returns the Dockerfile's instructions, continuation lines
// joined and comments dropped, as (keyword, arguments) pairs.
func instructions(t *testing.T, text string) [][2]string {
	t.Helper()
	var out [][2]string
	var cur strings.Builder
	for line := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if more, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(strings.TrimSpace(more) + " ")
			continue
		}
		cur.WriteString(trimmed)
		kw, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, [2]string{strings.ToUpper(kw), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// TestImageKeepsDebugListenerPrivate: the image must not publish the debug
// listener (pprof, /rlconfig, /stats): no DEBUG_HOST other than loopback,
// no EXPOSE of DEBUG_PORT. The README promises it is not published by
// default.
func TestImageKeepsDebugListenerPrivate(t *testing.T) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	debugPort := "6070"
	env := map[string]string{}
	var exposed []string
	for _, in := range instructions(t, string(b)) {
		switch in[0] {
		case "ENV":
			// ENV k=v k2="v 2" ..., or the legacy ENV k v.
			if !strings.Contains(strings.Fields(in[1])[0], "=") {
				k, v, _ := strings.Cut(in[1], " ")
				env[k] = strings.TrimSpace(v)
				continue
			}
			for _, kv := range strings.Fields(in[1]) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = strings.Trim(v, `"'`)
			}
		case "EXPOSE":
			for _, p := range strings.Fields(in[1]) {
				port, _, _ := strings.Cut(p, "/")
				exposed = append(exposed, port)
			}
		}
	}
	if p, ok := env["DEBUG_PORT"]; ok {
		debugPort = p
	}
	if h, ok := env["DEBUG_HOST"]; ok && h != "127.0.0.1" && h != "localhost" && h != "::1" {
		t.Errorf("Dockerfile sets DEBUG_HOST=%s: the debug listener (pprof, /rlconfig) would listen on every interface", h)
	}
	for _, p := range exposed {
		if p == debugPort {
			t.Errorf("Dockerfile exposes the debug port %s", p)
		}
	}
	if len(exposed) == 0 {
		t.Error("Dockerfile exposes no port; the parser probably missed its EXPOSE")
	}
}

func TestInstructionsParse(t *testing.T) {
	got := instructions(t, "# c\nENV A=1 \\\n    B=2\n\nexpose 8080 6070/tcp\n")
	want := [][2]string{{"ENV", "A=1 B=2"}, {"EXPOSE", "8080 6070/tcp"}}
	if len(got) != len(want) {
		t.Fatalf("instructions = %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("instruction %d = %q, want %q", i, got[i], want[i])
		}
	}
}
