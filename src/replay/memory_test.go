package replay_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/capture"
	"github.com/ratelimitd/ratelimit/src/replay"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// writeHostile writes a hostile capture of about size bytes to a file and
// returns its path: lines of 16 descriptors of 4 KB values, every value a
// new key, half of them "user", half "addr"; between them short lines of
// a new domain each, refused in the capture; now and then a line of
// 2 MiB; and every line out of time order with the one before by up to
// twice the step between them.
func writeHostile(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hostile.ndjson")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	w.WriteString(`{"capture":1,"ns":1,"values":"plain","seconds":3600,"requests":10000000}` + "\n")
	rng := rand.New(rand.NewPCG(uint64(size), 1))
	start := time.Unix(1_764_246_000, 0)
	n, keys, domains := 0, 0, 0
	line := func(r *capture.Request) {
		n++
		r.Time = start.Add(time.Duration(n)*time.Millisecond - time.Duration(rng.IntN(2000))*time.Microsecond)
		if len(r.Codes) != len(r.Descriptors) {
			r.Codes = make([]bool, len(r.Descriptors))
		}
		w.Write(capture.AppendRequest(nil, r, nil))
	}
	pad := strings.Repeat("v", 4000)
	for written := 0; written < size; written += 16 * len(pad) {
		r := capture.Request{Domain: "web"}
		for i := range 16 {
			keys++
			r.Descriptors = append(r.Descriptors, capture.Descriptor{Entries: []rules.Entry{{Key: []string{"user", "addr"}[i%2], Value: fmt.Sprint(pad, keys)}}})
		}
		line(&r)
		for range 70 {
			domains++
			line(&capture.Request{Domain: fmt.Sprint("d", domains), OverLimit: true, Codes: []bool{true},
				Descriptors: []capture.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}}}})
		}
		if keys%(16*8) == 0 {
			n++
			fmt.Fprintf(w, `{"ns":%d,"domain":"%s"}`+"\n", n, strings.Repeat("x", 2<<20))
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return path
}

// watchLive returns a function that stops the watch and returns the
// largest live heap a collection found since, as measured at the end of
// every collection.
func watchLive() (stop func() uint64) {
	var peak atomic.Uint64
	var done atomic.Bool
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var arm func()
	arm = func() {
		runtime.AddCleanup(new([64]byte), func(struct{}) {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			if !done.Load() {
				arm()
			}
		}, struct{}{})
	}
	arm()
	return func() uint64 {
		done.Store(true)
		return peak.Load()
	}
}

// TestReplayMemoryIsBounded: a hostile capture (long lines, every key
// new, more domains than MaxDomainRows, lines too long to read, every line
// out of order), replayed against rules that refuse every user and keep
// every address, holds no more than Config.MemoryBound, and as much for a
// capture four times as large: the bound is in bytes, whatever the
// capture holds. The bounds are small, so that both captures pass them
// all. Not parallel: it measures the process's heap.
func TestReplayMemoryIsBounded(t *testing.T) {
	c := parse(t, "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 0}\n"+
		"  - key: addr\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	cfg := replay.Config{New: c, NewName: "hostile", MemoryMaxBytes: 1 << 20, MaxKeyBytes: 512 << 10, ReorderBytes: 256 << 10}
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	peaks := map[int]uint64{}
	for _, size := range []int{1 << 20, 4 << 20} {
		path := writeHostile(t, size)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		rd, err := capture.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		var base []metrics.Sample = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(base)
		stop := watchLive()
		rep, err := replay.Run(t.Context(), rd, cfg)
		runtime.GC()
		peak := stop()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		peaks[size] = peak - min(peak, base[0].Value.Uint64())
		t.Logf("a capture of %d MiB: %d requests, peak live heap %.1f MiB over the %.1f MiB before (bound %.1f MiB)",
			size>>20, rep.Requests, float64(peaks[size])/(1<<20), float64(base[0].Value.Uint64())/(1<<20), float64(cfg.MemoryBound())/(1<<20))
		if rep.TooLong == 0 || len(rep.TooLongAt) == 0 || rep.Requests < int64(size/(64<<10))*71 {
			t.Errorf("replayed %d requests, %d lines too long at %v: want every request, and the long lines counted", rep.Requests, rep.TooLong, rep.TooLongAt)
		}
		var untracked int64
		others := false
		for _, r := range rep.Rules {
			untracked += r.RefusedUntracked
			others = others || r.ID == "(other domains) (no limit)" && r.Requests > 0
		}
		if untracked == 0 || !others {
			t.Errorf("refusals of keys not tracked: %d, a row of the other domains: %t; want both", untracked, others)
		}
	}
	small, large := peaks[1<<20], peaks[4<<20]
	if bound := uint64(cfg.MemoryBound()); large > bound {
		t.Errorf("the replay held %d bytes, over its bound of %d", large, bound)
	}
	if large > small+small/4+1<<20 {
		t.Errorf("the replay held %d bytes of a capture of 1 MiB, %d of one of 4 MiB: it grows with the capture", small, large)
	}
}
