package server

import (
	"log/slog"
	"strings"
	"testing"

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
	steps := []struct {
		healthy bool
		open    int64
		want    string
	}{
		{false, 0, "does not answer yet"},
		{false, 0, ""},
		{true, 0, "answers again"},
		{true, 0, ""},
		{true, 2, "breakers opened"},
		{false, 2, "stopped answering"},
		{false, 2, ""},
		{true, 0, "answers again"},
	}
	for i, s := range steps {
		b.Reset()
		open = s.open
		st.log(log, s.healthy, breakers)
		got := b.String()
		if s.want == "" && got != "" || s.want != "" && (!strings.Contains(got, s.want) || !strings.Contains(got, "level=WARN")) {
			t.Errorf("step %d (healthy %v, open %d): logged %q, want %q", i, s.healthy, s.open, got, s.want)
		}
	}
	if !strings.Contains(b.String(), "all closed again") {
		t.Errorf("breakers closing not logged: %q", b.String())
	}
}
