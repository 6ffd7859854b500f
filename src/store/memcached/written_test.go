package memcached

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
)

func TestWritten(t *testing.T) {
	w := newWritten()
	if w.has("k", 100) {
		t.Fatal("an empty filter has k")
	}
	w.add("k", 110, 100)
	if !w.has("k", 109) {
		t.Error("k written until 110 is not found at 109")
	}
	if w.has("k", 110) {
		t.Error("k is found when its window has ended")
	}
	if w.has("other", 105) {
		t.Error("a key never written is found")
	}
}

// TestWrittenBounded fills the filter far past its size: it stays bounded,
// dropping expired entries first.
func TestWrittenBounded(t *testing.T) {
	w := newWritten()
	for i := range 10 * writtenShards * writtenPerShard {
		w.add(fmt.Sprint("old", i), 50, 10) // ends at 50
	}
	for i := range writtenShards * writtenPerShard / 2 {
		w.add(fmt.Sprint("new", i), 200, 100) // at 100 the old ones have expired
	}
	total := 0
	for i := range w.shards {
		if n := len(w.shards[i].until); n > writtenPerShard {
			t.Errorf("shard %d holds %d entries, more than %d", i, n, writtenPerShard)
		}
		total += len(w.shards[i].until)
	}
	if !w.has("new0", 150) {
		t.Error("a recent key was dropped while expired ones could go")
	}
	if total > writtenShards*writtenPerShard {
		t.Errorf("%d entries in all", total)
	}
}

// TestFirstHitsTakeOneRoundTrip: the first hit of a key this instance has
// not written goes to add (one round trip); later hits go to incr; a key
// another instance created costs this one a second round trip once, and
// the counts stay exact.
func TestFirstHitsTakeOneRoundTrip(t *testing.T) {
	srv := harness.StartMemcached(t)
	open := func() *Store {
		s, err := New(t.Context(), Config{Addrs: []string{srv.Addr}, MaxConns: 8})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if err := s.WaitStarted(t.Context()); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := open(), open()
	now := time.Now()
	const keys = 50
	hitAll := func(s *Store, wantAfter uint64) uint64 {
		t.Helper()
		rt0, _ := s.Counters()
		for i := range keys {
			batch := &limiter.Batch{Now: now, Ops: []limiter.Op{{Key: fmt.Sprintf("first_hit_%d", i), Limit: 100, Window: time.Hour, Hits: 1}}}
			if err := s.Do(t.Context(), batch); err != nil {
				t.Fatal(err)
			}
			if got := batch.Results[0].After; got != wantAfter {
				t.Fatalf("key %d: count %d, want %d", i, got, wantAfter)
			}
		}
		rt1, _ := s.Counters()
		return rt1 - rt0
	}
	if rt := hitAll(a, 1); rt != keys {
		t.Errorf("first hits on new keys: %d round trips, want %d (add first)", rt, keys)
	}
	if rt := hitAll(a, 2); rt != keys {
		t.Errorf("second hits: %d round trips, want %d (incr first)", rt, keys)
	}
	if rt := hitAll(b, 3); rt != 2*keys {
		t.Errorf("another instance's first hits on existing keys: %d round trips, want %d (add refused, then incr)", rt, 2*keys)
	}
	if rt := hitAll(b, 4); rt != keys {
		t.Errorf("its second hits: %d round trips, want %d", rt, keys)
	}
}
