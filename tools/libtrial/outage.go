package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// event is one call of the outage trial.
type event struct {
	at, took time.Duration // since the trial's start
	err      error
}

// outage phases, from the start of a variant's trial.
const (
	outageBefore  = 500 * time.Millisecond // Redis up
	outageLength  = 2 * time.Second        // Redis stopped
	outageCallers = 8
	outagePace    = 5 * time.Millisecond // between a caller's calls
	outageAfter   = 3 * time.Second      // Redis up again: time allowed to recover
	outageMaxEv   = 4096                 // events kept per caller
)

// outageTrial kills redis-server (SIGKILL) under a light load, for each
// variant, and starts it again: it reports whether calls fail within the
// request timeout while Redis is down, and how long after the restart the
// first call succeeds again.
func outageTrial(w io.Writer, srv *harness.RedisServer, timeout time.Duration) {
	fmt.Fprintf(w, "Outage: %d callers, a call every %v each, request timeout %v; redis-server killed for %v, then started again.\n\n",
		outageCallers, outagePace, timeout, outageLength)
	fmt.Fprintln(w, "| client | calls while down | failed | p50 of failures ms | slowest failure ms | over the timeout | first success after restart ms | failures after recovery | hits applied after failing |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, v := range variants {
		cl, err := v.make(srv.Addr, timeout)
		if err != nil {
			fmt.Fprintf(w, "| %s | could not start: %v |\n", v.name, err)
			continue
		}
		fmt.Fprintln(w, outageOne(srv, cl, v.name, timeout))
		cl.close()
	}
}

func outageOne(srv *harness.RedisServer, cl client, name string, timeout time.Duration) string {
	start := time.Now()
	var wg sync.WaitGroup
	events := make([][]event, outageCallers)
	end := outageBefore + outageLength + outageAfter
	var starting, restarted time.Duration
	for g := range outageCallers {
		wg.Go(func() {
			c := &caller{keys: []string{fmt.Sprintf("outage_%d", g)}}
			for time.Since(start) < end && len(events[g]) < outageMaxEv {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				t := time.Now()
				err := cl.decide(ctx, c)
				cancel()
				events[g] = append(events[g], event{at: t.Sub(start), took: time.Since(t), err: err})
				time.Sleep(outagePace)
			}
		})
	}
	time.Sleep(outageBefore)
	down := time.Since(start)
	_ = srv.Stop()
	time.Sleep(outageLength)
	starting = time.Since(start)
	if err := srv.Start(); err != nil {
		return fmt.Sprintf("| %s | restart failed: %v |", name, err)
	}
	restarted = time.Since(start) // Redis answers from here on
	wg.Wait()

	var failures []time.Duration
	whileDown, over := 0, 0
	firstOK := time.Duration(-1)
	var lastErr error
	for _, evs := range events {
		for _, e := range evs {
			switch {
			case e.at >= down && e.at < starting:
				whileDown++
				if e.err != nil {
					failures = append(failures, e.took)
					lastErr = e.err
					if e.took > timeout+50*time.Millisecond {
						over++
					}
				}
			case e.at+e.took >= starting && e.err == nil:
				if firstOK < 0 || e.at+e.took < firstOK {
					firstOK = e.at + e.took
				}
			}
		}
	}
	// Redis keeps no data across the restart (no persistence): each
	// caller's counter must equal its calls that succeeded after it. More
	// means a call reported failed was applied late, a double count when
	// the caller retries or the request is counted elsewhere.
	after, late := 0, int64(0)
	for g, evs := range events {
		ok := int64(0)
		for _, e := range evs {
			if firstOK >= 0 && e.at > firstOK && e.err != nil {
				after++
			}
			if e.at+e.took >= starting && e.err == nil {
				ok++
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := srv.Do(ctx, "GET", fmt.Sprintf("outage_%d", g))
		cancel()
		if s, isStr := v.(string); err == nil && isStr {
			n, _ := strconv.ParseInt(s, 10, 64)
			late += n - ok
		}
	}
	slices.Sort(failures)
	p50, slowest := time.Duration(0), time.Duration(0)
	if len(failures) > 0 {
		p50, slowest = failures[len(failures)/2], failures[len(failures)-1]
	}
	rec := "never"
	if firstOK >= 0 {
		rec = fmt.Sprintf("%.0f", float64(max(firstOK-restarted, 0))/1e6)
	}
	if lastErr != nil {
		fmt.Printf("  (%s: last error while down: %v)\n", name, lastErr)
	}
	return fmt.Sprintf("| %s | %d | %d | %.2f | %.0f | %d | %s | %d | %d |", name, whileDown, len(failures),
		float64(p50)/1e6, float64(slowest)/1e6, over, rec, after, late)
}
