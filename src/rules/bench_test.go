package rules

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// benchTree builds a realistic edge-proxy domain: per-IP limits with a
// thousand explicit overrides, two hundred exact paths and twenty
// wildcard prefixes, twenty value_regex prefixes of the same shape (so
// that the two compare), and two nested families.
func benchTree(tb testing.TB) *Config {
	tb.Helper()
	var b strings.Builder
	b.WriteString("domain: edge\ndescriptors:\n")
	b.WriteString("  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&b, "  - key: remote_address\n    value: 10.0.%d.%d\n    rate_limit: {unit: second, requests_per_unit: %d}\n", i/256, i%256, 100+i)
	}
	b.WriteString("  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 600}\n")
	for i := 0; i < 200; i++ {
		fmt.Fprintf(&b, "  - key: path\n    value: /api/v1/resource%d\n    rate_limit: {unit: minute, requests_per_unit: 60}\n", i)
	}
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&b, "  - key: path\n    value: /static/bundle%d/*\n    rate_limit: {unit: minute, requests_per_unit: 6000}\n", i)
	}
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&b, "  - key: path\n    value_regex: /assets/bundle%d/.*\n    rate_limit: {unit: minute, requests_per_unit: 6000}\n", i)
	}
	b.WriteString(`  - key: generic_key
    value: per_minute
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: tenant
    value: "*"
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window}
`)
	cfg, err := Parse([]File{{Name: "edge.yaml", Data: []byte(b.String())}}, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// benchRequests returns n descriptors of one kind, all distinct.
func benchRequests(kind string, n int) [][]Entry {
	out := make([][]Entry, n)
	for i := range out {
		switch kind {
		case "exact": // an explicit IP override
			j := i % 1000
			out[i] = []Entry{{"remote_address", fmt.Sprintf("10.0.%d.%d", j/256, j%256)}}
		case "default": // any other IP: the bare key
			out[i] = []Entry{{"remote_address", fmt.Sprintf("192.168.%d.%d", i/256%256, i%256)}}
		case "wildcard": // a path under a wildcard prefix
			out[i] = []Entry{{"path", fmt.Sprintf("/static/bundle%d/app.%d.js", i%20, i)}}
		case "regex": // a path under a value_regex prefix, after the wildcards
			out[i] = []Entry{{"path", fmt.Sprintf("/assets/bundle%d/app.%d.js", i%20, i)}}
		case "nested": // two levels
			out[i] = []Entry{{"generic_key", "per_minute"}, {"remote_address", fmt.Sprintf("172.16.%d.%d", i/256%256, i%256)}}
		case "miss": // an unknown key
			out[i] = []Entry{{"user_agent", fmt.Sprintf("agent-%d", i)}}
		}
	}
	return out
}

var benchSink atomic.Pointer[Limit]

func BenchmarkMatch(b *testing.B) {
	cfg := benchTree(b)
	if got := len(cfg.Limits()); got != 1+1000+1+200+20+20+2 {
		b.Fatalf("tree has %d rules, want 1244", got)
	}
	kinds := []string{"exact", "default", "wildcard", "regex", "nested", "miss"}
	const n = 10000
	var mixed [][]Entry
	for _, kind := range kinds {
		reqs := benchRequests(kind, n)
		// Check the requests really reach the rules they are meant to, so
		// the benchmark does not measure one key or one miss by accident.
		keys := map[string]bool{}
		for _, r := range reqs {
			if m := cfg.Match("edge", r); m.Limit != nil {
				keys[m.Limit.FullKey] = true
			}
		}
		want := map[string]int{"exact": 1000, "default": 1, "wildcard": 20, "regex": 20, "nested": 1, "miss": 0}[kind]
		if len(keys) != want {
			b.Fatalf("%s requests reach %d rules, want %d", kind, len(keys), want)
		}
		mixed = append(mixed, reqs[:n/len(kinds)]...)

		b.Run(kind, func(b *testing.B) {
			b.ReportAllocs()
			var last *Limit
			i := 0
			for b.Loop() {
				last = cfg.Match("edge", reqs[i%n]).Limit
				i++
			}
			benchSink.Store(last)
		})
	}
	b.Run("mixed-parallel", func(b *testing.B) {
		b.ReportAllocs()
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seed.Add(7919))
			var last *Limit
			for pb.Next() {
				last = cfg.Match("edge", mixed[i%len(mixed)]).Limit
				i++
			}
			benchSink.Store(last)
		})
	})
}

func BenchmarkParse(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("domain: edge\ndescriptors:\n")
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&sb, "  - key: remote_address\n    value: 10.0.%d.%d\n    rate_limit: {unit: second, requests_per_unit: 10}\n", i/256, i%256)
	}
	data := []byte(sb.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse([]File{{Name: "edge.yaml", Data: data}}, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRulesMemory reports the heap a loaded rule set holds, per rule
// (one domain of many key-only rules) and per domain (many domains of one
// rule each, as an xDS snapshot of Envoy Gateway's holds): the figures of
// the README's "Memory per rule".
func BenchmarkRulesMemory(b *testing.B) {
	for _, tt := range []struct {
		name    string
		domains int
		rules   int
	}{
		{"rules_in_one_domain", 1, 10000},
		{"domains_of_one_rule", 10000, 1},
	} {
		b.Run(tt.name, func(b *testing.B) {
			var files []File
			for d := range tt.domains {
				var y strings.Builder
				fmt.Fprintf(&y, "domain: domain-%05d\ndescriptors:\n", d)
				for r := range tt.rules {
					fmt.Fprintf(&y, "  - key: key_%05d\n    value: value_%05d\n    rate_limit: {unit: minute, requests_per_unit: 100}\n", r, r)
				}
				files = append(files, File{Name: fmt.Sprintf("f%05d.yaml", d), Data: []byte(y.String())})
			}
			heap := func() uint64 {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc
			}
			var per float64
			for range b.N {
				before := heap()
				cfg, err := Parse(files, Options{})
				if err != nil {
					b.Fatal(err)
				}
				after := heap()
				runtime.KeepAlive(cfg)
				per = float64(after-before) / float64(tt.domains*tt.rules)
			}
			b.ReportMetric(per, "heap-B/rule")
		})
	}
}
