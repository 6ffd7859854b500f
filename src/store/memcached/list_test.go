package memcached

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
	"github.com/ratelimitd/ratelimit/src/store/memory"
)

// listOps returns the ops of one descriptor's list at now, as the limiter
// builds them, and the key of the list's item: a fixed window of 10 a
// minute and a token bucket of 60 a minute (one token a second).
func listOps(t *testing.T, name string, now time.Time, hits uint64) ([]limiter.Op, string) {
	t.Helper()
	desc := fmt.Sprintf("rl_{%s_user_%d}", strings.ReplaceAll(t.Name(), "/", "_")+"_"+name, rand.Uint64())
	start := limiter.WindowStart(now, 60)
	return []limiter.Op{
		{Key: fmt.Sprintf("%s_%d_1_minute", desc, start), Algorithm: rules.FixedWindow, Limit: 10, Window: time.Minute, Hits: hits, Group: 1},
		{Key: desc + "_1_minute_token_bucket", Algorithm: rules.TokenBucket, Limit: 60, Window: time.Minute, Hits: hits, Group: 1},
	}, desc
}

// TestListOneItem: a list's ops are one item, read and written in one
// update (two round trips, whatever the number of limits), and no key of
// its own limits exists.
func TestListOneItem(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	now := time.Now()
	ops, item := listOps(t, "one", now, 3)
	trips, _ := s.Counters()
	res := do(t, s, false, now, ops...)
	if after, _ := s.Counters(); after-trips != 2 {
		t.Errorf("a list's first hits took %d round trips, want 2 (gets, add)", after-trips)
	}
	if !res[0].Allowed || res[0].Remaining != 7 || !res[1].Allowed || res[1].Remaining != 57 {
		t.Errorf("results %+v, want 7 and 57 left", res)
	}
	it, err := raw.Get(item)
	if err != nil {
		t.Fatalf("the list's item %q: %v", item, err)
	}
	slots, err := parseList(it.Value, nil)
	if err != nil || len(slots) != 2 {
		t.Fatalf("parseList(%q) = %v, %v; want two limits", it.Value, slots, err)
	}
	for _, op := range ops {
		if _, err := raw.Get(op.Key); !errors.Is(err, memcache.ErrCacheMiss) {
			t.Errorf("the limit's own key %q: %v, want a miss", op.Key, err)
		}
	}
	trips, _ = s.Counters()
	do(t, s, false, now, ops...)
	if after, _ := s.Counters(); after-trips != 2 {
		t.Errorf("a list's next hits took %d round trips, want 2 (gets, cas)", after-trips)
	}
}

// TestListOfOneBesideOthers: the one limit of a list of one (rate_limits
// with one entry) counts in the list's item whether its descriptor comes
// alone or beside another's, never in the limit's own key: counted in two
// places, its hits would be split between them.
func TestListOfOneBesideOthers(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	now := time.Now()
	a, _ := listOps(t, "a", now, 1)
	b, _ := listOps(t, "b", now, 1)
	a, b = a[:1], b[:1]
	b[0].Group = 2
	do(t, s, false, now, a[0], b[0])
	if r := do(t, s, false, now, a[0]); r[0].Before != 1 || r[0].After != 2 {
		t.Errorf("the list's second hit, alone: %+v, want the count from 1 to 2", r[0])
	}
	if _, err := memcache.New(srv.Addr).Get(a[0].Key); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Errorf("the limit's own key %q: %v, want a miss", a[0].Key, err)
	}
}

// TestListMatchesMemory runs one sequence of requests through a limiter on
// the memory store and one on memcached, for lists of every shape (one
// limit unlimited, mixed algorithms, hits_addend above 1, reads), in both
// modes: every status of every limit is the same.
func TestListMatchesMemory(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	mc := newStore(t, Config{Addrs: []string{srv.Addr}})
	lists := []struct{ name, items string }{
		{"unlimited_first", `      - {unlimited: true}
      - {unit: minute, requests_per_unit: 4}
`},
		{"unlimited_last", `      - {unit: minute, requests_per_unit: 4, algorithm: sliding_log}
      - {unlimited: true, name: never}
`},
		{"mixed", `      - {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
      - {unit: minute, requests_per_unit: 9, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 7, unit_multiplier: 2}
      - {unit: second, requests_per_unit: 60, unit_multiplier: 60, algorithm: sliding_log}
`},
	}
	base := time.Unix(1_699_920_010, 250_000_000)
	steps := []struct {
		at   time.Duration
		hits uint64
	}{{0, 1}, {0, 2}, {100 * time.Millisecond, 1}, {time.Second, 0}, {1500 * time.Millisecond, 3}, {2 * time.Second, 1},
		{3 * time.Second, 1}, {59 * time.Second, 2}, {61 * time.Second, 1}, {62 * time.Second, 0}, {125 * time.Second, 1}}
	for _, l := range lists {
		for _, stop := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stop_increment=%t", l.name, stop), func(t *testing.T) {
				t.Parallel()
				domain := fmt.Sprintf("d%016x", rand.Uint64())
				yaml := "domain: " + domain + "\ndescriptors:\n  - key: user\n    rate_limits:\n" + l.items
				cfg, err := rules.Parse([]rules.File{{Name: "l.yaml", Data: []byte(yaml)}}, rules.Options{})
				if err != nil {
					t.Fatal(err)
				}
				entries := []rules.Entry{{Key: "user", Value: "x"}}
				lim := cfg.Match(domain, entries).Limit
				want := limiter.New(memory.New(memory.Config{}), limiter.Config{StopIncrementWhenOverLimit: stop})
				got := limiter.New(mc, limiter.Config{StopIncrementWhenOverLimit: stop})
				for i, st := range steps {
					now := base.Add(st.at)
					check := func(l *limiter.Limiter) ([]limiter.Status, limiter.Status) {
						each := make([]limiter.Status, len(lim.Limits))
						out := make([]limiter.Status, 1)
						ds := []limiter.Descriptor{{Entries: entries, Limit: lim, Hits: st.hits, Each: each}}
						if err := l.Check(t.Context(), domain, now, ds, out); err != nil {
							t.Fatal(err)
						}
						return each, out[0]
					}
					wantEach, wantOut := check(want)
					gotEach, gotOut := check(got)
					if fmt.Sprint(gotOut) != fmt.Sprint(wantOut) {
						t.Errorf("step %d (+%v, %d hits): memcached %+v, memory %+v", i, st.at, st.hits, gotOut, wantOut)
					}
					for k := range wantEach {
						if fmt.Sprint(gotEach[k]) != fmt.Sprint(wantEach[k]) {
							t.Errorf("step %d (+%v, %d hits), limit %d: memcached %+v, memory %+v", i, st.at, st.hits, k, gotEach[k], wantEach[k])
						}
					}
				}
			})
		}
	}
}

// TestListContention: a list's item that another client changes between
// every gets and cas. The update gives up after maxAttempts cycles with
// ErrOverloaded (not ErrUnavailable, counted in Shed), having sent no more
// than two round trips per cycle; the store stays healthy, and the item
// holds only the other client's writes. Then two instances (two Stores,
// whose updates conflict with each other's) hammer one list: admission is
// still exact.
func TestListContention(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	now := time.Now()
	ops, item := listOps(t, "hostile", now, 1)
	do(t, s, false, now, ops...)
	it, err := raw.Get(item)
	if err != nil {
		t.Fatal(err)
	}
	written := it.Value
	s.beforeWrite = func(key string) {
		if key == item {
			if err := raw.Set(&memcache.Item{Key: item, Value: written, Expiration: 60}); err != nil {
				t.Error(err)
			}
		}
	}
	trips, _ := s.Counters()
	shed := s.Shed()
	b := &limiter.Batch{Now: now, Ops: ops}
	err = s.Do(t.Context(), b)
	if !errors.Is(err, limiter.ErrOverloaded) || errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Do on an item changed at every attempt = %v, want ErrOverloaded", err)
	}
	if after, _ := s.Counters(); after-trips != 2*maxAttempts {
		t.Errorf("%d round trips, want %d", after-trips, 2*maxAttempts)
	}
	if s.Shed() != shed+1 || !s.Healthy() {
		t.Errorf("Shed %d (was %d), Healthy %t; want one more shed, healthy", s.Shed(), shed, s.Healthy())
	}
	s.beforeWrite = nil
	if it, err := raw.Get(item); err != nil || string(it.Value) != string(written) {
		t.Errorf("item after the contention: %v, %v; want the other client's", it, err)
	}

	// Two instances, 16 goroutines each, on one list of 40 and 60.
	other := newStore(t, Config{Addrs: []string{srv.Addr}})
	s2 := newStore(t, Config{Addrs: []string{srv.Addr}})
	ops, _ = listOps(t, "two_instances", now, 1)
	ops[0].Limit, ops[0].Window = 60, 24*time.Hour
	ops[0].Key = strings.Replace(ops[0].Key, "_1_minute", "_1_day", 1)
	ops[1].Limit, ops[1].Window = 40, 7*24*time.Hour
	ops[1].Key = strings.Replace(ops[1].Key, "_1_minute_", "_1_week_", 1)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		st := other
		if g%2 == 0 {
			st = s2
		}
		wg.Go(func() {
			for range 20 {
				b := &limiter.Batch{Now: now, Ops: append([]limiter.Op(nil), ops...)}
				if err := st.Do(context.Background(), b); err != nil {
					t.Error(err)
					return
				}
				if b.Results[0].Allowed && b.Results[1].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 40 {
		t.Errorf("two instances admitted %d, want exactly 40", got)
	}
}

// TestListCorruptItem: a list's item that is not one this store wrote (not
// a list, a version to come, a limit twice, a state that does not decode,
// limits past the bound) fails the list's ops with ErrData naming the
// item, reads and AllOrNothing batches included, without a panic; the
// store stays healthy and serves other lists.
func TestListCorruptItem(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	now := time.Now()
	slot := func(id, state string) []listSlot {
		return []listSlot{{id: []byte(id), idle: now.Add(time.Hour).UnixMicro(), state: []byte(state)}}
	}
	many := make([]listSlot, maxListSlots+1)
	for i := range many {
		many[i] = slot(fmt.Sprint(i, "_minute"), "f")[0]
	}
	tests := []struct {
		name  string
		value []byte
	}{
		{"garbage", []byte("garbage")},
		{"counter", []byte("12")},
		{"empty", []byte{}},
		{"version_2", []byte{listTag, 2, 0}},
		{"truncated", appendList(nil, slot("1_minute", "f\x02\x01\x00\x00"))[:8]},
		{"limit_twice", appendList(nil, append(slot("1_minute", "f\x02\x01\x00\x00"), slot("1_minute", "f\x02\x01\x00\x00")...))},
		{"fixed_state_garbage", appendList(nil, slot("1_minute", "xyz"))},
		{"token_bucket_state_garbage", appendList(nil, slot("1_minute_token_bucket", "w\x01"))},
		{"too_many_limits", appendList(nil, many)},
	}
	for _, tt := range tests {
		for _, mode := range []struct {
			name  string
			hits  uint64
			all   bool
			other bool // one more op, of another descriptor, in the batch
		}{{"hit", 1, false, false}, {"read", 0, false, false}, {"all_or_nothing", 1, true, true}} {
			ops, item := listOps(t, tt.name+"_"+mode.name, now, mode.hits)
			if err := raw.Set(&memcache.Item{Key: item, Value: tt.value, Expiration: 60}); err != nil {
				t.Fatal(err)
			}
			b := &limiter.Batch{Now: now, Ops: ops, AllOrNothing: mode.all}
			if mode.other {
				b.Ops = append(b.Ops, limiter.Op{Key: item + "_other_60", Algorithm: rules.FixedWindow, Limit: 5, Window: time.Minute, Hits: 1})
			}
			err := s.Do(t.Context(), b)
			if !errors.Is(err, limiter.ErrData) || errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), item) {
				t.Errorf("%s/%s: Do = %v, want ErrData naming %q", tt.name, mode.name, err, item)
			}
			if mode.other {
				read := b.Ops[2]
				read.Hits = 0
				if r := do(t, s, false, now, read)[0]; r.Before != 0 {
					t.Errorf("%s/%s: the other op's hit stayed recorded", tt.name, mode.name)
				}
			}
		}
	}
	if !s.Healthy() {
		t.Error("corrupt items made the store unhealthy")
	}
	ops, _ := listOps(t, "fine", now, 1)
	if r := do(t, s, false, now, ops...); !r[0].Allowed || !r[1].Allowed {
		t.Errorf("another list after the corrupt items: %+v", r)
	}
}

// TestListExpiration: a list's item lives as long as its longest-lived
// state (plus one second), and a limit whose state went idle leaves the
// item at its next write.
func TestListExpiration(t *testing.T) {
	t.Parallel()
	srv := harness.StartMemcached(t)
	s := newStore(t, Config{Addrs: []string{srv.Addr}})
	raw := memcache.New(srv.Addr)
	now := time.Now()

	// 30 tokens of a bucket of one a second: full again in 30 s; the
	// minute's window ends sooner or later than that.
	ops, item := listOps(t, "bucket", now, 30)
	do(t, s, false, now, ops...)
	windowEnd := limiter.FixedWindowEnd(now, time.Minute)
	longest := max(secondsUntil(windowEnd.UnixMicro(), now), 30)
	if got := metaTTL(t, srv.Addr, item); int64(got) < longest || int64(got) > longest+1 {
		t.Errorf("TTL %d s, want %d..%d (the longest state)", got, longest, longest+1)
	}

	// Two minutes later the fixed window and the bucket are idle: a hit
	// on the bucket alone (the fixed window's op skipped, as the near
	// cache does) drops the fixed window's state.
	later := now.Add(2 * time.Minute)
	ops, item = listOps(t, "idle", now, 1)
	do(t, s, false, now, ops...)
	ops, _ = listOps(t, "idle", later, 1)
	ops[1].Key = strings.Replace(ops[1].Key, ops[1].Key[:strings.IndexByte(ops[1].Key, '}')+1], item, 1)
	do(t, s, false, later, ops[1])
	it, err := raw.Get(item)
	if err != nil {
		t.Fatal(err)
	}
	slots, err := parseList(it.Value, nil)
	if err != nil || len(slots) != 1 || string(slots[0].id) != "1_minute_token_bucket" {
		t.Errorf("item after the fixed window went idle: %v, %v; want the token bucket only", slots, err)
	}
}

// TestRunListFixedWindows runs a list's fixed window through runList on
// an injected clock: hits count in their own window's count, the previous
// window's too (a clock a little behind another instance's, or a read of
// it), and a window older than both is decided on 0 and not kept.
func TestRunListFixedWindows(t *testing.T) {
	t.Parallel()
	minute := time.Unix(1_699_920_000, 0) // a minute's start
	op := func(at time.Time, hits uint64) []limiter.Op {
		return []limiter.Op{{Key: fmt.Sprintf("rl_{d_k_v}_%d_1_minute", limiter.WindowStart(at, 60)),
			Algorithm: rules.FixedWindow, Limit: 5, Window: time.Minute, Hits: hits, Group: 1}}
	}
	var data []byte
	var latest time.Time
	run := func(at time.Time, hits uint64, wantBefore uint64, wantWrite bool) {
		t.Helper()
		if at.After(latest) && wantWrite {
			latest = at
		}
		res := make([]limiter.Result, 1)
		value, idle, err := runList(op(at, hits), at, data, data != nil, listEach, res, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Before != wantBefore || (value != nil) != wantWrite {
			t.Errorf("at %v, %d hits: Before %d, wrote %t; want %d, %t", at.Sub(minute), hits, res[0].Before, value != nil, wantBefore, wantWrite)
		}
		if value != nil {
			data = value
			// The latest window's end.
			if want := limiter.FixedWindowEnd(latest, time.Minute).UnixMicro(); idle != want {
				t.Errorf("at %v: idle %d, want %d", at.Sub(minute), idle, want)
			}
		}
	}
	run(minute.Add(10*time.Second), 2, 0, true)
	run(minute.Add(70*time.Second), 3, 0, true)   // the next window
	run(minute.Add(20*time.Second), 1, 2, true)   // back in the first: its count
	run(minute.Add(80*time.Second), 0, 3, false)  // a read of the second
	run(minute.Add(30*time.Second), 0, 3, false)  // and of the first
	run(minute.Add(-50*time.Second), 4, 0, false) // older than both: not kept
	run(minute.Add(130*time.Second), 1, 0, true)  // a third window: the first goes
	run(minute.Add(30*time.Second), 0, 0, false)
	run(minute.Add(80*time.Second), 0, 3, false)
}

// FuzzParseList: parseList never panics, and what it takes encodes back
// to the same bytes.
func FuzzParseList(f *testing.F) {
	f.Add(appendList(nil, []listSlot{{id: []byte("1_minute"), idle: 5, state: appendFixed(nil, fixedState{start: 60, count: 3})}}))
	f.Add([]byte{listTag, listVersion, 0})
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		slots, err := parseList(data, nil)
		if err != nil {
			return
		}
		if back := appendList(nil, slots); string(back) != string(data) {
			t.Errorf("parseList(%q) encodes back as %q", data, back)
		}
		for i := range slots {
			_, _ = parseFixed(slots[i].state)
		}
	})
}

// TestEncodeListBounds: limits a reload removed go first, the first to go
// idle first, when an item would hold more than maxListSlots limits or
// maxListBytes; limits written by the update are never dropped, and an
// item they alone would overfill is refused.
func TestEncodeListBounds(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) int64 { return now.Add(d).UnixMicro() }
	stale := func(i int, size int) listSlot {
		return listSlot{id: []byte(fmt.Sprintf("%d_minute", i)), idle: at(time.Duration(i+1) * time.Minute), state: make([]byte, size)}
	}
	fresh := listSlot{id: []byte("1_second"), idle: at(time.Second), state: []byte("f\x02\x01\x00\x00"), fresh: true}
	ids := func(value []byte) []string {
		t.Helper()
		slots, err := parseList(value, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sl := range slots {
			out = append(out, string(sl.id))
		}
		return out
	}

	// Idle ones go at once; then the earliest to go idle while too many.
	slots := []listSlot{fresh, {id: []byte("gone"), idle: at(-time.Second), state: []byte("x")}}
	for i := range maxListSlots {
		slots = append(slots, stale(i, 1))
	}
	value, idle, err := encodeList(slots, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := ids(value)
	if len(got) != maxListSlots || got[0] != "1_second" || got[1] != "1_minute" || idle != at(maxListSlots*time.Minute) {
		t.Errorf("kept %v, idle %d; want 1_second and the %d latest to go idle, idle at the last", got, idle, maxListSlots-1)
	}

	// Too many bytes: stale limits go until the item fits.
	slots = []listSlot{fresh, stale(0, maxListBytes/2), stale(1, maxListBytes/2), stale(2, 100)}
	value, _, err = encodeList(slots, now, 0)
	if err != nil || len(value) > maxListBytes || strings.Join(ids(value), " ") != "1_second 1_minute 2_minute" {
		t.Errorf("over the byte bound: kept %v (%d bytes), %v; want the first stale one dropped", ids(value), len(value), err)
	}

	// Fresh limits alone over the bound: refused.
	big := fresh
	big.state = make([]byte, maxListBytes)
	if _, _, err := encodeList([]listSlot{big}, now, 0); !errors.Is(err, errListTooLarge) {
		t.Errorf("a fresh state over the bound: %v, want errListTooLarge", err)
	}
}
