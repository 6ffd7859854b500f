package memcached

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// BenchmarkStoreFixedWindow measures one-op fixed-window requests from 64
// concurrent clients over 10,000 keys against a local memcached, as the
// Redis store's BenchmarkStore does, and reports the round trips per op and
// the CPU spent per op by this process (the callers and the store) and by
// memcached.
func BenchmarkStoreFixedWindow(b *testing.B) {
	benchStore(b, rules.FixedWindow, 1)
}

// BenchmarkStoreFixedWindow3 is the same load with three ops per batch, a
// request with three descriptors, whose ops run side by side.
func BenchmarkStoreFixedWindow3(b *testing.B) {
	benchStore(b, rules.FixedWindow, 3)
}

// BenchmarkStore runs the same load for every algorithm.
func BenchmarkStore(b *testing.B) {
	for _, alg := range rules.Algorithms {
		b.Run(alg.String(), func(b *testing.B) { benchStore(b, alg, 1) })
	}
}

func benchStore(b *testing.B, alg rules.Algorithm, perBatch int) {
	// A fresh server per run, so that its item count checks the key set.
	srv := harness.StartMemcached(b)
	s := newStore(b, Config{Addrs: []string{srv.Addr}})
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "bench_" + alg.String() + "_user_" + strconv.Itoa(i)
	}
	var next, sink atomic.Uint64
	cpu := srv.StartCPU(b.Context())
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		batch := &limiter.Batch{Ops: make([]limiter.Op, perBatch), Results: make([]limiter.Result, perBatch)}
		var admitted uint64
		for pb.Next() {
			batch.Now = time.Now()
			for i := range batch.Ops {
				batch.Ops[i] = limiter.Op{Key: names[next.Add(1)%keys], Algorithm: alg, Limit: 1 << 40, Window: 24 * time.Hour, Hits: 1}
			}
			if err := s.Do(context.Background(), batch); err != nil {
				b.Error(err)
				return
			}
			for i := range batch.Results {
				if batch.Results[i].Allowed {
					admitted++
				}
			}
		}
		sink.Add(admitted)
	})
	b.StopTimer()
	cpu.Report(b)
	rt, ops := s.Counters()
	if ops > 0 {
		b.ReportMetric(float64(rt)/float64(ops), "roundtrips/op")
	}
	if want := uint64(b.N * perBatch); sink.Load() != want {
		b.Errorf("%d of %d ops admitted", sink.Load(), want)
	}
	// The key set really was populated.
	if b.N*perBatch >= keys {
		stats, err := srv.Stats(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		if got := stats["curr_items"]; got != strconv.Itoa(keys) {
			b.Errorf("%s items in memcached, want %d", got, keys)
		}
	}
}

// BenchmarkLimiterCheckList compares one decision through the limiter on
// memcached, from 64 concurrent clients over 10,000 addresses, for a
// descriptor with one limit (rate_limit: a minute, one incr), a list of
// one (rate_limits, kept in the list's item: gets, then cas) and a list of
// two (a minute and an hour, in the same item: gets, then cas): the cost
// of a second limit per decision, in time, round trips and CPU (this
// process's and memcached's).
func BenchmarkLimiterCheckList(b *testing.B) {
	for _, tt := range []struct{ name, rule string }{
		{"one_limit", "    rate_limit: {unit: minute, requests_per_unit: 1000000}\n"},
		{"list_of_one", "    rate_limits:\n      - {unit: minute, requests_per_unit: 1000000}\n"},
		{"two_limits", "    rate_limits:\n      - {unit: minute, requests_per_unit: 1000000}\n      - {unit: hour, requests_per_unit: 1000000}\n"},
	} {
		b.Run(tt.name, func(b *testing.B) {
			cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(
				"domain: edge\ndescriptors:\n  - key: remote_address\n" + tt.rule)}}, rules.Options{})
			if err != nil {
				b.Fatal(err)
			}
			benchDecisions(b, cfg.Match("edge", []rules.Entry{{Key: "remote_address", Value: "x"}}).Limit)
		})
	}
}

// benchDecisions runs decisions of descriptor remote_address under lim
// over 10,000 addresses from 64 concurrent clients, each admitted, and
// checks that memcached holds one item per address.
func benchDecisions(b *testing.B, lim *rules.Limit) {
	srv := harness.StartMemcached(b)
	s := newStore(b, Config{Addrs: []string{srv.Addr}})
	l := limiter.New(s, limiter.Config{Prefix: "ratelimit_", NearLimitRatio: 0.8})
	const keys = 10_000
	values := make([]string, keys)
	for i := range values {
		values[i] = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	now := time.Now()
	var next, sink atomic.Uint64
	cpu := srv.StartCPU(b.Context())
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ds := []limiter.Descriptor{{Entries: []rules.Entry{{Key: "remote_address"}}, Limit: lim, Hits: 1}}
		if lim.InList() {
			ds[0].Each = make([]limiter.Status, len(lim.Limits))
		}
		out := make([]limiter.Status, 1)
		var ok uint64
		for pb.Next() {
			ds[0].Entries[0].Value = values[next.Add(1)%keys]
			if err := l.Check(context.Background(), "edge", now, ds, out); err != nil {
				b.Error(err)
				return
			}
			if out[0].Code == limiter.OK {
				ok++
			}
		}
		sink.Add(ok)
	})
	b.StopTimer()
	cpu.Report(b)
	if rt, ops := s.Counters(); ops > 0 {
		b.ReportMetric(float64(rt)/float64(b.N), "roundtrips/decision")
	}
	if sink.Load() != uint64(b.N) {
		b.Errorf("%d of %d decisions admitted", sink.Load(), b.N)
	}
	if b.N >= keys {
		stats, err := srv.Stats(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		if got := stats["curr_items"]; got != strconv.Itoa(keys) {
			b.Errorf("%s items in memcached, want %d (one per address)", got, keys)
		}
	}
}
