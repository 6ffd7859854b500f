package stats

import (
	"strconv"
	"testing"
	"time"
)

// BenchmarkTimerRecord is the cost a decision pays for the response-time
// timer, with every CPU recording into the same buckets.
func BenchmarkTimerRecord(b *testing.B) {
	var tm Timer
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := 180 * time.Microsecond
		for pb.Next() {
			tm.Record(d)
			d += 7 * time.Nanosecond
		}
	})
	if tm.Count() == 0 {
		b.Fatal("nothing recorded")
	}
}

// BenchmarkStatsdFlush is one flush of 1000 rules' six counters (the
// default STATS_MAX_DYNAMIC_KEYS of request-made keys, all moved since the
// last flush) and a busy timer, to a real UDP socket.
func BenchmarkStatsdFlush(b *testing.B) {
	u := newUDPSink(b)
	go func() {
		for range u.grams {
		}
	}()
	r := NewRegistry()
	var cs []*Counter
	for i := range 1000 {
		for _, stat := range []string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode", "over_limit_with_local_cache"} {
			cs = append(cs, r.RuleCounter("web", []string{"remote_address_10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)}, stat))
		}
	}
	tm := r.Timer("ratelimit_server.ShouldRateLimit.response_time")
	s := NewStatsd(r, StatsdConfig{Addr: u.addr()})
	b.ReportAllocs()
	for b.Loop() {
		for _, c := range cs {
			c.Inc()
		}
		for i := range 200 {
			tm.Record(time.Duration(100+i) * time.Microsecond)
		}
		if err := s.Flush(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	if len(s.names) < 6000 {
		b.Fatalf("%d names encoded, want 6000", len(s.names))
	}
}
