package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// The service's HTTP timeouts (src/server/httpserver.go), which the slow
// clients below must run into.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 15 * time.Second
)

// openFiles counts the process's open file descriptors.
func (p *proc) openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("reading the service's open files: %v", err)
	}
	return len(fds)
}

// slowClient holds one connection to addr, sending head at once and then
// one byte of trickle per second, until the server closes the connection.
// It reports how long the connection lived on lived.
func slowClient(t *testing.T, addr, head string, trickle byte, lived chan<- time.Duration) {
	// Timed from before the dial: the server may accept, and start its
	// clock, before this goroutine runs again on a loaded machine.
	began := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Errorf("slow client: %v", err)
		lived <- -1
		return
	}
	closed := make(chan struct{})
	go func() {
		defer c.Close()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		if _, err := io.WriteString(c, head); err != nil {
			return
		}
		for {
			select {
			case <-closed:
				return
			case <-tick.C:
				if _, err := c.Write([]byte{trickle}); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		// The server may answer (400 for a body it gave up on) before it
		// closes; either way the read ends when the connection does.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		_, _ = io.Copy(io.Discard, c)
		lived <- time.Since(began)
		close(closed)
	}()
}

// TestSlowClientsAreCutWhileOthersAreServed holds 500 connections on the
// HTTP port, half sending their headers one byte a second and half their
// body: the timeouts cut them, the open files stay bounded by them, and
// /healthcheck, /json and gRPC answer promptly all along.
func TestSlowClientsAreCutWhileOthersAreServed(t *testing.T) {
	slow(t)
	// Most of its time is spent waiting for the timeouts to cut the slow
	// clients, which trickle a byte a second: it runs beside the other
	// waiting tests, off the suite's serial path.
	t.Parallel()
	// The 500 slow clients and the others all come from 127.0.0.1: no
	// share of its own per address.
	p := start(t, map[string]string{"web.yaml": webRules}, "MAX_CONNECTIONS_PER_PEER_PERCENT=100")
	base := p.openFiles(t)
	const slow = 500
	type kind struct {
		name    string
		head    string
		trickle byte
		cut     time.Duration
	}
	kinds := []kind{
		{"headers", "GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: ", 'a', readHeaderTimeout},
		{"body", "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n", ' ', readTimeout},
	}
	lived := make([]chan time.Duration, len(kinds))
	for i, k := range kinds {
		lived[i] = make(chan time.Duration, slow)
		for range slow / len(kinds) {
			go slowClient(t, p.http, k.head, k.trickle, lived[i])
		}
	}
	began := time.Now()

	// Serve other clients while the slow connections are held and cut
	// (until 5 s past the body timeout): each request must answer within a
	// few seconds (generous for a loaded machine; they take milliseconds
	// when it is idle).
	const prompt = 5 * time.Second
	httpc := &http.Client{Timeout: 10 * time.Second}
	rls := p.client(t)
	var slowest time.Duration
	maxFiles := 0
	check := func(what string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			t.Errorf("%s with slow clients held: %v", what, err)
		}
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
	}
	for i := 0; time.Since(began) < readTimeout+5*time.Second; i++ {
		check("/healthcheck", func() error {
			resp, err := httpc.Get("http://" + p.http + "/healthcheck")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		})
		check("/json", func() error {
			resp, err := httpc.Post("http://"+p.http+"/json", "application/json",
				strings.NewReader(fmt.Sprintf(`{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"j%d"}]}]}`, i)))
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		})
		check("gRPC", func() error {
			_, err := rls.ShouldRateLimit(callCtx(t), request("web", "user", fmt.Sprint("g", i)))
			return err
		})
		maxFiles = max(maxFiles, p.openFiles(t))
		time.Sleep(200 * time.Millisecond) // pacing of the well-behaved client, not an assertion
	}
	if slowest > prompt {
		t.Errorf("the slowest answer to a well-behaved client took %v with slow clients held; want under %v", slowest, prompt)
	}
	// Each slow connection costs one descriptor; the margin is for the
	// well-behaved clients and the runtime.
	if maxFiles > base+slow+50 {
		t.Errorf("%d open files with %d slow clients (%d before); want at most %d", maxFiles, slow, base, base+slow+50)
	}
	for i, k := range kinds {
		var longest time.Duration
		for range slow / len(kinds) {
			select {
			case d := <-lived[i]:
				if d >= 0 && d < k.cut-time.Second {
					t.Errorf("a slow %s connection was cut after %v, before the %v timeout", k.name, d, k.cut)
				}
				longest = max(longest, d)
			case <-time.After(time.Minute):
				t.Fatalf("slow %s connections still open a minute after the %v timeout", k.name, k.cut)
			}
		}
		// Generous for a loaded machine: the point is that they end.
		if longest > k.cut+15*time.Second {
			t.Errorf("a slow %s connection lived %v; the timeout is %v", k.name, longest, k.cut)
		}
		t.Logf("slow %s connections cut after at most %v (timeout %v)", k.name, longest, k.cut)
	}
	eventually(t, "open files back to the baseline", 30*time.Second, func() bool { return p.openFiles(t) <= base+20 })
	t.Logf("open files: %d before, at most %d with %d slow clients; slowest other answer %v", base, maxFiles, slow, slowest)
}

// padded returns a valid request of descriptors no rule matches (so the
// store does no work), each with one value of 4000 bytes (the service
// refuses longer ones), padded to size bytes when marshalled.
