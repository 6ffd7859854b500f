package redis

import (
	"testing"

	"github.com/ratelimitd/ratelimit/harness"
)

// TestConnStats counts the connections to a real redis-server as the
// anchor's redis_pool statistics do: made, closed by this side, open.
func TestConnStats(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t, harness.RedisOptions{})
	s, err := New(t.Context(), Config{URL: srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := s.Conns(false)
	if c.Opened < 1 || c.Active() < 1 || c.Active() != int64(c.Opened-c.Closed) {
		t.Errorf("after Redis answered: %+v, active %d; want at least one open", c, c.Active())
	}
	if ps := s.Conns(true); ps != (ConnStats{}) {
		t.Errorf("per-second Redis without one = %+v, want zero", ps)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if c := s.Conns(false); c.Active() != 0 || c.Closed != c.Opened {
		t.Errorf("after Close: %+v, active %d; want every connection closed", c, c.Active())
	}
}
