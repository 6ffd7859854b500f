package memory

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// checkStore verifies the bookkeeping of every shard against its maps: the
// order slice and positions, the classes, the records, and the totals
// recomputed from the entries and records.
func checkStore(t *testing.T, s *Store) {
	t.Helper()
	var keys, records, bytes int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if len(sh.order) != len(sh.m) || sh.under < 0 || sh.under > len(sh.order) {
			t.Errorf("shard %d: %d keys, %d in order, %d under", i, len(sh.m), len(sh.order), sh.under)
		}
		for j, e := range sh.order {
			if int(e.pos) != j || sh.m[e.key] != e || e.pinned {
				t.Errorf("shard %d: order[%d] = %q at pos %d, in map %v, pinned %v", i, j, e.key, e.pos, sh.m[e.key] == e, e.pinned)
			}
			bytes += e.bytes()
		}
		for h, r := range sh.rec {
			if r.idle < sh.recIdle || h&s.mask != uint64(i) {
				t.Errorf("shard %d: record %x idle at %d, before the shard's recIdle %d, or of another shard", i, h, r.idle, sh.recIdle)
			}
		}
		keys += int64(len(sh.m) + len(sh.rec))
		records += int64(len(sh.rec))
		bytes += int64(sh.peak)*slotBytes + int64(sh.recPeak)*recordBytes
		sh.mu.Unlock()
	}
	s.fmu.RLock()
	var filters int64
	for id, f := range s.filters {
		n := int64(filterBytes)
		for _, g := range f.groups {
			n += groupBytes
			if len(g.blooms) == 0 {
				t.Errorf("rule %x: a group without a filter", id)
			}
			for _, b := range g.blooms {
				n += b.cost()
				if blocks := len(b.words) / blockWords; blocks == 0 || blocks&(blocks-1) != 0 {
					t.Errorf("rule %x: a filter of %d words, not a power of two of blocks", id, len(b.words))
				}
			}
		}
		if n != f.bytes {
			t.Errorf("rule %x: its filter says %d bytes, its groups add up to %d", id, f.bytes, n)
		}
		filters += n
	}
	if filters != s.filterBytes || int(s.nfilters.Load()) != len(s.filters) {
		t.Errorf("filters: %d bytes, %d of them; they add up to %d, %d", s.filterBytes, s.nfilters.Load(), filters, len(s.filters))
	}
	s.fmu.RUnlock()
	bytes += filters
	if keys != s.keys.Load() || records != s.records.Load() || bytes != s.Bytes() {
		t.Errorf("totals: Len %d, Records %d, Bytes %d; the shards add up to %d keys, %d records, %d bytes",
			s.Len(), s.Records(), s.Bytes(), keys, records, bytes)
	}
}

// TestEntrySize keeps entryBytes and logBytes the size classes of what they
// account: 65..80 bytes take 80, 33..48 take 48.
func TestEntrySize(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(entry{}); n <= 64 || n > entryBytes {
		t.Errorf("unsafe.Sizeof(entry{}) = %d, want 65..%d (or change entryBytes)", n, entryBytes)
	}
	if n := unsafe.Sizeof(limiter.SlidingLogState{}); n <= 32 || n > logBytes {
		t.Errorf("unsafe.Sizeof(limiter.SlidingLogState{}) = %d, want 33..%d (or change logBytes)", n, logBytes)
	}
}

// floodOp is the i-th op of a flood of new keys: every algorithm, keys of
// 20 to 4,100 bytes, one hit within a limit of 10.
func floodOp(i int, rng *rand.Rand) limiter.Op {
	a := rules.Algorithms[i%len(rules.Algorithms)]
	pad := strings.Repeat("v", rng.IntN(20)*rng.IntN(20)*10)
	return op(a, fmt.Sprintf("flood_%08d_%s", i, pad), 10, time.Hour, 1)
}

// TestFloodAtCeilingNeverFails floods a small store with new keys, single
// and in AllOrNothing batches, and requires every op to succeed and Bytes
// to stay within the ceiling plus one entry per shard.
func TestFloodAtCeilingNeverFails(t *testing.T) {
	t.Parallel()
	const maxBytes, shards = 256 << 10, 16
	s := newStore(t, Config{MaxBytes: maxBytes, MaxKeys: 1000, Shards: shards, SweepInterval: -1})
	rng := rand.New(rand.NewPCG(1, 2))
	now := base
	var largest int64
	for i := 0; i < 20_000; i += 3 {
		now = now.Add(time.Millisecond)
		ops := []limiter.Op{floodOp(i, rng), floodOp(i+1, rng), floodOp(i+2, rng)}
		b := &limiter.Batch{Now: now, Ops: ops, AllOrNothing: i%2 == 0}
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatalf("op %d at the ceiling: %v", i, err)
		}
		for _, o := range ops {
			largest = max(largest, allocBytes(len(o.Key))+entryBytes+logBytes+ringBytes(10)+slotBytes)
		}
		// A shard with nothing to evict but this batch's keys takes them anyway.
		if got, bound := s.Bytes(), maxBytes+shards*largest+3*largest; got > bound {
			t.Fatalf("after op %d: Bytes = %d, above %d", i, got, bound)
		}
		if got := s.Len(); got > 1000+shards+3 {
			t.Fatalf("after op %d: Len = %d, above MaxKeys 1000 plus a key a shard", i, got)
		}
	}
	ev := s.Evictions()
	if ev.UnderLimit == 0 || ev.Compacted != 0 || ev.Folded != 0 {
		t.Errorf("Evictions = %+v, want keys under their limit evicted, none compacted or folded", ev)
	}
	t.Logf("%d keys, %d bytes; %+v", s.Len(), s.Bytes(), ev)
	checkStore(t, s)
}

// TestBytesNeverPassCeiling: with one shard the ceiling holds after every
// op, sliding logs' rings growing included.
func TestBytesNeverPassCeiling(t *testing.T) {
	t.Parallel()
	const maxBytes = 64 << 10
	s := newStore(t, Config{MaxBytes: maxBytes, Shards: 1, SweepInterval: -1})
	rng := rand.New(rand.NewPCG(3, 4))
	now := base
	for i := range 10_000 {
		now = now.Add(time.Millisecond)
		o := floodOp(i, rng)
		if i%3 == 0 { // a log that keeps growing its ring, up to 8 KiB
			o = op(rules.SlidingLog, fmt.Sprint("log", i%30), 1000, time.Hour, uint64(1+rng.IntN(20)))
		}
		if _, err := do(t, s, now, o); err != nil {
			t.Fatal(err)
		}
		if got := s.Bytes(); got > maxBytes {
			t.Fatalf("after op %d (%s, %d-byte key): Bytes = %d, above the ceiling %d", i, o.Algorithm, len(o.Key), got, maxBytes)
		}
	}
	checkStore(t, s)
}

// TestOverLimitKeysSurviveFlood fills a store with keys over their limit
// and keys under it, floods it with ten times its capacity in new keys,
// and requires every over-limit key to keep its count (an attacker cannot
// reset a spent key) while the under-limit keys went first.
func TestOverLimitKeysSurviveFlood(t *testing.T) {
	t.Parallel()
	const capacity, overKeys = 2000, 200
	key := func(kind string, i int) string { return fmt.Sprintf("%s_%08d", kind, i) }
	// Every key below costs the same, so each new key evicts exactly one.
	perKey := allocBytes(len(key("flood", 0))) + entryBytes + slotBytes
	s := newStore(t, Config{MaxBytes: capacity * perKey, Shards: 8, SweepInterval: -1})
	now := base
	tick := func() time.Time { now = now.Add(time.Millisecond); return now }
	// Over their limit: a fixed window refused (its hits recorded), or
	// the others with nothing left.
	overOp := func(i int) limiter.Op {
		switch i % 3 {
		case 0:
			return op(rules.FixedWindow, key("spent", i), 3, time.Hour, 4)
		case 1:
			return op(rules.SlidingWindow, key("spent", i), 3, time.Hour, 3)
		}
		return op(rules.TokenBucket, key("spent", i), 3, time.Hour, 3)
	}
	for i := range overKeys {
		if rs, _ := do(t, s, tick(), overOp(i)); rs[0].Remaining != 0 {
			t.Fatalf("%s: %+v, want it over its limit", overOp(i).Key, rs[0])
		}
	}
	for i := range capacity - overKeys {
		do(t, s, tick(), op(rules.FixedWindow, key("early", i), 3, time.Hour, 1))
	}
	if s.Len() != capacity || s.Evictions() != (Evictions{}) {
		t.Fatalf("filled: Len %d, %+v; want %d keys, none evicted", s.Len(), s.Evictions(), capacity)
	}
	for i := range 10 * capacity {
		if _, err := do(t, s, tick(), op(rules.FixedWindow, key("flood", i), 3, time.Hour, 1)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range overKeys {
		o := overOp(i)
		o.Hits = 0
		rs, _ := do(t, s, now, o)
		if rs[0].Before < 3 || rs[0].Remaining != 0 {
			t.Errorf("%s after the flood: %+v, want its spent count kept", o.Key, rs[0])
		}
	}
	if got, want := s.Evictions(), (Evictions{UnderLimit: 10 * capacity}); got != want {
		t.Errorf("Evictions = %+v, want %+v", got, want)
	}
	early := 0
	for i := range capacity - overKeys {
		if rs, _ := do(t, s, now, op(rules.FixedWindow, key("early", i), 3, time.Hour, 0)); rs[0].Before > 0 {
			early++
		}
	}
	// The least recently used go first: of the keys older than the flood,
	// hardly any is left.
	if early > (capacity-overKeys)/100 {
		t.Errorf("%d of the %d keys older than the flood survived it, want under 1%%", early, capacity-overKeys)
	}
	checkStore(t, s)
}

// TestCompactsOverLimitKeys: at the byte ceiling a key under its limit
// still goes before any over it, and keys over it then give up their entry
// for a record, the least recently used first, instead of being evicted.
func TestCompactsOverLimitKeys(t *testing.T) {
	t.Parallel()
	key := func(i int) string { return fmt.Sprintf("over_%02d_%0100d", i, i) }
	// Room for three keys and a record: one compaction makes room for a
	// fourth key.
	perKey := allocBytes(len(key(0))) + entryBytes + slotBytes
	s := newStore(t, Config{MaxBytes: 3*perKey + recordBytes, Shards: 1, SweepInterval: -1})
	at := func(sec int) time.Time { return base.Add(time.Duration(sec) * time.Second) }
	for i := range 2 {
		do(t, s, at(i), op(rules.FixedWindow, key(i), 1, time.Hour, 2))
	}
	do(t, s, at(2), op(rules.FixedWindow, "under", 5, time.Hour, 1))
	do(t, s, at(3), op(rules.FixedWindow, key(2), 1, time.Hour, 1)) // over: Remaining 0
	if got, want := s.Evictions(), (Evictions{UnderLimit: 1}); got != want {
		t.Errorf("Evictions = %+v, want %+v: the key under its limit evicted first", got, want)
	}
	do(t, s, at(4), op(rules.FixedWindow, key(3), 1, time.Hour, 1))
	if got, want := s.Evictions(), (Evictions{UnderLimit: 1, Compacted: 1}); got != want {
		t.Errorf("Evictions = %+v, want %+v: then over_00 compacted", got, want)
	}
	if s.Len() != 4 || s.Records() != 1 || s.shards[0].m[key(0)] != nil {
		t.Errorf("Len %d, Records %d; want 4 keys, over_00 a record", s.Len(), s.Records())
	}
	checkStore(t, s)
	for key, want := range map[string]uint64{key(0): 2, key(1): 2, key(2): 1, key(3): 1, "under": 0} {
		rs, err := do(t, s, at(5), op(rules.FixedWindow, key, 1, time.Hour, 0))
		if err != nil || rs[0].Before != want {
			t.Errorf("%s holds %d hits (%v), want %d", key, rs[0].Before, err, want)
		}
	}
	checkStore(t, s)
}

// TestKeyMovesBetweenClasses: a key over its limit that gets room again
// (a token bucket refilled) is under it again, and is evicted as such.
func TestKeyMovesBetweenClasses(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxKeys: 2, Shards: 1, SweepInterval: -1})
	do(t, s, base, op(rules.TokenBucket, "tb", 2, time.Minute, 2))                // over: no token left
	do(t, s, base.Add(time.Second), op(rules.FixedWindow, "fw", 1, time.Hour, 2)) // over: refused
	do(t, s, base.Add(40*time.Second), op(rules.TokenBucket, "tb", 2, time.Minute, 0))
	// tb has a token again: under its limit, so it goes first.
	do(t, s, base.Add(41*time.Second), op(rules.FixedWindow, "new", 5, time.Hour, 1))
	if got, want := s.Evictions(), (Evictions{UnderLimit: 1}); got != want {
		t.Errorf("Evictions = %+v, want %+v (tb under its limit again)", got, want)
	}
	if rs, _ := do(t, s, base.Add(42*time.Second), op(rules.FixedWindow, "fw", 1, time.Hour, 0)); rs[0].Before != 2 {
		t.Errorf("fw holds %d hits, want 2", rs[0].Before)
	}
	checkStore(t, s)
}

// TestConcurrentFloodAtCeiling floods a small store from several
// goroutines, single ops and AllOrNothing batches over shared keys, under
// -race: no error, consistent bookkeeping, the ceiling held.
func TestConcurrentFloodAtCeiling(t *testing.T) {
	t.Parallel()
	const maxBytes, shards = 128 << 10, 4
	s := newStore(t, Config{MaxBytes: maxBytes, Shards: shards, SweepInterval: -1})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			now := base
			for i := range 3000 {
				now = now.Add(time.Millisecond)
				ops := []limiter.Op{floodOp(g*1_000_000+i, rng), op(rules.SlidingLog, fmt.Sprint("shared", i%7), 100, time.Hour, 1)}
				b := &limiter.Batch{Now: now, Ops: ops, AllOrNothing: i%2 == 0}
				if err := s.Do(t.Context(), b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	checkStore(t, s)
	// Two ops that check the ceiling at once may both add their key: the
	// store passes it by at most the keys being added at the end.
	largest := allocBytes(len(floodOp(0, rand.New(rand.NewPCG(0, 0))).Key)+4000) + entryBytes + logBytes + ringBytes(100) + slotBytes
	if got, bound := s.Bytes(), maxBytes+(shards+8)*largest; got > bound {
		t.Errorf("Bytes = %d after the flood, above %d", got, bound)
	}
}

// TestAccountingCoversTheHeap calibrates the accounting: it fills a store
// without a ceiling and requires Bytes to cover the live heap the keys
// took, and to overstate it by at most half. Maps are measured just after
// they grew (60,000 keys: about 234 a shard, in maps of 512 slots) and
// fuller (100,000).
func TestAccountingCoversTheHeap(t *testing.T) {
	value := strings.Repeat("v", 4096)
	tests := []struct {
		name string
		n    int
		op   func(i int) limiter.Op
	}{
		{"small_keys_maps_just_grown", 60_000, func(i int) limiter.Op {
			return op(rules.FixedWindow, fmt.Sprintf("ratelimit_domain_remote_address_10.%d.%d.%d_1699920000", i>>16, i>>8&255, i&255), 100, time.Minute, 1)
		}},
		{"small_keys", 100_000, func(i int) limiter.Op {
			return op(rules.Algorithms[i%4], fmt.Sprintf("rl_d_user_%d_60_x", i), 100, time.Minute, 1)
		}},
		{"large_keys", 3_000, func(i int) limiter.Op {
			return op(rules.TokenBucket, fmt.Sprintf("rl_d_user_%s%d_60_token_bucket", value, i), 100, time.Minute, 1)
		}},
		{"sliding_logs", 3_000, func(i int) limiter.Op {
			// Three ops a key: rings of 100, 200, then 400 slots.
			return op(rules.SlidingLog, fmt.Sprintf("rl_d_user_%d_3600_sliding_log", i/3), 1000, time.Hour, 100)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Config{MaxBytes: -1, SweepInterval: -1})
			defer s.Close()
			b := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
			before := heap()
			for i := range tt.n {
				b.Ops[0] = tt.op(i)
				if err := s.Do(t.Context(), b); err != nil {
					t.Fatal(err)
				}
			}
			b.Ops[0] = limiter.Op{}
			real := int64(heap() - before)
			acc := s.Bytes()
			t.Logf("%d keys: %d B/key live, %d B/key accounted (%.2f×)",
				s.Len(), real/int64(s.Len()), acc/int64(s.Len()), float64(acc)/float64(real))
			if acc < real || float64(acc) > 1.5*float64(real) {
				t.Errorf("Bytes = %d for a live heap of %d, want 1 to 1.5 times it", acc, real)
			}
		})
	}
}

// TestHeapBoundedUnderLargeKeyFlood floods a 2 MiB store with 40 MiB of
// 4 KiB keys and requires the live heap to stay within the ceiling plus
// one key a shard.
func TestHeapBoundedUnderLargeKeyFlood(t *testing.T) {
	const maxBytes = 2 << 20
	s := New(Config{MaxBytes: maxBytes, SweepInterval: -1})
	defer s.Close()
	value := strings.Repeat("v", 4096)
	b := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
	before := heap()
	for i := range 10_000 {
		b.Ops[0] = op(rules.Algorithms[i%4], fmt.Sprintf("rl_d_user_%s%d", value, i), 100, time.Hour, 1)
		if err := s.Do(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	b.Ops[0] = limiter.Op{}
	grown := int64(heap() - before)
	perKey := allocBytes(4130) + entryBytes + logBytes + ringBytes(4) + slotBytes
	t.Logf("40 MiB of keys into a 2 MiB store: %d keys, %d bytes accounted, %d live", s.Len(), s.Bytes(), grown)
	if bound := maxBytes + int64(len(s.shards))*perKey; grown > bound {
		t.Errorf("the live heap grew by %d bytes, above %d", grown, bound)
	}
}

// TestDefaultCeilingHeap floods a store made with the zero Config with
// small keys, then large ones, each past DefaultMaxBytes, and requires the
// live heap to stay under it: the basis of the RSS bound in the README.
func TestDefaultCeilingHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 64 MiB")
	}
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	value := strings.Repeat("v", 4096)
	b := &limiter.Batch{Now: base, Ops: make([]limiter.Op, 1), Results: make([]limiter.Result, 1)}
	before := heap()
	for _, f := range []struct {
		n   int
		key func(i int) string
	}{
		{400_000, func(i int) string {
			return fmt.Sprintf("ratelimit_d_remote_address_10.%d.%d.%d_1699920000", i>>16, i>>8&255, i&255)
		}},
		{20_000, func(i int) string { return fmt.Sprintf("ratelimit_d_user_%s%d_1699920000", value, i) }},
	} {
		for i := range f.n {
			b.Ops[0] = op(rules.FixedWindow, f.key(i), 100, time.Hour, 1)
			if err := s.Do(t.Context(), b); err != nil {
				t.Fatal(err)
			}
		}
		b.Ops[0] = limiter.Op{}
		live := int64(heap() - before)
		t.Logf("%d keys, %d bytes accounted, %d live, %+v", s.Len(), s.Bytes(), live, s.Evictions())
		if s.Evictions().UnderLimit == 0 || live > DefaultMaxBytes {
			t.Errorf("live heap %d bytes (evictions %+v), want the ceiling reached and at most %d", live, s.Evictions(), DefaultMaxBytes)
		}
	}
}

// TestKeyIsCopied: the store keeps its own copy of a new key, not the
// caller's memory (limiter.Store: Do must not keep the batch's strings).
func TestKeyIsCopied(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{SweepInterval: -1})
	buf := []byte("rl_d_user_alice_60_token_bucket")
	do(t, s, base, op(rules.TokenBucket, unsafe.String(&buf[0], len(buf)), 5, time.Minute, 1))
	copy(buf, "XXXXXXXXXX")
	rs, _ := do(t, s, base, op(rules.TokenBucket, "rl_d_user_alice_60_token_bucket", 5, time.Minute, 0))
	if rs[0].Before != 1 {
		t.Errorf("after the caller reused its buffer the key holds %d hits, want 1", rs[0].Before)
	}
}

// TestSmallCeilingsTakeFewerShards: a small ceiling holds, since each
// shard has room for at least 16 keys (a shard with nothing to evict
// passes the ceiling by its new key).
func TestSmallCeilingsTakeFewerShards(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want int
	}{
		{"default", Config{}, 256},
		{"max_keys_4096", Config{MaxKeys: 4096}, 256},
		{"max_keys_100", Config{MaxKeys: 100}, 4},
		{"max_keys_1", Config{MaxKeys: 1}, 1},
		{"max_bytes_1MiB", Config{MaxBytes: 1 << 20}, 256},
		{"max_bytes_64KiB", Config{MaxBytes: 64 << 10}, 16},
		{"no_byte_ceiling", Config{MaxBytes: -1}, 256},
		{"explicit_shards_win", Config{MaxKeys: 1, Shards: 5}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.SweepInterval = -1
			if got := len(newStore(t, tt.cfg).shards); got != tt.want {
				t.Errorf("New(%+v): %d shards, want %d", tt.cfg, got, tt.want)
			}
		})
	}
	s := newStore(t, Config{MaxKeys: 100, SweepInterval: -1})
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 5000 {
		do(t, s, base, floodOp(i, rng))
		if s.Len() > 104 {
			t.Fatalf("after %d keys: Len = %d, want at most MaxKeys 100 plus a key a shard", i+1, s.Len())
		}
	}
}
