package listen

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimit/src/wire"
)

// The gRPC listener speaks HTTP/2 only, in plaintext or, with
// GRPC_SERVER_USE_TLS, in TLS. An Envoy cluster left at HTTP/1.1 (the
// default of a cluster) or on the other side of TLS is the most common
// mistake of a first deployment, and grpc-go logs what it sees at debug
// level only: Envoy fails open (or closed) and nothing says why. So the
// listener reads the first bytes of each connection (after its TLS
// handshake, with TLS) and, when they are not HTTP/2's preface, warns
// with the fix, at most once a second per kind of mistake, and closes the
// connection at once.

// Envoy's fixes, named by the warnings.
const (
	fixHTTP2 = "the Envoy cluster of the rate limit service needs HTTP/2: typed_extension_protocol_options: " +
		"{envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, " +
		"explicit_http_config: {http2_protocol_options: {}}}}, or, in older Envoys, http2_protocol_options: {}"
	fixTLSOnPlain = "this port serves plaintext: set GRPC_SERVER_USE_TLS=true (with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY), " +
		"or remove the transport_socket from the Envoy cluster of the rate limit service"
	fixPlainOnTLS = "this port serves TLS (GRPC_SERVER_USE_TLS=true): give the Envoy cluster of the rate limit service " +
		"a transport_socket (envoy.transport_sockets.tls), or set GRPC_SERVER_USE_TLS=false"
)

// The kinds of mistake, each rate-limited on its own.
const (
	mistakeNotHTTP2 = iota
	mistakeTLSOnPlain
	mistakePlainOnTLS
	numMistakes
)

// errNotHTTP2 ends a connection whose client does not speak HTTP/2.
var errNotHTTP2 = errors.New("server: the client does not speak HTTP/2 (no HTTP/2 preface)")

// protocolCheck wraps a gRPC listener's transport credentials (nil:
// plaintext) so that a client speaking another protocol is warned of.
type protocolCheck struct {
	credentials.TransportCredentials
	tls bool
	// state is shared by the clones.
	state *protocolLog
}

// protocolLog is where protocolCheck logs, and its pace.
type protocolLog struct {
	log   *slog.Logger
	every [numMistakes]wire.LogEvery
}

// NewProtocolCheck wraps inner (nil: plaintext) in a protocolCheck.
func NewProtocolCheck(inner credentials.TransportCredentials, log *slog.Logger) credentials.TransportCredentials {
	c := protocolCheck{TransportCredentials: inner, tls: inner != nil, state: &protocolLog{log: log}}
	if inner == nil {
		c.TransportCredentials = insecure.NewCredentials()
	}
	return c
}

// ServerHandshake runs the inner handshake, then reads the client's first
// bytes, as long as they are the start of HTTP/2's preface: a client that
// speaks HTTP/2 sends all of it at once, and any other protocol differs
// from it within its first two bytes. grpc-go reads them again from the
// connection returned. grpc-go's connection timeout bounds the reads: it
// set the connection's deadline before the handshake.
func (c protocolCheck) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		if c.tls {
			c.state.handshakeFailed(raw, err)
		}
		return conn, info, err
	}
	var b [len(clientPreface)]byte
	n := 0
	for n < len(b) && string(b[:n]) == clientPreface[:n] {
		m, rerr := conn.Read(b[n:])
		n += m
		if rerr != nil {
			break // grpc-go reads the same error after the bytes
		}
	}
	if string(b[:n]) != clientPreface[:n] {
		if !c.tls && b[0] == tlsRecordHandshake {
			c.state.warn(mistakeTLSOnPlain, raw, b[:n], nil, "a client speaks TLS to the gRPC port; "+fixTLSOnPlain)
		} else {
			c.state.warn(mistakeNotHTTP2, raw, b[:n], nil, msgNotHTTP2)
		}
		conn.Close()
		return nil, nil, errNotHTTP2
	}
	return &peekedConn{Conn: conn, peeked: b[:n]}, info, nil
}

// msgNotHTTP2 is the warning of a client that speaks another protocol
// than HTTP/2 (after TLS, with TLS).
const msgNotHTTP2 = "a client speaks HTTP/1.x (or another protocol than HTTP/2) to the gRPC port; " + fixHTTP2

// handshakeFailed warns when a TLS handshake failed for a mistake of
// protocol: a plaintext client, or one that does not offer HTTP/2 (ALPN
// "h2"; grpc-go refuses a TLS client without ALPN too). Other failures
// (certificates) are counted in tls_handshake_error.
func (l *protocolLog) handshakeFailed(raw net.Conn, err error) {
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &rh):
		head := rh.RecordHeader[:]
		if strings.HasPrefix(clientPreface, string(head)) {
			l.warn(mistakePlainOnTLS, raw, head, nil, "a client speaks plaintext HTTP/2 to the gRPC port; "+fixPlainOnTLS)
		} else {
			l.warn(mistakePlainOnTLS, raw, head, nil, "a client speaks plaintext, not HTTP/2 either, to the gRPC port; "+fixPlainOnTLS+"; and "+fixHTTP2)
		}
	case strings.Contains(err.Error(), "ALPN") || strings.Contains(err.Error(), "application protocol"):
		l.warn(mistakeNotHTTP2, raw, nil, err, "a TLS client does not offer HTTP/2 (ALPN h2) to the gRPC port; "+fixHTTP2)
	}
}

// warn logs msg, unless a mistake of its kind was logged within the last
// second: with the client's address, the bytes it sent first, if read,
// and the handshake's error, if any.
func (l *protocolLog) warn(kind int, raw net.Conn, first []byte, err error, msg string) {
	ok, held := l.every[kind].Allow(time.Now())
	if !ok {
		return
	}
	attrs := []any{"client", raw.RemoteAddr().String(), "suppressed", held}
	if first != nil {
		attrs = append(attrs, "first_bytes", string(first))
	}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	l.log.Warn(msg, attrs...)
}

// Clone keeps the check and its log's pace.
func (c protocolCheck) Clone() credentials.TransportCredentials {
	return protocolCheck{TransportCredentials: c.TransportCredentials.Clone(), tls: c.tls, state: c.state}
}
