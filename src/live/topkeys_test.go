package live

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

var epoch = time.Unix(1_699_999_980, 0)

func testLimit(rpu uint32) *rules.Limit {
	return &rules.Limit{FullKey: "d.k", Domain: "d", Source: "t.yaml:1", RequestsPerUnit: rpu, Unit: rules.Minute, UnitMultiplier: 1}
}

// put records one decision of key (one entry "k"=key) with used of 10.
func put(k *sketch, rule *ruleInfo, lim *rules.Limit, key string, used uint64, now time.Time) {
	entries := []rules.Entry{{Key: "k", Value: key}}
	o := observation{
		domain: lim.Domain, rule: rule, limit: lim, entries: entries,
		used: used, cap: uint64(lim.Capacity()), over: used >= uint64(lim.Capacity()),
		resetAt: now.Add(time.Minute).UnixNano(), now: now.UnixNano(), weight: countScale,
	}
	k.observe(k.hashKey(lim.Domain, rule, lim, entries), &o)
}

// checkShard verifies a shard's invariants: every slot indexed and found,
// the heap ordered, heap positions right, nothing indexed twice.
func checkShard(t *testing.T, sh *shard) {
	t.Helper()
	indexed := 0
	for _, v := range sh.index {
		if v.slot != 0 {
			indexed++
		}
	}
	if indexed != len(sh.slots) || len(sh.heap) != len(sh.slots) {
		t.Fatalf("%d indexed, %d in heap, %d slots", indexed, len(sh.heap), len(sh.slots))
	}
	for i := range sh.slots {
		if got := sh.find(sh.slots[i].hash); got != int32(i) {
			t.Fatalf("find(slot %d) = %d", i, got)
		}
		if p := sh.pos[i]; sh.heap[p].slot != int32(i) {
			t.Fatalf("slot %d: heapPos %d holds %d", i, p, sh.heap[p].slot)
		}
	}
	for j := 1; j < len(sh.heap); j++ {
		if sh.less(j, (j-1)/2) {
			t.Fatalf("heap out of order at %d", j)
		}
	}
}

func TestSketchIndexAndHeapStayConsistent(t *testing.T) {
	k := newSketch(64) // one shard of 64 slots: many replacements
	if len(k.shards) != 1 {
		t.Fatalf("%d shards, want 1", len(k.shards))
	}
	lim := testLimit(10)
	rule := &ruleInfo{id: "d.k", hash: 1}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		// A skewed stream: small numbers often, large ones rarely.
		key := fmt.Sprint(rng.IntN(1 + rng.IntN(500)))
		put(k, rule, lim, key, uint64(rng.IntN(11)), epoch)
		if i%997 == 0 {
			k.tick(epoch)
			checkShard(t, &k.shards[0])
		}
	}
	checkShard(t, &k.shards[0])
	if n := k.len(); n != 64 {
		t.Fatalf("len = %d, want 64", n)
	}
}

// TestSketchKeepsHeavyHitter checks Space-Saving's promise: a key seen more
// often than the table's smallest count is held, whatever the number of
// other keys.
func TestSketchKeepsHeavyHitter(t *testing.T) {
	k := newSketch(128)
	lim := testLimit(10)
	rule := &ruleInfo{id: "d.k", hash: 1}
	for i := range 100_000 {
		put(k, rule, lim, fmt.Sprint("noise-", i), 9, epoch)
		if i%20 == 0 {
			put(k, rule, lim, "heavy", 10, epoch)
		}
	}
	top := k.top(3, epoch)["d"]
	if len(top) == 0 || top[0].Entries[0].Value != "heavy" || !top[0].Over {
		t.Fatalf("top = %+v, want the heavy key first, over its limit", top)
	}
	if top[0].Count < 5000-top[0].CountError {
		t.Fatalf("heavy count %d (error %d), want about 5000", top[0].Count, top[0].CountError)
	}
}

// TestSketchHostileKeysKeepMemoryFixed: a client that sends a million
// distinct keys, each at its limit, must not grow the sketch.
func TestSketchHostileKeysKeepMemoryFixed(t *testing.T) {
	n := 1_000_000
	if raceEnabled || testing.Short() {
		n = 100_000
	}
	r := New(Config{MaxKeys: 1024, Now: func() time.Time { return epoch }})
	cfg := parse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	r.SetRules(cfg)
	lim := cfg.Limits()[0]
	entries := []rules.Entry{{Key: "k"}}
	// Each key's first hit fills its limit of 1: always recorded, every
	// one a new key in a full sketch.
	st := okStatus(0, true)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// A first pass fills every slot, then the heap is measured.
	for i := range 4096 {
		entries[0].Value = "warm-" + fmt.Sprint(i)
		r.Observe("d", entries, lim, &st, epoch)
	}
	before := heap()
	var buf []byte
	for i := range n {
		buf = fmt.Appendf(buf[:0], "attacker-%d-%s", i, strings.Repeat("x", i%300))
		entries[0].Value = string(buf)
		r.Observe("d", entries, lim, &st, epoch)
	}
	after := heap()
	if got := r.keys.len(); got > r.MaxKeys() {
		t.Fatalf("%d keys held, capacity %d", got, r.MaxKeys())
	}
	// The strings made by the loop are garbage by now; what the sketch
	// holds has not grown by more than noise.
	if after > before+256<<10 {
		t.Fatalf("heap grew from %d to %d bytes after %d distinct keys", before, after, n)
	}
	for _, k := range r.TopKeys(10)["d"] {
		if len(k.Entries) != 1 || (k.Truncated && len(k.Entries[0].Value) > maxKeyBytes) {
			t.Fatalf("bad key %+v", k)
		}
	}
}

func TestSlotKeyTruncatesOnCharacterBoundary(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	tests := []struct {
		name          string
		give          []rules.Entry
		want          []rules.Entry
		wantTruncated bool
	}{
		{"short", []rules.Entry{{Key: "a", Value: "1"}, {Key: "b", Value: ""}}, []rules.Entry{{Key: "a", Value: "1"}, {Key: "b", Value: ""}}, false},
		{"empty_value_last", []rules.Entry{{Key: "a"}}, []rules.Entry{{Key: "a"}}, false},
		{"long_value", []rules.Entry{{Key: "a", Value: long}}, []rules.Entry{{Key: "a", Value: long[:250]}}, true},
		{"long_key", []rules.Entry{{Key: long, Value: "v"}}, []rules.Entry{{Key: long[:252]}}, true},
		{"second_cut", []rules.Entry{{Key: "a", Value: strings.Repeat("x", 240)}, {Key: "bbbbbbbbbbbbbbbbbbbb", Value: "v"}},
			[]rules.Entry{{Key: "a", Value: strings.Repeat("x", 240)}, {Key: "bbbbbbbbb"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var k keyBytes
			k.set(tt.give, true)
			got := k.entries()
			if fmt.Sprint(got) != fmt.Sprint(tt.want) || k.truncated != tt.wantTruncated {
				t.Fatalf("entries = %q (truncated %v), want %q (%v)", got, k.truncated, tt.want, tt.wantTruncated)
			}
			if int(k.n) > maxKeyBytes {
				t.Fatalf("length %d", k.n)
			}
		})
	}
}

func TestTopOrdersAndForgets(t *testing.T) {
	k := newSketch(64)
	lim := testLimit(10)
	rule := &ruleInfo{id: "d.k", hash: 1}
	put(k, rule, lim, "near8", 8, epoch)
	put(k, rule, lim, "near9", 9, epoch)
	put(k, rule, lim, "over", 10, epoch)
	put(k, rule, lim, "over", 10, epoch)
	other := &rules.Limit{FullKey: "e.k", Domain: "e", Source: "t.yaml:9", RequestsPerUnit: 4, Unit: rules.Second, UnitMultiplier: 1}
	put(k, &ruleInfo{id: "e.k", hash: 2}, other, "x", 3, epoch)

	names := func(keys []Key) []string {
		var out []string
		for _, k := range keys {
			out = append(out, k.Entries[0].Value)
		}
		return out
	}
	top := k.top(10, epoch.Add(time.Second))
	if got := names(top["d"]); fmt.Sprint(got) != "[over near9 near8]" {
		t.Fatalf("top d = %v", got)
	}
	if got := top["d"][0]; got.RuleID != "d.k" || got.Used != 10 || got.Capacity != 10 || got.ResetIn != 59*time.Second || got.Count != 2 {
		t.Fatalf("top d[0] = %+v", got)
	}
	if got := names(top["e"]); fmt.Sprint(got) != "[x]" {
		t.Fatalf("top e = %v", got)
	}
	if got := names(k.top(2, epoch)["d"]); fmt.Sprint(got) != "[over near9]" {
		t.Fatalf("top 2 = %v", got)
	}
	// Once the window resets, the keys are no longer near anything.
	if got := k.top(10, epoch.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("after the reset: %v", got)
	}
}

func BenchmarkSketchObserve(b *testing.B) {
	k := newSketch(DefaultMaxKeys)
	lim := testLimit(10)
	rule := &ruleInfo{id: "d.k", hash: 1}
	keys := make([][]rules.Entry, 10_000)
	for i := range keys {
		keys[i] = []rules.Entry{{Key: "user", Value: fmt.Sprint("user-", i)}}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		e := keys[i%len(keys)]
		i++
		o := observation{domain: "d", rule: rule, limit: lim, entries: e, used: 9, cap: 10, now: 1, resetAt: 2, weight: countScale}
		k.observe(k.hashKey("d", rule, lim, e), &o)
	}
}

// len returns the number of keys held.
func (k *sketch) len() int {
	n := 0
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.Lock()
		n += len(sh.slots)
		sh.mu.Unlock()
	}
	return n
}
