package memcached

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestMemory reads stats settings of real servers: the cap (-m) and
// whether memcached evicts (its default) or refuses (-M).
func TestMemory(t *testing.T) {
	t.Parallel()
	evicting := harness.StartMemcached(t, "-m", "4")
	refusing := harness.StartMemcached(t, "-m", "8", "-M")
	s := newStore(t, Config{Addrs: []string{evicting.Addr, refusing.Addr}, Timeout: time.Second})
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := s.Memory(t.Context())
	want := []Memory{
		{Server: evicting.Addr, Known: true, MaxBytes: 4 << 20, Evictions: true},
		{Server: refusing.Addr, Known: true, MaxBytes: 8 << 20, Evictions: false},
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] || !got[0].Evicts() || got[1].Evicts() {
		t.Errorf("Memory() = %+v, want %+v", got, want)
	}
	if err := refusing.Stop(); err != nil {
		t.Fatal(err)
	}
	if got := s.Memory(t.Context()); got[1].Known || got[1].Server != refusing.Addr {
		t.Errorf("Memory() with a server down = %+v, want it unknown", got[1])
	}
}
