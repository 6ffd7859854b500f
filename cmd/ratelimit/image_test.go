package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/src/settings"
)

// The facts users rely on about the image, checked from its Dockerfile
// since no Docker engine runs here.

// image is the Dockerfile's last stage: its instructions after the last FROM.
func image(t *testing.T) (base string, ins [][2]string) {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	all := instructions(t, string(b))
	for i, in := range all {
		if in[0] == "FROM" {
			base, ins = strings.Fields(in[1])[0], all[i+1:]
		}
	}
	if base == "" {
		t.Fatal("Dockerfile has no FROM")
	}
	return base, ins
}

// goBuild returns the arguments of the Dockerfile's `go build` and the
// environment assignments before it.
func goBuild(t *testing.T) (env, args []string) {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range instructions(t, string(b)) {
		if in[0] != "RUN" {
			continue
		}
		before, after, ok := strings.Cut(in[1], "go build ")
		if ok {
			return strings.Fields(before), shellWords(t, after)
		}
	}
	t.Fatal("Dockerfile runs no go build")
	return nil, nil
}

// shellWords splits a command line as sh does for the quoting the build
// lines use: double quotes group words, and nothing else is special.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quotes in %q", s)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// makeVar returns the value of the Makefile variable name (NAME = or ?=).
func makeVar(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^` + name + `\s*[?:]?=\s*(.*)$`)
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("Makefile has no %s", name)
	}
	return strings.TrimSpace(string(m[1]))
}

// TestImageBuildMatchesMakefile: the image's binary is built as `make
// build` builds it (the same flags, the version stamped the same way), and
// static.
func TestImageBuildMatchesMakefile(t *testing.T) {
	env, args := goBuild(t)
	var flags []string
	for _, a := range args {
		if a == "-o" || strings.HasPrefix(a, "./") || strings.HasPrefix(a, "/") {
			break
		}
		flags = append(flags, a)
	}
	// Each side names its version variable in its own syntax.
	docker := strings.ReplaceAll(strings.Join(flags, " "), "${VERSION}", "VERSION")
	makefile := strings.ReplaceAll(strings.Join(shellWords(t, makeVar(t, "BUILDFLAGS")), " "), "$(VERSION)", "VERSION")
	if docker != makefile {
		t.Errorf("Dockerfile builds with %q, the Makefile's BUILDFLAGS are %q", docker, makefile)
	}
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Errorf("Dockerfile's go build runs with %q: without CGO_ENABLED=0 the binary is not static and fails on distroless/static", env)
	}
	if !slices.Contains(args, "./cmd/ratelimit") {
		t.Errorf("Dockerfile's go build %q does not build ./cmd/ratelimit", args)
	}
	if !strings.Contains(makefile, "-X main.version=VERSION") {
		t.Errorf("BUILDFLAGS %q do not stamp main.version", makefile)
	}
}

// TestBuildFlagsStampVersion builds the command with the -X flag of the
// Makefile's BUILDFLAGS and runs -version: the flag names the variable that
// -version prints. Only -X is used: -trimpath and CGO_ENABLED=0 would
// rebuild every dependency, and they do not change what -X does.
func TestBuildFlagsStampVersion(t *testing.T) {
	m := regexp.MustCompile(`-X (\S+)=\$\(VERSION\)`).FindStringSubmatch(makeVar(t, "BUILDFLAGS"))
	if m == nil {
		t.Fatalf("BUILDFLAGS %q have no -X ...=$(VERSION)", makeVar(t, "BUILDFLAGS"))
	}
	bin := filepath.Join(t.TempDir(), "ratelimit")
	build := exec.Command("go", "build", "-ldflags", "-X "+m[1]+"=v0.0.0-stamp-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(out)), "ratelimit v0.0.0-stamp-test"; got != want {
		t.Errorf("-version of a binary built with -X %s = %q, want %q", m[1], got, want)
	}
}

// settingDefault is the default of the environment setting name.
func settingDefault(t *testing.T, name string) string {
	t.Helper()
	st := reflect.TypeFor[settings.Settings]()
	for i := range st.NumField() {
		if f := st.Field(i); f.Tag.Get("envconfig") == name {
			return f.Tag.Get("default")
		}
	}
	t.Fatalf("settings has no %s", name)
	return ""
}

// TestImageExposesDefaultPorts: EXPOSE lists the HTTP and gRPC ports the
// service listens on by default, and nothing else.
func TestImageExposesDefaultPorts(t *testing.T) {
	_, ins := image(t)
	var exposed []string
	for _, in := range ins {
		if in[0] == "EXPOSE" {
			for _, p := range strings.Fields(in[1]) {
				port, _, _ := strings.Cut(p, "/")
				exposed = append(exposed, port)
			}
		}
	}
	slices.Sort(exposed)
	want := []string{settingDefault(t, "PORT"), settingDefault(t, "GRPC_PORT")}
	slices.Sort(want)
	if !slices.Equal(exposed, want) {
		t.Errorf("Dockerfile exposes %v, want the default PORT and GRPC_PORT %v", exposed, want)
	}
}

// TestImageRunsWithoutShellAsNonRoot: a numeric non-root USER (Kubernetes'
// runAsNonRoot can only verify a number), a base image without a shell,
// and so exec-form ENTRYPOINT and HEALTHCHECK, the latter running the
// binary's own -healthcheck. The default rules are copied where the
// image's RUNTIME_* settings look for them.
func TestImageRunsWithoutShellAsNonRoot(t *testing.T) {
	base, ins := image(t)
	if !strings.HasPrefix(base, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s: want distroless/static (a static binary needs nothing else)", base)
	}
	got := map[string]string{}
	env := map[string]string{}
	var copies []string
	for _, in := range ins {
		switch in[0] {
		case "ENV":
			for _, kv := range strings.Fields(in[1]) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = strings.Trim(v, `"'`)
			}
		case "COPY":
			copies = append(copies, in[1])
		default:
			got[in[0]] = in[1]
		}
	}
	user, _, _ := strings.Cut(got["USER"], ":")
	if uid, err := strconv.Atoi(user); err != nil || uid == 0 {
		t.Errorf("USER %q: want a numeric uid other than 0", got["USER"])
	}
	if e := got["ENTRYPOINT"]; !strings.HasPrefix(e, `["/bin/ratelimit"`) {
		t.Errorf("ENTRYPOINT %s: want the exec form of /bin/ratelimit (there is no shell)", e)
	}
	hc := got["HEALTHCHECK"]
	_, cmd, _ := strings.Cut(hc, "CMD ")
	if cmd != `["/bin/ratelimit", "-healthcheck"]` {
		t.Errorf("HEALTHCHECK %q: want CMD [\"/bin/ratelimit\", \"-healthcheck\"] (exec form: there is no shell)", hc)
	}
	rulesDir := filepath.Join(env["RUNTIME_ROOT"], env["RUNTIME_SUBDIRECTORY"], settingDefault(t, "RUNTIME_APPDIRECTORY"))
	if !slices.ContainsFunc(copies, func(c string) bool {
		f := strings.Fields(c)
		return len(f) == 2 && f[0] == "config/" && filepath.Clean(f[1]) == rulesDir
	}) {
		t.Errorf("no COPY config/ %s/: the image's RUNTIME_* settings read the rules there (COPYs: %q)", rulesDir, copies)
	}
}
