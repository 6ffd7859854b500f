package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestGRPCConnectionCapMakesNewConnectionsWait fills GRPC_MAX_CONNECTIONS
// with two working clients and two silent connections: a fifth client
// waits while the two working ones keep being served; when the handshake
// timeout drops the silent ones, the fifth is served.
func TestGRPCConnectionCapMakesNewConnectionsWait(t *testing.T) {
	p := start(t, map[string]string{"web.yaml": webRules}, "GRPC_MAX_CONNECTIONS=4")
	working := []rlsv3.RateLimitServiceClient{p.client(t), p.client(t)}
	for i, c := range working {
		if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", fmt.Sprint("w", i))); err != nil {
			t.Fatal(err)
		}
	}
	var silent []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", p.grpc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		silent = append(silent, c)
	}
	// Once it accepted the fourth, the listener waits for a free slot and
	// logs that it is at its cap.
	eventually(t, "the cap logged", 20*time.Second, func() bool { return strings.Contains(p.logs(), "GRPC_MAX_CONNECTIONS") })
	silentAt := time.Now()

	fifth := p.client(t)
	waited := make(chan error, 1)
	ctx := callCtx(t)
	go func() {
		// WaitForReady: the client keeps trying to connect instead of
		// failing at its first attempt, as Envoy's pool does.
		_, err := fifth.ShouldRateLimit(ctx, request("web", "user", "fifth"), grpc.WaitForReady(true))
		waited <- err
	}()
	// While the fifth waits, the working clients are served.
	for i := range 10 {
		for j, c := range working {
			if _, err := c.ShouldRateLimit(callCtx(t), request("web", "user", fmt.Sprint("w", j, i))); err != nil {
				t.Errorf("a connected client at the cap: %v", err)
			}
		}
	}
	// callCtx gives the fifth 5 s, less than the 10 s handshake timeout
	// that frees the silent slots.
	if err := <-waited; status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a client beyond GRPC_MAX_CONNECTIONS: %v, want DeadlineExceeded (waiting)", err)
	}
	// The silent connections are dropped by the handshake timeout (10 s).
	for _, c := range silent {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("a silent connection: %v, want it closed by the server", err)
		}
	}
	if d := time.Since(silentAt); d > 40*time.Second {
		t.Errorf("silent connections lived %v; the handshake timeout is 10 s", d)
	}
	eventually(t, "the fifth client served", 30*time.Second, func() bool {
		_, err := fifth.ShouldRateLimit(callCtx(t), request("web", "user", "fifth"), grpc.WaitForReady(true))
		return err == nil
	})
}

// TestConnectionCapsFitTheOpenFileLimit starts the service with 400 open
// files: the caps are lowered (and logged) so that the listeners together
// keep a reserve, and the lowered HTTP cap really applies.
func TestConnectionCapsFitTheOpenFileLimit(t *testing.T) {
	p := launchWith(t, launchOpts{nofile: 400}, map[string]string{"web.yaml": webRules})
	p.waitHealth(t, 200)
	// 400 - 256 reserved = 144, shared in proportion by 10000 (gRPC) and
	// 2 x 1024 (HTTP and debug): 119 and 12.
	logs := p.logs()
	if !strings.Contains(logs, "connection caps lowered") || !strings.Contains(logs, "GRPC_MAX_CONNECTIONS=119") || !strings.Contains(logs, "HTTP_MAX_CONNECTIONS=12") {
		t.Fatalf("no log of the lowered caps (want 119 and 12):\n%s", logs)
	}
	http.DefaultClient.CloseIdleConnections()
	for range 12 {
		c, err := net.Dial("tcp", p.http)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	waiting := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := waiting.Get("http://" + p.http + "/healthcheck"); err == nil {
		resp.Body.Close()
		t.Errorf("/healthcheck with 12 connections held answered %d; want it to wait at the lowered cap", resp.StatusCode)
	}
	if resp, err := waiting.Get("http://" + p.debug + "/stats"); err != nil {
		t.Errorf("the debug listener with the HTTP one at its cap: %v", err)
	} else {
		resp.Body.Close()
	}
	if _, err := p.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "nofile")); err != nil {
		t.Errorf("gRPC with the HTTP listener at its cap: %v", err)
	}
}
