package server

import (
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimit/harness"
)

// warnings returns the lines at warn level that hold substr.
func (s *syncBuffer) warnings(substr string) []string {
	var out []string
	for _, l := range strings.Split(s.String(), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// http1Request is what an Envoy cluster left at HTTP/1.1 sends the gRPC
// port.
const http1Request = "POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\r\nHost: ratelimit\r\n" +
	"Content-Type: application/grpc\r\nContent-Length: 0\r\n\r\n"

// sendRaw connects to addr, through TLS when cfg is not nil, writes what,
// and reads until the server closes the connection.
func sendRaw(t *testing.T, addr string, cfg *tls.Config, what string) {
	t.Helper()
	var c net.Conn
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Bounds a test that fails, nothing else: grpc-go closes the
	// connection at its handshake timeout whatever happens.
	_ = c.SetDeadline(time.Now().Add(2 * grpcHandshakeTimeout))
	if cfg != nil {
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			return // refused in the handshake
		}
		c = tc
	}
	if _, err := io.WriteString(c, what); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// alpn sets the protocols cfg offers, for a server at 127.0.0.1.
func alpn(cfg *tls.Config, protos ...string) *tls.Config {
	cfg.NextProtos = protos
	cfg.ServerName = "127.0.0.1"
	return cfg
}

// TestProtocolMistakesWarned: a client that speaks HTTP/1.x, or TLS to the
// plaintext port, or plaintext to the TLS port, gets the connection closed
// and the log a warning naming the fix, at most one a second per kind;
// gRPC clients that speak right get none.
func TestProtocolMistakesWarned(t *testing.T) {
	ca := harness.NewCA(t, "server CA")
	sec := harness.NewSecretDir(t, secretFiles(ca.Server(t), nil))
	tests := []struct {
		name   string
		tls    bool
		client func(t *testing.T, addr string)
		want   []string
	}{
		{"http1_on_plaintext", false, func(t *testing.T, addr string) { sendRaw(t, addr, nil, http1Request) },
			[]string{"speaks HTTP/1.x", "explicit_http_config: {http2_protocol_options: {}}", "http2_protocol_options: {}", `first_bytes="POST /envoy`}},
		{"tls_on_plaintext", false, func(t *testing.T, addr string) {
			sendRaw(t, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}, "")
		}, []string{"speaks TLS", "GRPC_SERVER_USE_TLS=true", "transport_socket"}},
		{"h2c_on_tls", true, func(t *testing.T, addr string) { sendRaw(t, addr, nil, http2.ClientPreface) },
			[]string{"speaks plaintext HTTP/2", "transport_socket", "GRPC_SERVER_USE_TLS=false", `first_bytes="PRI *"`}},
		{"http1_on_tls", true, func(t *testing.T, addr string) { sendRaw(t, addr, nil, http1Request) },
			[]string{"speaks plaintext, not HTTP/2 either", "transport_socket", "explicit_http_config"}},
		{"tls_http1_alpn_on_tls", true, func(t *testing.T, addr string) {
			sendRaw(t, addr, alpn(harness.ClientConfig(nil, ca), "http/1.1"), http1Request)
		}, []string{"does not offer HTTP/2 (ALPN h2)", "explicit_http_config"}},
		{"tls_no_alpn_on_tls", true, func(t *testing.T, addr string) {
			sendRaw(t, addr, alpn(harness.ClientConfig(nil, ca)), http1Request)
		}, []string{"does not offer HTTP/2 (ALPN h2)", "explicit_http_config"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"GRPC_SERVER_USE_TLS": "false"}
			creds := insecure.NewCredentials()
			if tt.tls {
				env = tlsEnv(sec, false, "")
				creds = credentials.NewTLS(harness.ClientConfig(nil, ca))
			}
			var logs syncBuffer
			srv, _ := build(t, serverRules, env, &logs)
			run(t, srv)
			addr := srv.Addrs().GRPC.String()

			// A client that speaks right is served, and warned of by no line.
			cc := dialWith(t, srv, creds)
			eventually(t, "a right client served", func() bool {
				r, err := healthpb.NewHealthClient(cc).Check(t.Context(), &healthpb.HealthCheckRequest{Service: rlsServiceName})
				return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
			})
			if got := logs.warnings("gRPC port"); len(got) != 0 {
				t.Fatalf("a right client was warned of: %q", got)
			}

			began := time.Now()
			tt.client(t, addr)
			eventually(t, "the warning", func() bool { return len(logs.warnings("gRPC port")) > 0 })
			first := logs.warnings("gRPC port")[0]
			for _, w := range tt.want {
				if !strings.Contains(first, w) {
					t.Errorf("warning %q lacks %q", first, w)
				}
			}
			// More of the same: one line a second at most.
			for range 20 {
				tt.client(t, addr)
			}
			elapsed := time.Since(began)
			if got, most := len(logs.warnings("gRPC port")), int(elapsed/time.Second)+1; got > most {
				t.Errorf("21 mistakes in %v logged %d lines, want at most %d", elapsed, got, most)
			}
		})
	}
}
