package integration

import (
	"bytes"
	binenc "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// h2Client speaks HTTP/2 to the gRPC listener frame by frame, to behave as
// grpc-go's client never would: withhold flow-control window, stay silent.
// It answers the server's SETTINGS and PINGs, as any HTTP/2 client must,
// and records what comes back.
type h2Client struct {
	conn net.Conn
	// wmu guards the framer's writes and the encoder.
	wmu  sync.Mutex
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	next uint32 // the next stream ID

	// mu guards the fields below, written by the reader.
	mu      sync.Mutex
	goAway  bool
	headers map[uint32]bool // streams the server answered with headers
	done    chan struct{}   // closed when the connection ends
	err     error
}

// dialH2 connects to addr and sends the preface and settings.
func dialH2(t *testing.T, addr string, settings ...http2.Setting) *h2Client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2Client{conn: c, fr: http2.NewFramer(c, c), next: 1, headers: map[uint32]bool{}, done: make(chan struct{})}
	h.enc = hpack.NewEncoder(&h.hbuf)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	go h.read()
	return h
}

// read reads frames until the connection ends.
func (h *h2Client) read() {
	defer close(h.done)
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.mu.Lock()
			h.err = err
			h.mu.Unlock()
			return
		}
		h.wmu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = h.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = h.fr.WritePing(true, f.Data)
			}
		}
		h.wmu.Unlock()
		h.mu.Lock()
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			h.goAway = true
		case *http2.HeadersFrame:
			h.headers[f.StreamID] = true
		}
		h.mu.Unlock()
	}
}

// call opens a stream calling ShouldRateLimit with req, its message whole.
// It fails once the server has closed the connection.
func (h *h2Client) call(authority string, req *rlsv3.RateLimitRequest) (uint32, error) {
	msg, err := proto.Marshal(req)
	if err != nil {
		return 0, err
	}
	body := make([]byte, 5+len(msg))
	binenc.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	copy(body[5:], msg)
	return h.stream(authority, body)
}

// open opens a stream calling ShouldRateLimit and sends nothing more: its
// message never comes.
func (h *h2Client) open(authority string) (uint32, error) {
	return h.stream(authority, nil)
}

// stream opens a stream calling ShouldRateLimit and sends body, ending the
// request; with no body it sends the headers alone and leaves it open.
func (h *h2Client) stream(authority string, body []byte) (uint32, error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	id := h.next
	h.next += 2
	h.hbuf.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName},
		{":authority", authority}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return id, fmt.Errorf("stream %d: %w", id, err)
	}
	if body == nil {
		return id, nil
	}
	if err := h.fr.WriteData(id, true, body); err != nil {
		return id, fmt.Errorf("stream %d: %w", id, err)
	}
	return id, nil
}

// answered is the number of streams the server sent headers on.
func (h *h2Client) answered() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.headers)
}

// closed reports whether the server ended the connection: GOAWAY, EOF or
// a reset.
func (h *h2Client) closed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.goAway {
		return true
	}
	select {
	case <-h.done:
		return h.err != nil && !errors.Is(h.err, net.ErrClosed)
	default:
		return false
	}
}
