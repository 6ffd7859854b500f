package integration

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"golang.org/x/net/http2"
)

// liveHeap forces a garbage collection in p (through pprof) and returns
// the heap it keeps, in bytes.
func (p *proc) liveHeap(t *testing.T) int64 {
	t.Helper()
	resp, err := http.Get("http://" + p.debug + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// /stats reads the runtime's figures at most once a second.
	time.Sleep(1100 * time.Millisecond)
	return p.stats(t)["ratelimit.go.heapAlloc"]
}

// TestUnreadableAnswersAreBounded opens connections that grant the server
// no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE 0) and fill each
// with calls, as a client that never reads would: their answers cannot be
// written. They piled up as long as the connections stayed: 300 such
// connections, 149,000 stuck calls, RSS 21 to 575 MB; here 32 of 1,024
// calls each kept about 2.3 KB each live in the heap (75 MB), RSS twice
// that. Now the answers waiting on flow control are bounded in all
// (4096), connections being closed from the one holding the most, and a
// connection that lets no answer out for 10 s is closed.
func TestUnreadableAnswersAreBounded(t *testing.T) {
	slow(t)
	busyParallel(t)
	const conns, calls = 32, 1024
	p := launchWith(t, launchOpts{binary: plainBinary(t)}, map[string]string{"web.yaml": webRules})
	p.waitHealth(t, http.StatusOK)
	c := p.client(t)
	for i := range 50 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", fmt.Sprint("warm", i))); err != nil {
			t.Fatal(err)
		}
	}
	base := p.liveHeap(t)

	clients := make([]*h2Client, conns)
	var wg sync.WaitGroup
	for i := range clients {
		clients[i] = dialH2(t, p.grpc, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		wg.Go(func() {
			// Until the server closes the connection.
			for j := range calls {
				if _, err := clients[i].call(p.grpc, request("web", "user", fmt.Sprint("stuck", i, ".", j))); err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	// Every call is answered (its headers came back) or its connection
	// was closed.
	eventually(t, "every call answered or its connection closed", 60*time.Second, func() bool {
		for _, h := range clients {
			if !h.closed() && h.answered() < calls {
				return false
			}
		}
		return true
	})
	waiting := p.stats(t)["ratelimit.server.grpc_answers_waiting"]
	if waiting > 4096 {
		t.Errorf("grpc_answers_waiting = %d, want at most 4096", waiting)
	}
	grew := p.liveHeap(t) - base
	t.Logf("heap %d KB, then %d KB more with %d answers waiting on flow control", base>>10, grew>>10, waiting)
	// 4096 answers of a few KB, and the connections' buffers.
	if grew > 32<<20 {
		t.Errorf("the heap kept %d MB more with calls stuck on flow control; want under 32 MB", grew>>20)
	}
	harness.WaitForNil(t, 60*time.Second, "every connection that lets no answer out closed", func() error {
		for i, h := range clients {
			if !h.closed() {
				return fmt.Errorf("connection %d still open", i)
			}
		}
		return nil
	})
	st := p.stats(t)
	if st["ratelimit.server.grpc_stalled_connections_closed"] != conns || st["ratelimit.server.grpc_answers_waiting"] != 0 {
		t.Errorf("/stats: grpc_stalled_connections_closed %d, grpc_answers_waiting %d; want %d and 0",
			st["ratelimit.server.grpc_stalled_connections_closed"], st["ratelimit.server.grpc_answers_waiting"], conns)
	}
}

// TestHalfSentCallsHoldNoPlace opens 4 connections of 1,024 calls whose
// message never comes (headers alone), as many as MAX_CONCURRENT_REQUESTS
// (4096): an ordinary call is still decided, and each of those calls is
// ended (DeadlineExceeded) 10 s after its headers, its connection left
// open. Before, each such call took a place among the decisions in
// flight as its headers arrived and held it until its caller's deadline
// (none here: for ever), so every other call was refused with
// ResourceExhausted, which Envoy's default failure_mode_deny: false
// admits: the limits were off for everyone.
func TestHalfSentCallsHoldNoPlace(t *testing.T) {
	slow(t)
	t.Parallel() // one of the long tests that mostly wait: see TestMain
	p := start(t, map[string]string{"web.yaml": webRules})
	var wg sync.WaitGroup
	var conns []*h2Client
	for range 4 {
		h := dialH2(t, p.grpc)
		conns = append(conns, h)
		wg.Go(func() {
			for range 1024 {
				if _, err := h.open(p.grpc); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	c := p.client(t)
	// The server reads the headers as they come; a call made once it has
	// read them all would have been refused.
	time.Sleep(time.Second)
	for i := range 5 {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", fmt.Sprint("ordinary", i))); err != nil {
			t.Fatalf("an ordinary call beside 4,096 half-sent ones: %v", err)
		}
	}
	// Each half-sent call held one of grpc-go's goroutines waiting for its
	// message, for ever: now a call whose request is not whole 10 s after
	// its headers is answered and its goroutine ends; its connection,
	// which other calls may be using, stays. (The ordinary calls' own
	// requests, not whole for an instant, may take the count past its
	// bound, 4096, which closes the connection holding the most at once.)
	eventually(t, "every half-sent call answered", 60*time.Second, func() bool {
		for _, h := range conns {
			if !h.closed() && h.answered() < 1024 {
				return false
			}
		}
		return true
	})
	open := 0
	for _, h := range conns {
		if !h.closed() {
			open++
		}
	}
	st := p.stats(t)
	if closed := st["ratelimit.server.grpc_stalled_connections_closed"]; open < 3 || closed != int64(4-open) {
		t.Errorf("%d of 4 connections open, %d closed by the bound of requests not whole; want at least 3 open, and only those closed", open, closed)
	}
	if got := st["ratelimit.server.grpc_stalled_calls_ended"]; got < int64(1024*open) {
		t.Errorf("grpc_stalled_calls_ended = %d, want at least %d", got, 1024*open)
	}
	if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", "after")); err != nil {
		t.Errorf("an ordinary call once they are ended: %v", err)
	}
}
