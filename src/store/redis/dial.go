package redis

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// dialer returns the go-redis Dialer for cfg: TCP (or a unix socket) with
// the timeout, and TLS when configured. Every connection hides go-redis's
// HELLO from the server (see noHelloConn) and has its replies checked
// against the store's bounds before go-redis reads them (see replyGuard).
//
// Every connection exposes the socket beneath (syscall.Conn), TLS and the
// guard notwithstanding. go-redis checks an idle connection before reusing
// it by peeking at its socket, which finds the EOF a restarted Redis left
// there; it cannot peek through a *tls.Conn, so without it the first
// requests after a restart would each fail on a dead connection. The peek
// sees only what the kernel holds: a connection is idle only after a whole
// reply has been read, so no TLS record is pending on a healthy one.
//
// Every connection's silences are bounded by cfg.Stall, stretched by the
// pace of its server kept in ps (see stallConn), beneath TLS. Every
// connection made is counted in counts, and so is its close.
func dialer(cfg Config, counts *connCounts, ps *paces) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sock, _ := raw.(syscall.Conn)
		var rc syscall.RawConn
		if sock != nil {
			rc, _ = sock.SyscallConn()
		}
		c := newStallConn(raw, rc, cfg.Stall, ps.of(addr))
		if cfg.TLS != nil {
			conf := cfg.TLS
			if conf.ServerName == "" {
				host, _, err := net.SplitHostPort(addr)
				if err != nil {
					host = addr
				}
				conf = conf.Clone()
				conf.ServerName = host
			}
			tc := tls.Client(c, conf)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = raw.Close()
				return nil, err
			}
			c = tc
		}
		g := newReplyGuard(c)
		if sc, ok := c.(*stallConn); ok {
			sc.owes = g.owes
		}
		return counted(counts, newNoHelloConn(g, sock)), nil
	}
}

// noHelloConn answers go-redis's opening HELLO itself, with the error an old
// Redis gives, instead of sending it. go-redis always opens a connection
// with HELLO (even for RESP2), and twemproxy (nutcracker), the anchor's
// default deployment, closes the connection on a command it does not know.
// On that error go-redis goes on in RESP2 and authenticates with AUTH,
// which is what the anchor's client does, and which Redis, Sentinel,
// Cluster and twemproxy all accept; the store needs nothing from RESP3.
//
// Only the first write is looked at: go-redis writes HELLO alone, as the
// first command of a new connection, and waits for its reply. Anything else
// passes through untouched.
type noHelloConn struct {
	net.Conn
	started bool   // the first write has been seen
	reply   []byte // the answer to a swallowed HELLO, not yet read

	// counts, when set, counts the close (once).
	counts *connCounts
	closed atomic.Bool

	// raw is the socket's RawConn (rawErr when there is none), made once:
	// go-redis asks for it on every use of the connection (see
	// SyscallConn), and a new one is an allocation each time.
	raw    syscall.RawConn
	rawErr error
}

// newNoHelloConn wraps c, whose socket is sock (nil if it has none).
func newNoHelloConn(c net.Conn, sock syscall.Conn) *noHelloConn {
	n := &noHelloConn{Conn: c, rawErr: errNoSyscallConn}
	if sock != nil {
		n.raw, n.rawErr = sock.SyscallConn()
	}
	return n
}

// counted counts c as opened, and its close when it comes.
func counted(counts *connCounts, c *noHelloConn) *noHelloConn {
	c.counts = counts
	counts.opened.Add(1)
	return c
}

// Close closes the connection, counting it once however often it is
// called.
func (c *noHelloConn) Close() error {
	if c.counts != nil && c.closed.CompareAndSwap(false, true) {
		c.counts.closed.Add(1)
	}
	return c.Conn.Close()
}

// helloReply is the error Redis before 6.0 answers to HELLO.
const helloReply = "-ERR unknown command 'HELLO'\r\n"

func (c *noHelloConn) Write(p []byte) (int, error) {
	if !c.started {
		c.started = true
		if isHello(p) {
			c.reply = []byte(helloReply)
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}

func (c *noHelloConn) Read(p []byte) (int, error) {
	if len(c.reply) > 0 {
		n := copy(p, c.reply)
		c.reply = c.reply[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// SyscallConn exposes the socket to go-redis's idle-connection check,
// beneath TLS and the reply guard.
func (c *noHelloConn) SyscallConn() (syscall.RawConn, error) { return c.raw, c.rawErr }

var errNoSyscallConn = errors.New("redis: connection has no socket")

// isHello reports whether p is exactly one whole RESP command named HELLO:
// an array header, then bulk strings, the first of them "hello" in any case.
// A partial or longer write is not swallowed.
func isHello(p []byte) bool {
	n, rest, ok := respHeader(p, '*')
	if !ok || n < 1 {
		return false
	}
	for i := range n {
		size, r, ok := respHeader(rest, '$')
		if !ok || size < 0 || len(r) < size+2 || r[size] != '\r' || r[size+1] != '\n' {
			return false
		}
		if i == 0 && !strings.EqualFold(string(r[:size]), "hello") {
			return false
		}
		rest = r[size+2:]
	}
	return len(rest) == 0
}

// respHeader parses "<kind><decimal>\r\n" at the start of p.
func respHeader(p []byte, kind byte) (n int, rest []byte, ok bool) {
	if len(p) < 4 || p[0] != kind {
		return 0, nil, false
	}
	i := bytes.Index(p, []byte("\r\n"))
	if i < 2 || i > 11 {
		return 0, nil, false
	}
	v, err := strconv.Atoi(string(p[1:i]))
	if err != nil {
		return 0, nil, false
	}
	return v, p[i+2:], true
}
