package redis

import (
	"context"
	"crypto/tls"
	"net"
	"syscall"
	"time"
)

// dialer returns the go-redis Dialer for cfg: TCP (or a unix socket) with
// the timeout, and TLS when configured.
//
// TLS connections are wrapped so that they expose the socket beneath
// (syscall.Conn). go-redis checks an idle connection before reusing it by
// peeking at its socket, which finds the EOF a restarted Redis left there;
// it cannot peek through a *tls.Conn, so without the wrapper the first
// requests after a restart would each fail on a dead connection. The peek
// sees only what the kernel holds: a connection is idle only after a whole
// reply has been read, so no TLS record is pending on a healthy one.
func dialer(cfg Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil || cfg.TLS == nil {
			return raw, err
		}
		conf := cfg.TLS
		if conf.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			conf = conf.Clone()
			conf.ServerName = host
		}
		tc := tls.Client(raw, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		sc, ok := raw.(syscall.Conn)
		if !ok {
			return tc, nil
		}
		return &tlsConn{Conn: tc, raw: sc}, nil
	}
}

// tlsConn is a TLS connection whose socket go-redis can check for EOF.
type tlsConn struct {
	*tls.Conn
	raw syscall.Conn
}

// SyscallConn returns the raw connection of the socket beneath TLS.
func (c *tlsConn) SyscallConn() (syscall.RawConn, error) { return c.raw.SyscallConn() }
