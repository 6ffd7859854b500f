package redis

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/quota"
)

var quotaEpoch = time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)

// quotaSync makes one request and fails the test on its error.
func quotaSync(t *testing.T, s *Store, r quota.SyncRequest) quota.SyncReply {
	t.Helper()
	if r.Lease == 0 {
		r.Lease = 3 * time.Second
	}
	if r.Keep == 0 {
		r.Keep = time.Minute
	}
	rep := s.SyncQuota(t.Context(), []quota.SyncRequest{r})
	if len(rep) != 1 || rep[0].Err != nil {
		t.Fatalf("SyncQuota(%+v) = %+v", r, rep)
	}
	return rep[0]
}

func quotaCommit(t *testing.T, s *Store, r quota.CommitRequest) error {
	t.Helper()
	if r.Keep == 0 {
		r.Keep = time.Minute
	}
	if r.Lease == 0 {
		r.Lease = 3 * time.Second
	}
	errs := s.CommitQuota(t.Context(), []quota.CommitRequest{r}, nil)
	if len(errs) != 1 {
		t.Fatalf("CommitQuota: %d errors for one request", len(errs))
	}
	return errs[0]
}

// TestQuotaShare walks two replicas through a pool's life on a real Redis:
// one takes the lease, the other hands its reports over and reads its
// grants, the owner's writes are fenced once the lease has changed hands,
// and the new owner resumes from the state.
func TestQuotaShare(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr})
	const pool = "web\x00tenant=acme"
	now := quotaEpoch

	a := quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "a", Now: now})
	if !a.Owner || !a.Fresh || a.Epoch != 1 || a.State != nil || len(a.Stored) != 0 {
		t.Fatalf("first replica = %+v, want the lease, fresh, epoch 1, no state", a)
	}
	// b hands over two reports before the owner takes them: the second
	// is written merged with the first.
	b := quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "b", Now: now, Push: []quota.Push{{Sub: "7", Merged: []byte("m1"), Alone: []byte("r1")}}, Want: []string{"7"}})
	if b.Owner || b.Epoch != 1 || b.Holder != "a" || !slices.Equal(b.Merged, []bool{false}) || len(b.Grants) != 1 || b.Grants[0] != nil {
		t.Fatalf("second replica = %+v, want no lease (a's), its report written alone, no grant yet", b)
	}
	b = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "b", Now: now, Push: []quota.Push{{Sub: "7", Merged: []byte("r1+r2"), Alone: []byte("r2")}}})
	if !slices.Equal(b.Merged, []bool{true}) {
		t.Fatalf("a report not taken yet was not merged: %+v", b)
	}
	// The owner takes every report, its own included, and commits.
	now = now.Add(time.Second)
	a = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "a", Now: now, Push: []quota.Push{{Sub: "1", Merged: []byte("x"), Alone: []byte("own")}}})
	want := []quota.Field{{Sub: "1", Value: []byte("own")}, {Sub: "7", Value: []byte("r1+r2")}}
	slices.SortFunc(a.Reports, func(x, y quota.Field) int { return strings.Compare(x.Sub, y.Sub) })
	if !a.Owner || a.Fresh || !slices.EqualFunc(a.Reports, want, fieldEqual) {
		t.Fatalf("owner's sync = %+v, want every report taken", a)
	}
	if err := quotaCommit(t, s, quota.CommitRequest{Pool: pool, Replica: "a", Epoch: 1, Now: now, State: []byte("state1"),
		Grants: []quota.Field{{Sub: "7", Value: []byte("g7")}, {Sub: "1", Value: []byte("g1")}, {Sub: "9", Value: []byte("g9")}}}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if err := quotaCommit(t, s, quota.CommitRequest{Pool: pool, Replica: "a", Epoch: 1, Now: now, State: []byte("state2"), Drop: []string{"9"}}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	// The report taken is gone: the next one is written alone.
	b = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "b", Now: now, Push: []quota.Push{{Sub: "7", Merged: []byte("no"), Alone: []byte("r3")}}, Want: []string{"7", "8"}})
	if !slices.Equal(b.Merged, []bool{false}) || string(b.Grants[0]) != "g7" || b.Grants[1] != nil {
		t.Fatalf("second replica after the commit = %+v, want its grant and a report written alone", b)
	}

	// a stops renewing: once its lease has ended, b takes the pool over,
	// with its state, the subscribers holding grants and the reports.
	now = now.Add(3 * time.Second)
	if b = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "b", Now: now.Add(-time.Millisecond)}); b.Owner {
		t.Fatalf("the lease changed hands before its end: %+v", b)
	}
	b = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "b", Now: now})
	slices.SortFunc(b.Stored, func(x, y quota.Field) int { return strings.Compare(x.Sub, y.Sub) })
	if !b.Owner || !b.Fresh || b.Epoch != 2 || string(b.State) != "state2" ||
		!slices.EqualFunc(b.Stored, []quota.Field{{Sub: "1", Value: []byte("g1")}, {Sub: "7", Value: []byte("g7")}}, fieldEqual) ||
		!slices.EqualFunc(b.Reports, []quota.Field{{Sub: "7", Value: []byte("r3")}}, fieldEqual) {
		t.Fatalf("takeover = %+v, want the lease (epoch 2), the state, grants of 1 and 7, and the report", b)
	}
	// a's writes are refused from now on, and change nothing.
	if err := quotaCommit(t, s, quota.CommitRequest{Pool: pool, Replica: "a", Epoch: 1, State: []byte("stale")}); !errors.Is(err, quota.ErrNotOwner) {
		t.Fatalf("the old owner's commit = %v, want ErrNotOwner", err)
	}
	if st := quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "b", Now: now, State: true}); string(st.State) != "state2" || st.Fresh {
		t.Fatalf("state after the fenced commit = %q (fresh %v), want state2", st.State, st.Fresh)
	}
	// a, behind, is told it is not the owner.
	if a = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "a", Now: now}); a.Owner || a.Holder != "b" {
		t.Fatalf("old owner still has the lease: %+v", a)
	}
	// b's commit renews its lease; a replica that saw b stop beating
	// takes the lease before its end, one that names another does not.
	if err := quotaCommit(t, s, quota.CommitRequest{Pool: pool, Replica: "b", Epoch: 2, Now: now.Add(2 * time.Second), State: []byte("state3")}); err != nil {
		t.Fatalf("b's commit: %v", err)
	}
	if a = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "a", Now: now.Add(4 * time.Second)}); a.Owner {
		t.Fatalf("a took a lease its commit renewed: %+v", a)
	}
	if a = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "a", Now: now.Add(4 * time.Second), Dead: "c"}); a.Owner {
		t.Fatalf("a took b's lease on c's death: %+v", a)
	}
	if a = quotaSync(t, s, quota.SyncRequest{Pool: pool, Replica: "a", Now: now.Add(4 * time.Second), Dead: "b"}); !a.Owner || !a.Fresh || a.Epoch != 3 || string(a.State) != "state3" {
		t.Fatalf("a did not take over from b, dead: %+v", a)
	}

	// Every key of a pool is in one hash slot (Redis Cluster).
	keys := quotaKeys(pool)
	for _, k := range keys[1:] {
		if keySlot(k) != keySlot(keys[0]) {
			t.Errorf("keys %q and %q are in different slots", keys[0], k)
		}
	}
	// They expire once nobody writes.
	ttl, err := redisDo(t, srv.Addr, "PTTL", keys[0])
	if n, _ := ttl.(int64); err != nil || n <= 0 || n > time.Minute.Milliseconds() {
		t.Errorf("PTTL of the lease = %v %v, want at most Keep", ttl, err)
	}
}

// TestQuotaStarted: the first replica to ask sets when the shared pools
// started; after Redis lost its data, they start again.
func TestQuotaStarted(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr})
	first, err := s.QuotaStarted(t.Context(), "", quotaEpoch)
	if err != nil || !first.Equal(quotaEpoch) {
		t.Fatalf("QuotaStarted = %v %v, want %v", first, err, quotaEpoch)
	}
	if again, err := s.QuotaStarted(t.Context(), "", quotaEpoch.Add(time.Hour)); err != nil || !again.Equal(quotaEpoch) {
		t.Fatalf("QuotaStarted again = %v %v, want still %v", again, err, quotaEpoch)
	}
	if other, _ := s.QuotaStarted(t.Context(), "prefix_", quotaEpoch.Add(time.Minute)); !other.Equal(quotaEpoch.Add(time.Minute)) {
		t.Errorf("another CACHE_KEY_PREFIX shares the start: %v", other)
	}
	if _, err := redisDo(t, srv.Addr, "FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	// The scripts are gone too: NOSCRIPT is answered with EVAL.
	if _, err := redisDo(t, srv.Addr, "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if lost, err := s.QuotaStarted(t.Context(), "", quotaEpoch.Add(time.Hour)); err != nil || !lost.Equal(quotaEpoch.Add(time.Hour)) {
		t.Fatalf("QuotaStarted after the data was lost = %v %v, want the caller's time", lost, err)
	}
	if r := quotaSync(t, s, quota.SyncRequest{Pool: "p", Replica: "a", Now: quotaEpoch}); !r.Owner {
		t.Fatalf("sync after SCRIPT FLUSH = %+v", r)
	}
}

// TestQuotaShareUnavailable: with Redis down, every exchange fails alone
// with an error that says so, quickly.
func TestQuotaShareUnavailable(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr, Timeout: time.Second})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	reps := s.SyncQuota(t.Context(), []quota.SyncRequest{{Pool: "a", Replica: "r", Now: quotaEpoch}, {Pool: "b", Replica: "r", Now: quotaEpoch}})
	for i, r := range reps {
		if !errors.Is(r.Err, limiter.ErrUnavailable) || r.Owner {
			t.Errorf("sync %d with Redis down = %+v, want ErrUnavailable", i, r)
		}
	}
	for _, err := range s.CommitQuota(t.Context(), []quota.CommitRequest{{Pool: "a", Replica: "r", Epoch: 1}}, nil) {
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("commit with Redis down = %v, want ErrUnavailable", err)
		}
	}
}

// TestSyncReplyHostile: a reply no correct Redis gives fails its pool
// with errBadReply, and never panics.
func TestSyncReplyHostile(t *testing.T) {
	t.Parallel()
	req := quota.SyncRequest{Push: []quota.Push{{Sub: "1"}}, Want: []string{"1"}}
	tests := []struct {
		name string
		give any
	}{
		{"nil", nil},
		{"integer", int64(1)},
		{"short", []any{int64(0)}},
		{"owner_of_five", []any{int64(1), int64(0), int64(1), []any{int64(0)}, []any{nil}}},
		{"follower_of_seven", []any{int64(0), int64(0), int64(1), []any{int64(0)}, []any{}, nil, []any{}}},
		{"negative_epoch", []any{int64(0), int64(0), int64(-1), []any{int64(0)}, []any{nil}}},
		{"flag_two", []any{int64(2), int64(0), int64(1), []any{int64(0)}, []any{nil}}},
		{"merged_missing", []any{int64(0), int64(0), int64(1), []any{}, []any{nil}}},
		{"merged_not_flag", []any{int64(0), int64(0), int64(1), []any{"x"}, []any{nil}}},
		{"grants_missing", []any{int64(0), int64(0), int64(1), []any{int64(0)}, []any{}}},
		{"grant_integer", []any{int64(0), int64(0), int64(1), []any{int64(0)}, []any{int64(5)}}},
		{"reports_odd", []any{int64(1), int64(1), int64(1), []any{int64(0)}, []any{"1"}, nil, []any{}}},
		{"report_integer", []any{int64(1), int64(1), int64(1), []any{int64(0)}, []any{"1", int64(2)}, nil, []any{}}},
		{"state_integer", []any{int64(1), int64(1), int64(1), []any{int64(0)}, []any{}, int64(3), []any{}}},
		{"stored_not_list", []any{int64(1), int64(1), int64(1), []any{int64(0)}, []any{}, nil, "x"}},
		{"stored_odd", []any{int64(1), int64(1), int64(1), []any{int64(0)}, []any{}, nil, []any{"1"}}},
		{"stored_integer", []any{int64(1), int64(1), int64(1), []any{int64(0)}, []any{}, nil, []any{"1", int64(1)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := syncReply(tt.give, req); !errors.Is(r.Err, errBadReply) {
				t.Errorf("syncReply(%v) = %+v, want errBadReply", tt.give, r)
			}
		})
	}
	good := syncReply([]any{int64(1), int64(1), int64(2), []any{int64(1)}, []any{"1", "r"}, "s", []any{"1", "g"}}, req)
	if good.Err != nil || !good.Owner || !good.Fresh || good.Epoch != 2 || string(good.State) != "s" || len(good.Reports) != 1 ||
		!slices.EqualFunc(good.Stored, []quota.Field{{Sub: "1", Value: []byte("g")}}, fieldEqual) {
		t.Errorf("syncReply of a good reply = %+v", good)
	}
}

func fieldEqual(a, b quota.Field) bool { return a.Sub == b.Sub && string(a.Value) == string(b.Value) }

// redisDo runs one command on addr with a client of its own.
func redisDo(t *testing.T, addr string, args ...any) (any, error) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, Protocol: 2})
	defer c.Close()
	return c.Do(t.Context(), args...).Result()
}

// TestQuotaBeat: replicas that beat are alive until they stop for Alive;
// notes left for a replica are taken by its next beat, once.
func TestQuotaBeat(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s := newStore(t, Config{URL: srv.Addr})
	now := quotaEpoch
	beat := func(replica string, at time.Time) quota.BeatReply {
		t.Helper()
		rep, err := s.BeatQuota(t.Context(), quota.Beat{Scope: "sc", Replica: replica, Now: at, Alive: 3 * time.Second, Keep: time.Minute, Max: 100})
		if err != nil {
			t.Fatalf("beat of %s: %v", replica, err)
		}
		slices.Sort(rep.Alive)
		slices.Sort(rep.Tags)
		return rep
	}
	if r := beat("a", now); !slices.Equal(r.Alive, []string{"a"}) || len(r.Tags) != 0 {
		t.Fatalf("first beat = %+v, want a alone and no notes", r)
	}
	errs := s.CommitQuota(t.Context(), nil, []quota.Note{
		{Scope: "sc", Replica: "a", Tag: "p1"}, {Scope: "sc", Replica: "a", Tag: "p2"},
		{Scope: "sc", Replica: "a", Tag: "p1"}, {Scope: "other", Replica: "a", Tag: "p3"},
	})
	if len(errs) != 0 {
		t.Fatalf("notes alone gave %d errors", len(errs))
	}
	if r := beat("b", now.Add(2*time.Second)); !slices.Equal(r.Alive, []string{"a", "b"}) || len(r.Tags) != 0 {
		t.Fatalf("b's beat = %+v, want a and b alive, and no notes for b", r)
	}
	if r := beat("a", now.Add(2*time.Second)); !slices.Equal(r.Tags, []string{"p1", "p2"}) {
		t.Fatalf("a's beat = %+v, want its notes of its scope, once each", r)
	}
	if r := beat("a", now.Add(3*time.Second)); len(r.Tags) != 0 {
		t.Fatalf("notes taken twice: %+v", r)
	}
	if r := beat("b", now.Add(6*time.Second+time.Millisecond)); !slices.Equal(r.Alive, []string{"b"}) {
		t.Fatalf("b's beat 3 s after a's last = %+v, want b alone", r)
	}
}
