package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
)

// drain is the service's documented shutdown bound (src/server).
const drain = 10 * time.Second

// inFlight counts the goroutines of the service inside ShouldRateLimit,
// from the debug listener's goroutine profile.
func (p *proc) inFlight() int {
	resp, err := http.Get("http://" + p.debug + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	// Each stack starts with "<count> @ <pcs>"; count the stacks that run
	// the service's ShouldRateLimit.
	for stack := range strings.SplitSeq(string(b), "\n\n") {
		if strings.Contains(stack, "service.(*Service).ShouldRateLimit") {
			c, _ := strconv.Atoi(strings.Fields(stack)[0])
			n += c
		}
	}
	return n
}

// TestShutdownWithinDrainWhileRedisIsFrozen freezes Redis (SIGSTOP) under a
// 60 s REDIS_TIMEOUT with gRPC and /json requests waiting on it: SIGTERM
// still ends the process within the drain and a second, and every request
// in flight gets an answer (an error) instead of waiting for Redis.
func TestShutdownWithinDrainWhileRedisIsFrozen(t *testing.T) {
	slow(t)
	r := harness.StartRedis(t, harness.RedisOptions{})
	// REQUEST_TIMEOUT=0: requests wait for the store's own 60 s timeout.
	// The race detector sleeps a second before exiting (atexit_sleep_ms),
	// which is not the service's time.
	p := start(t, map[string]string{"shared.yaml": sharedRules},
		redisEnv(r, "REDIS_TIMEOUT=60s", "REQUEST_TIMEOUT=0", "GORACE=atexit_sleep_ms=0")...)
	c := p.client(t)
	if _, err := c.ShouldRateLimit(callCtx(t), request("shared", "user", "warm")); err != nil {
		t.Fatal(err)
	}
	if err := r.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Thaw() })

	const calls = 8
	answered := make(chan error, 2*calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			_, err := c.ShouldRateLimit(ctx, request("shared", "user", fmt.Sprint("frozen", i)))
			answered <- err
		})
		wg.Go(func() {
			hc := &http.Client{Timeout: 2 * time.Minute}
			resp, err := hc.Post("http://"+p.http+"/json", "application/json",
				strings.NewReader(fmt.Sprintf(`{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"json%d"}]}]}`, i)))
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("/json answered %d", resp.StatusCode)
			}
			answered <- err
		})
	}
	eventually(t, "requests waiting on the frozen Redis", 30*time.Second, func() bool { return p.inFlight() >= calls })

	p.signal(t, syscall.SIGTERM)
	began := time.Now()
	// What this guards against is a wait for the frozen store, whose
	// timeout is 60 s. The exit's own work after the drain (closing the
	// connections, the last statistics) takes a few milliseconds on a
	// quiet machine and took over a second beside a busy suite, so the
	// margin is half the way from the drain to the store's timeout.
	code := p.wait(t, drain+(60*time.Second-drain)/2)
	t.Logf("exited %v after SIGTERM (drain %v)", time.Since(began), drain)
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	// The process is gone: every request has its answer by now or soon.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("requests still waiting 30 s after the service exited")
	}
	close(answered)
	for err := range answered {
		if err == nil {
			t.Error("a request waiting on a frozen Redis succeeded")
		}
	}
}
