package memory

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// foldAll turns every entry of s into a record, then every record into a
// place in its rule's filter, as a full store would.
func foldAll(s *Store, now time.Time) {
	compactAll(s)
	for s.foldRecords(nil, now.UnixMicro()) {
	}
}

// ruleOp is op of rule, as the limiter sends it.
func ruleOp(rule string, a rules.Algorithm, key string, limit uint64, window time.Duration, hits uint64) limiter.Op {
	o := op(a, key, limit, window, hits)
	o.Rule = rule
	return o
}

// TestFilterRate measures the false-positive rate of a filter at 8, 16 and
// 32 bits a key against filterRate, the figure the docs give, with hashes
// from a seeded generator.
func TestFilterRate(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	tests := []struct {
		bitsPerKey, tries int
	}{
		{8, 50_000},
		{16, 200_000},
		{32, 1_000_000},
	}
	for _, tt := range tests {
		b := newBloom(1024)
		for range 1024 * 512 / tt.bitsPerKey {
			b.add(rng.Uint64())
		}
		found := 0
		for range tt.tries {
			if b.has(rng.Uint64()) {
				found++
			}
		}
		got, want := float64(found)/float64(tt.tries), filterRate(float64(tt.bitsPerKey))
		t.Logf("%d bits a key: %d of %d keys not in the filter found (%.3g), filterRate %.3g", tt.bitsPerKey, found, tt.tries, got, want)
		if got < 0.7*want || got > 1.4*want {
			t.Errorf("%d bits a key: rate %.3g, filterRate says %.3g", tt.bitsPerKey, got, want)
		}
		if r := b.rate(); r != want {
			t.Errorf("%d bits a key: bloom.rate() = %.3g, want filterRate's %.3g", tt.bitsPerKey, r, want)
		}
	}
	for _, tt := range []struct {
		bitsPerKey float64
		want       string
	}{{64, "3e-07"}, {32, "1.7e-05"}, {16, "0.00091"}, {8, "0.029"}, {4, "0.32"}} {
		if got := fmt.Sprintf("%.2g", filterRate(tt.bitsPerKey)); got != tt.want {
			t.Errorf("filterRate(%v) = %s, want %s as the docs say", tt.bitsPerKey, got, tt.want)
		}
	}
}

// TestHalvedFilterKeepsEveryKey: a filter halved down to one block still
// holds every key it held.
func TestHalvedFilterKeepsEveryKey(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	b := newBloom(64)
	keys := make([]uint64, 2000)
	for i := range keys {
		keys[i] = rng.Uint64()
		b.add(keys[i])
	}
	for b.blocks() > 1 {
		b.halve()
		for _, h := range keys {
			if !b.has(h) {
				t.Fatalf("halved to %d blocks: key %x lost", b.blocks(), h)
			}
		}
	}
}

// TestFoldedKeysNeverAdmitMore: a key over its limit that only its rule's
// filter holds never admits a hit its own state would refuse, for every
// algorithm, and is admitted again no later than the end of its group (its
// idle time rounded up to an eighth of its window). The key is folded
// again before every op; the exact twin sees only what the folded one
// admitted.
func TestFoldedKeysNeverAdmitMore(t *testing.T) {
	t.Parallel()
	for _, a := range rules.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			want, got, o := spentTwins(t, a)
			admitted := 0
			for at := 31 * time.Minute; at < 4*time.Hour; at += 7 * time.Minute {
				now := base.Add(at)
				foldAll(got, now)
				if got.Len() != 0 {
					t.Fatalf("+%v: %d keys held one by one, want the key folded", at, got.Len())
				}
				idle := int64(0) // when the key's own state is that of a new key
				if e := want.shard(o.Key).m[o.Key]; e != nil {
					idle = e.idle
				}
				o.Hits = 1 + uint64(at/time.Minute)%2
				g, err := do(t, got, now, o)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case g[0].Allowed:
					admitted++
					if w, _ := do(t, want, now, o); !w[0].Allowed {
						t.Errorf("+%v, %d hits: folded, admitted what the key's state refuses: %+v, %+v", at, o.Hits, g[0], w[0])
					}
				case now.UnixMicro() >= groupIdle(idle, 3600):
					t.Errorf("+%v, %d hits: refused after the end of its group (the key was idle at +%v): %+v",
						at, o.Hits, time.UnixMicro(idle).Sub(base), g[0])
				}
			}
			if admitted == 0 {
				t.Errorf("admitted nothing in four hours, want hits admitted as the key's windows end")
			}
			checkStore(t, got)
		})
	}
}

// TestGroupsMergeLater: the keys of a rule over their limit until more
// than maxGroups times share maxGroups groups: a key whose time would make
// one more joins the group that ends next after it, or moves the last one
// later, so that each key is held until its own time at least.
func TestGroupsMergeLater(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxBytes: -1, SweepInterval: -1})
	rng := rand.New(rand.NewPCG(13, 14))
	rule := s.ruleID("d.tb")
	type key struct {
		h    uint64
		idle int64
	}
	var keys []key
	s.fmu.Lock()
	for i := range 3 * maxGroups {
		// An eighth of the window apart, in an order that brings times
		// later than every group as well as between them.
		idle := base.Add(time.Duration((i*37)%(3*maxGroups)+1) * 450 * time.Second).UnixMicro()
		keys = append(keys, key{rng.Uint64(), idle})
		s.fold(rule, keys[i].h, idle, 3600, base.UnixMicro(), 1)
	}
	groups := len(s.filters[rule].groups)
	s.fmu.Unlock()
	if groups != maxGroups {
		t.Errorf("%d groups, want %d", groups, maxGroups)
	}
	for i, k := range keys {
		if got := s.foldedIdle(rule, k.h, base.UnixMicro()); got < k.idle {
			t.Errorf("key %d, over its limit until +%v: held until +%v", i, time.UnixMicro(k.idle).Sub(base), time.UnixMicro(got).Sub(base))
		}
	}
	checkStore(t, s)
}

// TestFoldedKeyAnswers: what an op on a folded key is told. A read and a
// refund change nothing and store nothing; a refund gives nothing back; a
// fixed window is refused until its end; a sliding log until its newest hit
// leaves the window.
func TestFoldedKeyAnswers(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxBytes: -1, SweepInterval: -1})
	fw := ruleOp("d.fw", rules.FixedWindow, "fw", 3, time.Hour, 3)
	sl := ruleOp("d.sl", rules.SlidingLog, "sl", 3, time.Hour, 3)
	now := base.Add(10 * time.Minute)
	do(t, s, now, fw, sl)
	foldAll(s, now)
	later := now.Add(5 * time.Minute)
	for _, o := range []limiter.Op{fw, sl} {
		read, refund, hit := o, o, o
		read.Hits = 0
		refund.Refund, refund.Hits = true, 2
		hit.Hits = 1
		rs, err := do(t, s, later, read, refund, hit, read)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rs {
			if r.Remaining != 0 || r.Allowed != (i < 2 || i == 3) {
				t.Errorf("%s: op %d (read, refund, hit, read): %+v, want Remaining 0, only the hit refused", o.Key, i, r)
			}
		}
		if s.Len() != 0 {
			t.Errorf("%s: %d keys held after a read, a refund and a refused hit, want 0", o.Key, s.Len())
		}
	}
	// Its newest hit leaves the window in 55 minutes, rounded up to the
	// next eighth of the window: +1h15m.
	if rs, _ := do(t, s, later, sl); rs[0].ResetAfter != time.Hour {
		t.Errorf("sliding log: ResetAfter %v, want 1h", rs[0].ResetAfter)
	}
	end := base.Add(time.Hour)
	if rs, _ := do(t, s, end.Add(-time.Second), fw); rs[0].Allowed {
		t.Errorf("fixed window a second before its end: %+v, want refused", rs[0])
	}
	if rs, _ := do(t, s, end, fw); !rs[0].Allowed {
		t.Errorf("fixed window at its end: %+v, want admitted", rs[0])
	}
	checkStore(t, s)
}

// TestFloodLeavesRoomForOtherRules is issue 36's second case: one client's
// new values of a 1-an-hour rule fill a 256 KiB store five times over (and
// its filters' half of it nearly). No op is refused, the clients over
// their limit before and during the flood stay over it, a new key of
// another rule and a new value of the flooded rule are counted as in an
// empty store, and the store stays within its ceiling.
func TestFloodLeavesRoomForOtherRules(t *testing.T) {
	t.Parallel()
	const maxBytes = 256 << 10
	s := newStore(t, Config{MaxBytes: maxBytes, SweepInterval: -1})
	now := base
	for i := range 120 {
		spend(t, s, now, i)
	}
	flood := func(i int) limiter.Op {
		return ruleOp("d.one", rules.FixedWindow, fmt.Sprintf("ratelimit_d_one_%08d_1699920000", i), 1, time.Hour, 1)
	}
	const keys = 12_000 // about five times the records 256 KiB holds
	refusedNew := 0
	for i := range keys {
		now = now.Add(100 * time.Microsecond)
		rs, err := do(t, s, now, flood(i))
		if err != nil {
			t.Fatalf("flood key %d: %v, want an answer", i, err)
		}
		if !rs[0].Allowed {
			refusedNew++
		}
		if got, bound := s.Bytes(), int64(maxBytes+maxBytes/16); got > bound {
			t.Fatalf("after %d flood keys: Bytes = %d, above %d", i, got, bound)
		}
	}
	ev := s.Evictions()
	t.Logf("%d keys (%d compact), %d bytes (%d of filters); %d new flood keys refused; filters' false-positive rate %.2g; %+v",
		s.Len(), s.Records(), s.Bytes(), s.filterBytes, refusedNew, s.FilterFalsePositive(), ev)
	if ev.Folded == 0 {
		t.Errorf("Evictions = %+v, want keys folded", ev)
	}
	// About 1 in a million each (64 bits a key): 2 would be 1 in 10,000.
	if refusedNew > 1 {
		t.Errorf("%d new keys of the flood refused, want 1 at most", refusedNew)
	}
	for i := 0; i < keys; i += 97 {
		if rs, err := do(t, s, now, flood(i)); err != nil || rs[0].Allowed {
			t.Errorf("flood key %d again: %+v, %v; want refused", i, rs[0], err)
		}
	}
	for i := range 120 {
		if rs, err := do(t, s, now, spentOp(i, 1)); err != nil || rs[0].Allowed {
			t.Errorf("%s after the flood: %+v, %v; want refused", spentOp(i, 1).Key, rs[0], err)
		}
	}
	for _, o := range []limiter.Op{
		ruleOp("d.other", rules.FixedWindow, "ratelimit_d_other_new_1699920000", 2, time.Hour, 1),
		ruleOp("d.one", rules.FixedWindow, "ratelimit_d_one_new_1699920000", 1, time.Hour, 1),
	} {
		for hit := range o.Limit + 1 {
			rs, err := do(t, s, now, o)
			if err != nil || rs[0].Allowed != (hit < o.Limit) {
				t.Errorf("%s after the flood, hit %d: %+v, %v; want admitted %v", o.Key, hit+1, rs[0], err, hit < o.Limit)
			}
		}
	}
	checkStore(t, s)
	// The window over, every filter goes at the next sweep.
	s.now = func() time.Time { return base.Add(2 * time.Hour) }
	s.Sweep()
	if s.nfilters.Load() != 0 || s.filterBytes != 0 {
		t.Errorf("after the window, swept: %d filters, %d bytes of them; want none", s.nfilters.Load(), s.filterBytes)
	}
	checkStore(t, s)
}

// TestFiltersShareTheRoom: a rule flooded after another one has filled the
// filters' half of the store gets its share: the first rule's filters are
// halved for it, so its false-positive rate ends below the first rule's,
// and the filters stay within their half.
func TestFiltersShareTheRoom(t *testing.T) {
	t.Parallel()
	const maxBytes = 1 << 20
	s := newStore(t, Config{MaxBytes: maxBytes, SweepInterval: -1})
	rng := rand.New(rand.NewPCG(9, 10))
	idle := base.Add(time.Hour).UnixMicro()
	flood := func(rule string, keys, batch int) {
		s.fmu.Lock()
		defer s.fmu.Unlock()
		for range keys {
			s.fold(s.ruleID(rule), rng.Uint64(), idle, 3600, base.UnixMicro(), int64(batch))
		}
	}
	rate := func(rule string) float64 {
		s.fmu.RLock()
		defer s.fmu.RUnlock()
		missed := 1.0
		for _, g := range s.filters[s.ruleID(rule)].groups {
			for _, b := range g.blooms {
				missed *= 1 - b.rate()
			}
		}
		return 1 - missed
	}
	// 8 bytes a key at 64 bits: d.a alone would take the half twice.
	for range 10 {
		flood("d.a", 12_000, 12_000)
	}
	a := rate("d.a")
	for range 3 {
		flood("d.b", 10_000, 10_000)
	}
	t.Logf("d.a: 120,000 keys, false-positive rate %.2g, then %.2g; d.b: 30,000 keys, %.2g; filters %d bytes; %+v",
		a, rate("d.a"), rate("d.b"), s.filterBytes, s.Evictions())
	if s.Evictions().Halved == 0 || rate("d.b") >= rate("d.a") || rate("d.a") <= a {
		t.Errorf("want d.a's filters halved for d.b's, and d.b's rate below d.a's")
	}
	if budget := int64(maxBytes / 2); s.filterBytes > budget {
		t.Errorf("filters take %d bytes, above half the ceiling (%d)", s.filterBytes, budget)
	}
	checkStore(t, s)
}

// TestMaxKeysFoldsWhenAllSpent: at MaxKeys, with only keys over their limit
// left (compacting frees no key), a new key folds one of them into its
// rule's filter: it is admitted, and the folded key stays refused.
func TestMaxKeysFoldsWhenAllSpent(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxKeys: 3, Shards: 1, SweepInterval: -1})
	do(t, s, base, op(rules.FixedWindow, "under", 5, time.Minute, 1))
	for i := range 3 {
		if _, err := do(t, s, base, ruleOp("d.spent", rules.TokenBucket, spentKey(i), 1, time.Minute, 1)); err != nil {
			t.Fatalf("spent key %d: %v", i, err)
		}
	}
	if rs, err := do(t, s, base, ruleOp("d.new", rules.TokenBucket, "new", 1, time.Minute, 1)); err != nil || !rs[0].Allowed {
		t.Errorf("a new key at MaxKeys with every key spent: %+v, %v; want admitted", rs[0], err)
	}
	if got, want := s.Evictions(), (Evictions{UnderLimit: 1, Folded: 1}); got != want {
		t.Errorf("Evictions = %+v, want %+v", got, want)
	}
	for i := range 3 {
		if rs, _ := do(t, s, base, ruleOp("d.spent", rules.TokenBucket, spentKey(i), 1, time.Minute, 0)); rs[0].Remaining != 0 {
			t.Errorf("spent key %d: %+v, want Remaining 0", i, rs[0])
		}
	}
	if s.Len() != 3 {
		t.Errorf("Len = %d, want MaxKeys", s.Len())
	}
	checkStore(t, s)
}

// TestFoldsOnlyWhenNothingElseIsLeft: a store holding nothing but keys over
// their limit compacts them first, then folds them; a new key is taken,
// counted, and every key over its limit stays so; an AllOrNothing batch
// with a new key and a folded one is refused whole, and one with two new
// keys admitted. Once the keys' window is over, they start afresh.
func TestFoldsOnlyWhenNothingElseIsLeft(t *testing.T) {
	t.Parallel()
	s := newStore(t, Config{MaxBytes: 16 << 10, Shards: 1, SweepInterval: -1})
	now := base
	spent := func(i int) limiter.Op { return ruleOp("d.spent", rules.FixedWindow, spentKey(i), 1, time.Minute, 1) }
	const n = 1000
	for i := range n {
		now = now.Add(time.Millisecond)
		if rs, err := do(t, s, now, spent(i)); err != nil || !rs[0].Allowed {
			t.Fatalf("key %d: %+v, %v; want admitted", i, rs[0], err)
		}
	}
	if got := s.Evictions(); got.Compacted == 0 || got.Folded == 0 || got.UnderLimit != 0 {
		t.Fatalf("after %d spent keys: %+v, want keys compacted, then folded", n, got)
	}
	checkStore(t, s)
	for i := range n {
		if rs, err := do(t, s, now, spent(i)); err != nil || rs[0].Allowed {
			t.Fatalf("spent key %d: %+v, %v; want refused", i, rs[0], err)
		}
	}
	other := ruleOp("d.other", rules.FixedWindow, spentKey(9999), 2, time.Minute, 1)
	for hit := range 3 {
		if rs, err := do(t, s, now, other); err != nil || rs[0].Allowed != (hit < 2) {
			t.Errorf("a new key of another rule, hit %d: %+v, %v; want admitted %v", hit+1, rs[0], err, hit < 2)
		}
	}
	b := &limiter.Batch{Now: now, AllOrNothing: true, Ops: []limiter.Op{spent(0), ruleOp("d.other", rules.FixedWindow, "new-1", 2, time.Minute, 1)}}
	if err := s.Do(t.Context(), b); err != nil || b.Results[0].Allowed {
		t.Errorf("AllOrNothing with a folded key: %+v, %v; want refused", b.Results, err)
	}
	b = &limiter.Batch{Now: now, AllOrNothing: true, Ops: []limiter.Op{
		ruleOp("d.other", rules.FixedWindow, "new-2", 2, time.Minute, 1),
		ruleOp("d.other", rules.FixedWindow, "new-3", 2, time.Minute, 1),
	}}
	if err := s.Do(t.Context(), b); err != nil || !b.Results[0].Allowed || !b.Results[1].Allowed {
		t.Errorf("AllOrNothing with two new keys: %+v, %v; want admitted", b.Results, err)
	}
	checkStore(t, s)
	end := limiter.FixedWindowEnd(now, time.Minute)
	for i := range n {
		if rs, err := do(t, s, end, spent(i)); err != nil || !rs[0].Allowed {
			t.Fatalf("spent key %d when the window is over: %+v, %v; want admitted", i, rs[0], err)
		}
	}
	checkStore(t, s)
}

// TestFilterAccountingCoversTheHeap calibrates filterBytes, groupBytes and
// bloomBytes: filters of many rules, each with a few groups of a filter or
// two, must take no more of the live heap than Bytes says.
func TestFilterAccountingCoversTheHeap(t *testing.T) {
	s := New(Config{MaxBytes: -1, SweepInterval: -1, Now: func() time.Time { return base }})
	defer s.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	before := heap()
	s.fmu.Lock()
	for r := range 2000 {
		rule := s.ruleID(fmt.Sprint("d.rule_", r))
		for g := range 1 + r%5 {
			idle := base.Add(time.Duration(g+1) * time.Hour).UnixMicro()
			for range 1 + (r%3)*firstBlocks*512/keyBits { // one filter, or two
				s.fold(rule, rng.Uint64(), idle, 3600, base.UnixMicro(), 1)
			}
		}
	}
	s.fmu.Unlock()
	live := int64(heap() - before)
	t.Logf("%d rules' filters: %d bytes live, %d accounted (%.2f×)", len(s.filters), live, s.Bytes(), float64(s.Bytes())/float64(live))
	if s.Bytes() < live || float64(s.Bytes()) > 1.3*float64(live) {
		t.Errorf("Bytes = %d for a live heap of %d, want 1 to 1.3 times it", s.Bytes(), live)
	}
}
