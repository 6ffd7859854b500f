package listen

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimit/src/stats"
)

// tlsRecordHandshake is the first byte of every TLS connection (a
// handshake record); no HTTP/1 request starts with it.
const tlsRecordHandshake = 0x16

// sniffListener is PORT's listener when the gRPC listener serves TLS: one
// port speaks both plaintext HTTP and HTTPS, told apart by the first byte
// each client sends. Plaintext serves the kubelet's probes of /healthcheck
// (a kubelet's httpGet probe cannot present a client certificate, and
// Envoy Gateway probes in plaintext); TLS, with the gRPC listener's
// certificate, client CAs and SAN (issue 24, case 8), serves /json, which
// the handlers refuse over plaintext (see RequireTLS).
//
// A connection's first byte and, over TLS, its handshake must come within
// timeout (the bound of the HTTP server's headers); until then it
// holds its slot of the capped listener beneath and a goroutine, no more.
// Failed handshakes are counted as the gRPC listener's are, and never
// logged one by one. It is safe for concurrent use.
type sniffListener struct {
	net.Listener
	config  func() *tls.Config // the TLS configuration in force now
	refused *stats.Counter     // ratelimit.server.tls_handshake_error
	timeout time.Duration

	conns chan net.Conn
	errc  chan error
	done  chan struct{}
	once  sync.Once
}

// Sniff returns l speaking plaintext and TLS with config (see sniffListener).
func Sniff(l net.Listener, config func() *tls.Config, refused *stats.Counter, timeout time.Duration) net.Listener {
	s := &sniffListener{
		Listener: l, config: config, refused: refused, timeout: timeout,
		conns: make(chan net.Conn), errc: make(chan error), done: make(chan struct{}),
	}
	go s.acceptLoop()
	return s
}

// acceptLoop accepts connections and sniffs each in a goroutine of its
// own, so that a silent client holds up no other. It ends when the
// listener beneath is closed.
func (s *sniffListener) acceptLoop() {
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			select {
			case s.errc <- err:
			case <-s.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go s.sniff(c)
	}
}

// sniff reads c's first byte and hands c over, behind a TLS server
// connection whose handshake is done when that byte starts one.
func (s *sniffListener) sniff(c net.Conn) {
	deadline := time.Now().Add(s.timeout)
	_ = c.SetReadDeadline(deadline)
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var out net.Conn = &peekedConn{Conn: c, peeked: b[:]}
	if b[0] == tlsRecordHandshake {
		tc := tls.Server(out, s.config())
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.refused.Inc()
			}
			tc.Close()
			return
		}
		out = tc
	}
	select {
	case s.conns <- out:
	case <-s.done:
		out.Close()
	}
}

// Accept returns the next connection whose first byte (and handshake)
// came.
func (s *sniffListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case err := <-s.errc:
		return nil, err
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close closes the listener beneath and releases Accept.
func (s *sniffListener) Close() error {
	s.once.Do(func() { close(s.done) })
	return s.Listener.Close()
}

// peekedConn gives back the bytes read before its first Reads (by
// sniffListener, or by protocolCheck on the gRPC listener).
type peekedConn struct {
	net.Conn
	peeked []byte
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.peeked) > 0 {
		n := copy(p, c.peeked)
		c.peeked = c.peeked[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// NetConn is the connection beneath.
func (c *peekedConn) NetConn() net.Conn { return c.Conn }

func (c *peekedConn) CloseWrite() error { return closeWrite(c.Conn) }

// RequireTLS refuses a request that came in plaintext: with TLS on the
// gRPC listener, /json answers over TLS only (on the same port, with the
// same certificate and client-certificate rules), so that it is no
// plaintext, unauthenticated way around mTLS.
func RequireTLS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			http.Error(w, "/json answers over TLS only on this port (GRPC_SERVER_USE_TLS): use https://", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
