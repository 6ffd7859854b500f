package server

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestGRPCBounds(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"GRPC_MAX_RECV_MSG_SIZE": "2048"})
	rls := rlsv3.NewRateLimitServiceClient(dial(t, srv))
	withValue := func(n int) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: strings.Repeat("v", n)}},
		}}}
	}
	if _, err := rls.ShouldRateLimit(t.Context(), withValue(1900)); err != nil {
		t.Errorf("a message under GRPC_MAX_RECV_MSG_SIZE: %v", err)
	}
	_, err := rls.ShouldRateLimit(t.Context(), withValue(4000))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message over GRPC_MAX_RECV_MSG_SIZE: %v, want ResourceExhausted", err)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-pad", strings.Repeat("a", grpcMaxHeaderListSize))
	if _, err := rls.ShouldRateLimit(ctx, withValue(1)); status.Code(err) != codes.Internal {
		t.Errorf("metadata over %d bytes: %v, want Internal", grpcMaxHeaderListSize, err)
	}
	// The connection is still good.
	if _, err := rls.ShouldRateLimit(t.Context(), withValue(10)); err != nil {
		t.Errorf("after the refusals: %v", err)
	}
}

// TestJSONBodyBound: /json refuses a body over GRPC_MAX_RECV_MSG_SIZE with
// 413, whether its length is declared or it is chunked.
func TestJSONBodyBound(t *testing.T) {
	srv, _ := start(t, serverRules, map[string]string{"GRPC_MAX_RECV_MSG_SIZE": "2048"})
	base := "http://" + srv.Addrs().HTTP.String()
	eventually(t, "healthy", func() bool { c, _ := get(t, base+"/healthcheck"); return c == 200 })

	post := func(body io.Reader, size int64) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/json", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = size // -1: chunked, no length declared
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	valid := `{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"` + strings.Repeat("v", 1900) + `"}]}]}`
	tests := []struct {
		name string
		body string
		size int64
		want int
	}{
		{"at_the_bound", valid, int64(len(valid)), 200},
		{"declared_over_the_bound", strings.Repeat(" ", 2049), 2049, 413},
		{"chunked_over_the_bound", strings.Repeat(" ", 3000), -1, 413},
		{"chunked_under_the_bound", valid, -1, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := post(strings.NewReader(tt.body), tt.size); got != tt.want {
				t.Errorf("POST /json with %d bytes: %d, want %d", len(tt.body), got, tt.want)
			}
		})
	}
}

// HTTP/2 framing, just enough to read the gRPC server's SETTINGS and flood
// it with PINGs, neither of which grpc-go's client does on demand.
const (
	h2Settings = 0x4
	h2Ping     = 0x6
	h2GoAway   = 0x7

	h2MaxConcurrentStreams = 0x3
	h2MaxHeaderListSize    = 0x6
	h2EnhanceYourCalm      = 0xb
)

type h2Frame struct {
	typ, flags byte
	payload    []byte
}

func dialH2(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	writeH2(t, c, h2Settings, 0, nil)
	return c, bufio.NewReader(c)
}

func writeH2(t *testing.T, w io.Writer, typ, flags byte, payload []byte) {
	t.Helper()
	hdr := make([]byte, 9)
	hdr[0], hdr[1], hdr[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	hdr[3], hdr[4] = typ, flags
	if _, err := w.Write(append(hdr, payload...)); err != nil {
		t.Fatal(err)
	}
}

func readH2(r *bufio.Reader) (h2Frame, error) {
	hdr := make([]byte, 9)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return h2Frame{}, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	f := h2Frame{typ: hdr[3], flags: hdr[4], payload: make([]byte, n)}
	_, err := io.ReadFull(r, f.payload)
	return f, err
}

// TestGRPCSettingsAdvertiseTheBounds reads the server's HTTP/2 SETTINGS:
// GRPC_MAX_CONCURRENT_STREAMS (absent for 0, the anchor's "no bound") and
// the metadata bound.
func TestGRPCSettingsAdvertiseTheBounds(t *testing.T) {
	tests := []struct {
		name    string
		streams string
		want    uint32 // 0: not advertised
	}{
		{"default", "", 1024},
		{"set", "7", 7},
		{"zero_is_no_bound", "0", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			if tt.streams != "" {
				env["GRPC_MAX_CONCURRENT_STREAMS"] = tt.streams
			}
			srv, _ := start(t, serverRules, env)
			got := serverSettings(t, srv.Addrs().GRPC.String())
			if got[h2MaxConcurrentStreams] != tt.want {
				t.Errorf("GRPC_MAX_CONCURRENT_STREAMS=%q: SETTINGS_MAX_CONCURRENT_STREAMS = %d, want %d", tt.streams, got[h2MaxConcurrentStreams], tt.want)
			}
			if got[h2MaxHeaderListSize] != grpcMaxHeaderListSize {
				t.Errorf("SETTINGS_MAX_HEADER_LIST_SIZE = %d, want %d", got[h2MaxHeaderListSize], grpcMaxHeaderListSize)
			}
		})
	}
}

// serverSettings returns the settings of the first SETTINGS frame the
// server at addr sends.
func serverSettings(t *testing.T, addr string) map[uint16]uint32 {
	t.Helper()
	_, r := dialH2(t, addr)
	for {
		f, err := readH2(r)
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if f.typ != h2Settings || f.flags&1 != 0 { // not SETTINGS, or an ACK
			continue
		}
		got := map[uint16]uint32{}
		for p := f.payload; len(p) >= 6; p = p[6:] {
			got[binary.BigEndian.Uint16(p)] = binary.BigEndian.Uint32(p[2:])
		}
		return got
	}
}

// TestGRPCPingFloodIsCut: a client that pings faster than grpcPingMinTime
// gets GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and loses its connection.
func TestGRPCPingFloodIsCut(t *testing.T) {
	srv, _ := start(t, serverRules, nil)
	c, r := dialH2(t, srv.Addrs().GRPC.String())
	for i := range 10 {
		writeH2(t, c, h2Ping, 0, []byte(fmt.Sprintf("ping%04d", i)))
	}
	for {
		f, err := readH2(r)
		if err != nil {
			t.Fatalf("connection ended without GOAWAY: %v", err)
		}
		if f.typ != h2GoAway {
			continue
		}
		if len(f.payload) < 8 {
			t.Fatalf("short GOAWAY: %x", f.payload)
		}
		if code := binary.BigEndian.Uint32(f.payload[4:]); code != h2EnhanceYourCalm || string(f.payload[8:]) != "too_many_pings" {
			t.Errorf("GOAWAY code %#x %q, want ENHANCE_YOUR_CALM too_many_pings", code, f.payload[8:])
		}
		break
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Errorf("after GOAWAY: %v, want the server to close the connection", err)
	}
}
