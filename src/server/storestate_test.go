package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/src/stats"
	"github.com/ratelimitd/ratelimit/src/store/breaker"
)

// Each change of the store's state is one warn line; nothing while it
// stays the same.
func TestStoreStateChangesAreLogged(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil))
	var open int64
	breakers := func() breaker.Stats { return breaker.Stats{Open: open} }
	var st storeState
	// back: the store has just answered (first, or after an outage), when
	// the service reads its memory policy again.
	steps := []struct {
		healthy bool
		open    int64
		want    string
		back    bool
	}{
		{false, 0, "does not answer yet", false},
		{false, 0, "", false},
		{true, 0, "answers again", true},
		{true, 0, "", false},
		{true, 2, "breakers opened", false},
		{false, 2, "stopped answering", false},
		{false, 2, "", false},
		{true, 0, "answers again", true},
		{true, 1, "breakers opened", false},
		{true, 0, "all closed again", true},
	}
	for i, s := range steps {
		b.Reset()
		open = s.open
		back := st.log(log, s.healthy, breakers)
		got := b.String()
		if s.want == "" && got != "" || s.want != "" && (!strings.Contains(got, s.want) || !strings.Contains(got, "level=WARN")) {
			t.Errorf("step %d (healthy %v, open %d): logged %q, want %q", i, s.healthy, s.open, got, s.want)
		}
		if back != s.back {
			t.Errorf("step %d (healthy %v, open %d): back %v, want %v", i, s.healthy, s.open, back, s.back)
		}
	}
}

// TestFirstHealthyIsBack: a store healthy at the first look has just
// answered too.
func TestFirstHealthyIsBack(t *testing.T) {
	var st storeState
	if !st.log(slog.New(slog.DiscardHandler), true, nil) {
		t.Error("the first look at a healthy store: back false, want true")
	}
}

// TestReportMemory: asked, the report reads every server, warns for
// each that may evict counters, and sets the gauges.
func TestReportMemory(t *testing.T) {
	var logs syncBuffer
	reg := stats.NewRegistry()
	b := &storeHandle{mem: newMemoryGauges(reg, "ratelimit.redis."), memory: func(context.Context) []storeMemory {
		return []storeMemory{
			{server: "redis 10.0.0.1:6379", known: true, maxBytes: 3 << 20, policy: "allkeys-lru", evicts: true},
			{server: "redis 10.0.0.2:6379", known: true, maxBytes: 2 << 20, policy: "noeviction"},
			{server: "redis 10.0.0.3:6379"},
		}
	}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.reportMemory(ctx, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	b.askMemory()
	eventually(t, "the memory reported", func() bool { return reg.Gauges()["ratelimit.redis.maxmemory_bytes"] == 2<<20 })
	cancel()
	<-done
	g := reg.Gauges()
	if g["ratelimit.redis.evicting_servers"] != 1 || g["ratelimit.redis.memory_unknown_servers"] != 1 {
		t.Errorf("gauges %v, want 1 evicting, 1 unknown", g)
	}
	out := logs.String()
	if strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "allkeys-lru") || !strings.Contains(out, "10.0.0.1:6379") {
		t.Errorf("logs: %s\nwant one warning, for 10.0.0.1 and allkeys-lru", out)
	}
}
