// Package observability checks the Grafana dashboard and the Prometheus
// alerting rules of this folder against the series the built service
// exports, with Prometheus's own PromQL and rule-file parsers.
package observability

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/ratelimitd/ratelimit/harness"
)

const rulesYAML = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 100}
`

// exported is what the service exports: each series name (a histogram's
// _bucket, _sum and _count included) with its label names and values.
type exported map[string]map[string]map[string]bool

func (e exported) add(mfs map[string]*dto.MetricFamily) {
	for name, mf := range mfs {
		names := []string{name}
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{name, name + "_bucket", name + "_sum", name + "_count"}
		}
		for _, n := range names {
			if e[n] == nil {
				e[n] = map[string]map[string]bool{}
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if e[n][l.GetName()] == nil {
						e[n][l.GetName()] = map[string]bool{}
					}
					e[n][l.GetName()][l.GetValue()] = true
				}
			}
			if n == name+"_bucket" {
				e[n]["le"] = map[string]bool{}
			}
		}
	}
}

// TestDashboardAndAlertsUseExportedSeries starts the built service on
// Redis (with REDIS_PERSECOND) and on Memcached with USE_PROMETHEUS,
// sends /json traffic that moves every decision code, scrapes
// PROMETHEUS_ADDR, and checks that every PromQL expression of the
// dashboard and of the alerting rules parses and selects only series
// (and label names and values) that the service exports, and that the
// docs/OBSERVABILITY.md lists every series.
func TestDashboardAndAlertsUseExportedSeries(t *testing.T) {
	bin := build(t)
	redis := harness.StartRedis(t, harness.RedisOptions{})
	memcached := harness.StartMemcached(t)
	series := exported{}
	var families []string
	for _, env := range [][]string{
		{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr,
			"REDIS_PERSECOND=true", "REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_PERSECOND_URL=" + redis.Addr},
		// Written behind (its statistics), with Memcached as the store.
		{"BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + memcached.Addr, "WRITE_BEHIND_INTERVAL=20ms"},
		{"BACKEND_TYPE=memory"},
	} {
		mfs := run(t, bin, env)
		series.add(mfs)
		for name := range mfs {
			families = append(families, name)
		}
	}

	p := parser.NewParser(parser.Options{})
	t.Run("dashboard", func(t *testing.T) {
		exprs := dashboardExprs(t, "grafana-dashboard.json")
		if len(exprs) < 10 {
			t.Fatalf("%d expressions in the dashboard, want its panels' and variables'", len(exprs))
		}
		for _, e := range exprs {
			checkExpr(t, p, series, e)
		}
	})
	t.Run("alerts", func(t *testing.T) {
		groups, errs := rulefmt.ParseFile("alerts.yaml", false, model.UTF8Validation, p, nil)
		if len(errs) > 0 {
			t.Fatalf("alerts.yaml: %v", errs)
		}
		n := 0
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				n++
				if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("rule %q: want an alert with a severity, a summary and a description", r.Alert)
				}
				checkExpr(t, p, series, r.Expr)
			}
		}
		if n < 5 {
			t.Errorf("%d alerts, want at least 5", n)
		}
	})
	t.Run("readme", func(t *testing.T) {
		b, err := os.ReadFile("../../docs/OBSERVABILITY.md")
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(families)
		for _, name := range slices.Compact(families) {
			if !strings.Contains(string(b), "`"+name+"`") {
				t.Errorf("docs/OBSERVABILITY.md does not list `%s`", name)
			}
		}
	})
}

// build builds the service (without -race: this package runs without it)
// into a temporary folder.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ratelimit")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/ratelimitd/ratelimit/cmd/ratelimit").CombinedOutput()
	if err != nil {
		t.Fatalf("building the service: %v\n%s", err, out)
	}
	return bin
}

// run starts the service with env, sends traffic and returns the scrape.
func run(t *testing.T, bin string, env []string) map[string]*dto.MetricFamily {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "web.yaml"), []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	// Every listener on port 0: the "serving" line says what it bound.
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "RUNTIME_ROOT="+root, "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0", "USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
		"LOCAL_CACHE_SIZE_IN_BYTES=1048576", "REQUEST_TIMEOUT=2s")
	cmd.Env = append(cmd.Env, env...)
	stderr := &harness.Log{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("service %v stderr:\n%s", env, stderr.String())
		}
	})

	var at harness.Serving
	harness.WaitForNil(t, 30*time.Second, fmt.Sprintf("the service (%v) says where it listens", env), func() error {
		var ok bool
		if at, ok = harness.ParseServing(stderr.String()); !ok {
			return errors.New("no serving line yet")
		}
		return nil
	})
	base := "http://" + at.HTTP
	harness.WaitForNil(t, 30*time.Second, fmt.Sprintf("the service (%v) healthy", env), func() error {
		resp, err := http.Get(base + "/healthcheck")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthcheck: %s", resp.Status)
		}
		return nil
	})
	post := func(body string, want int) {
		t.Helper()
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != want {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("/json %s = %d %s, want %d", body, resp.StatusCode, b, want)
		}
	}
	alice := `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`
	post(alice, http.StatusOK)
	post(alice, http.StatusOK)
	post(alice, http.StatusTooManyRequests) // over: remembered by the near cache
	post(alice, http.StatusTooManyRequests) // answered from it
	post(`{"domain":"web","descriptors":[{"entries":[{"key":"path","value":"/a"},{"key":"method","value":"GET"}]}]}`, http.StatusOK)
	post(`{"domain":"elsewhere","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`, http.StatusOK)
	post(`{"domain":"web","descriptors":[]}`, http.StatusBadRequest)

	resp, err := http.Get("http://" + at.Prometheus + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := tp.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	return mfs
}

// grafanaVars replaces Grafana's variables by values PromQL accepts.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$job", ".*", "$domain", ".*")

// labelValues is Grafana's label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)

// dashboardExprs returns every PromQL expression of the dashboard: each
// "expr" of its panels' targets and the selector of each label_values
// variable query, Grafana's variables replaced.
func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(c, k)
			}
		case []any:
			for _, c := range v {
				walk(c, key)
			}
		case string:
			switch {
			case key == "expr":
				out = append(out, grafanaVars.Replace(v))
			case key == "query" || key == "definition":
				if m := labelValues.FindStringSubmatch(v); m != nil {
					out = append(out, m[1])
				}
			}
		}
	}
	walk(doc, "")
	return out
}

// checkExpr parses e and checks each series it selects: a name the
// service exports, label names it has, and values it has for equality
// matchers.
func checkExpr(t *testing.T, p parser.Parser, series exported, e string) {
	t.Helper()
	expr, err := p.ParseExpr(e)
	if err != nil {
		t.Errorf("%q does not parse: %v", e, err)
		return
	}
	selectors := 0
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		if vs.Name == "" {
			t.Errorf("%q: a selector without a metric name", e)
			return nil
		}
		ls, ok := series[vs.Name]
		if !ok {
			t.Errorf("%q: %s is not exported", e, vs.Name)
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel || m.Name == "job" || m.Name == "instance" {
				continue // the name, and the labels Prometheus adds
			}
			values, ok := ls[m.Name]
			if !ok {
				t.Errorf("%q: %s has no label %s", e, vs.Name, m.Name)
				continue
			}
			if m.Type == labels.MatchEqual && !values[m.Value] {
				t.Errorf("%q: %s{%s} has no value %q", e, vs.Name, m.Name, m.Value)
			}
		}
		return nil
	})
	if selectors == 0 {
		t.Errorf("%q selects no series", e)
	}
	// by (...) and on (...) name labels that must exist too.
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if a, ok := node.(*parser.AggregateExpr); ok && !a.Without {
			for _, g := range a.Grouping {
				if g == "job" || g == "instance" {
					continue
				}
				found := false
				parser.Inspect(a.Expr, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok {
						if _, ok := series[vs.Name][g]; ok {
							found = true
						}
					}
					return nil
				})
				if !found {
					t.Errorf("%q: by (%s): no series under it has that label", e, g)
				}
			}
		}
		return nil
	})
}
