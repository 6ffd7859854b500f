package memory

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// sink keeps results alive so the compiler cannot drop the work.
var sink atomic.Uint64

const benchKeys = 10_000

// benchKey is a key as the limiter builds it for one client address.
func benchKey(a rules.Algorithm, i int) string {
	l := &rules.Limit{Unit: rules.Minute, UnitMultiplier: 1, Algorithm: a}
	return string(limiter.CacheKey(nil, "ratelimit_", "edge",
		[]rules.Entry{{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255)}}, l, base))
}

// benchStore runs single-op batches over benchKeys keys of algorithm a from
// parallel goroutines, each walking the keys from its own offset with its
// own clock (1 ms a step), 100 hits a minute a key.
func benchStore(b *testing.B, s *Store, a rules.Algorithm) {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = benchKey(a, i)
	}
	// Populate every key first, and check it is so: a benchmark of one
	// key by accident measures nothing useful.
	batch := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
	for _, k := range keys {
		batch.Ops[0] = limiter.Op{Key: k, Algorithm: a, Limit: 100, Window: time.Minute, Hits: 1}
		if err := s.Do(b.Context(), batch); err != nil {
			b.Fatal(err)
		}
	}
	if s.Len() != benchKeys {
		b.Fatalf("store holds %d keys, want %d", s.Len(), benchKeys)
	}
	var offset atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(offset.Add(7919)) // spread the goroutines over the keys
		batch := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
		op := &batch.Ops[0]
		*op = limiter.Op{Algorithm: a, Limit: 100, Window: time.Minute, Hits: 1}
		var allowed uint64
		for pb.Next() {
			i++
			op.Key = keys[i%benchKeys]
			batch.Now = batch.Now.Add(time.Millisecond)
			if err := s.Do(b.Context(), batch); err != nil {
				b.Fatal(err)
			}
			if batch.Results[0].Allowed {
				allowed++
			}
		}
		sink.Add(allowed)
	})
	b.StopTimer()
	if s.Len() != benchKeys {
		b.Fatalf("store holds %d keys after the run, want %d", s.Len(), benchKeys)
	}
}

func BenchmarkStore(b *testing.B) {
	for _, a := range rules.Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			s := New(Config{SweepInterval: -1})
			defer s.Close()
			benchStore(b, s, a)
		})
	}
}

// BenchmarkStoreShards justifies the sharding: one lock for every key
// against the default 256.
func BenchmarkStoreShards(b *testing.B) {
	for _, n := range []int{1, 256} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			s := New(Config{SweepInterval: -1, Shards: n})
			defer s.Close()
			benchStore(b, s, rules.FixedWindow)
		})
	}
}

// BenchmarkLimiterCheck is one decision of one descriptor, end to end on the
// memory store: key building, the batch, the store op and the status, over
// 10,000 client addresses within one window.
func BenchmarkLimiterCheck(b *testing.B) {
	for _, a := range rules.Algorithms {
		b.Run(a.String(), func(b *testing.B) {
			benchDecisions(b, &rules.Limit{RequestsPerUnit: 100, Unit: rules.Minute, UnitMultiplier: 1, Algorithm: a}, benchKeys)
		})
	}
}

// BenchmarkLimiterCheckList compares one decision on a descriptor with one
// limit (a second) and with two (a second and a minute, applied as one
// group), as BenchmarkLimiterCheck: the cost of a second limit per
// decision.
func BenchmarkLimiterCheckList(b *testing.B) {
	for _, tt := range []struct {
		name, limits string
		keys         int
	}{
		{"one_limit", "      - {unit: second, requests_per_unit: 100}\n", benchKeys},
		{"two_limits", "      - {unit: second, requests_per_unit: 100}\n      - {unit: minute, requests_per_unit: 1000}\n", 2 * benchKeys},
	} {
		b.Run(tt.name, func(b *testing.B) {
			cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(
				"domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limits:\n" + tt.limits)}}, rules.Options{})
			if err != nil {
				b.Fatal(err)
			}
			benchDecisions(b, cfg.Match("edge", []rules.Entry{{Key: "remote_address", Value: "x"}}).Limit, tt.keys)
		})
	}
}

// benchDecisions runs decisions of descriptor remote_address under lim
// over benchKeys addresses, in parallel, within one second; the store
// must hold keys keys before and after.
func benchDecisions(b *testing.B, lim *rules.Limit, keys int) {
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	l := limiter.New(s, limiter.Config{Prefix: "ratelimit_", NearLimitRatio: 0.8})
	values := make([]string, benchKeys)
	for i := range values {
		values[i] = fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255)
	}
	out := make([]limiter.Status, 1)
	for _, v := range values {
		ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "remote_address", Value: v}}, Limit: lim, Hits: 1}}
		if err := l.Check(b.Context(), "edge", base, ds, out); err != nil {
			b.Fatal(err)
		}
	}
	if s.Len() != keys {
		b.Fatalf("store holds %d keys, want %d", s.Len(), keys)
	}
	var offset atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(offset.Add(7919))
		ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "remote_address"}}, Limit: lim, Hits: 1}}
		if lim.InList() {
			ds[0].Each = make([]limiter.Status, len(lim.Limits))
		}
		out := make([]limiter.Status, 1)
		now := base
		var ok uint64
		for pb.Next() {
			i++
			ds[0].Entries[0].Value = values[i%benchKeys]
			now = now.Add(time.Nanosecond) // stay in the fixed windows
			if err := l.Check(b.Context(), "edge", now, ds, out); err != nil {
				b.Fatal(err)
			}
			if out[0].Code == limiter.OK {
				ok++
			}
		}
		sink.Add(ok)
	})
	b.StopTimer()
	if s.Len() != keys {
		b.Fatalf("store holds %d keys after the run, want %d", s.Len(), keys)
	}
}

// BenchmarkMillionKeys inserts 1,000,000 distinct fixed-window keys, lets
// their window end and sweeps, and reports the live heap per key before and
// after the sweep. Run it with -benchtime=1x: it measures memory, not time.
func BenchmarkMillionKeys(b *testing.B) {
	const keys = 1_000_000
	for b.Loop() {
		clk := &clock{now: base}
		s := New(Config{Now: clk.Now, SweepInterval: -1, MaxBytes: -1})
		start := heap()
		fill(b, s, keys)
		full := heap()
		clk.Set(base.Add(2 * time.Minute))
		if n := s.Sweep(); n != keys {
			b.Fatalf("Sweep removed %d keys, want %d", n, keys)
		}
		swept := heap()
		b.ReportMetric(float64(full-start)/keys, "B/key")
		b.ReportMetric(float64(max(swept, start)-start)/keys, "B/key-after-sweep")
		// Spans in use: what the runtime can hand to new keys or back to the OS.
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "MiB-inuse-after-sweep")
		s.Close()
	}
}
