package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Bounds of every HTTP listener (PORT, DEBUG_PORT, PROMETHEUS_ADDR). Each
// one stops a client from holding a connection, a goroutine and a file
// descriptor for as long as it likes: without them a body sent one byte at
// a time held its connection forever, and some 20,000 such connections
// exhausted the open-file limit and stopped every listener.
const (
	// httpReadHeaderTimeout bounds the request line and headers. A client
	// that is slower has its connection closed with no answer.
	httpReadHeaderTimeout = 10 * time.Second
	// httpReadTimeout bounds the whole request, body included. A /json body
	// still unread by then fails with 400 and the connection closes.
	httpReadTimeout = 15 * time.Second
	// httpWriteTimeout bounds writing the answer, counted from the end of
	// the request headers. On PORT the store's own timeout (REDIS_TIMEOUT)
	// is added, so that a /json answer that waited for the store is still
	// written. A client that does not read its answer in time has its
	// connection closed.
	httpWriteTimeout = 15 * time.Second
	// debugWriteTimeout is the debug listener's write bound: generous for a
	// goroutine dump or a heap profile of a large process. net/http/pprof
	// extends it by the duration asked for a CPU profile or a trace, so
	// /debug/pprof/profile's default 30 s works.
	debugWriteTimeout = 60 * time.Second
	// httpIdleTimeout closes a keep-alive connection idle this long.
	httpIdleTimeout = 60 * time.Second
	// httpMaxHeaderBytes bounds the request line and headers (net/http
	// allows 4 KiB more); a larger request is answered 431.
	httpMaxHeaderBytes = 16 << 10
)

// newHTTPServer returns an http.Server for h with the bounds above and its
// own errors (such as accept failures) logged through log. It tells its
// listener's connections when a request is under way (trackRequests).
func newHTTPServer(h http.Handler, writeTimeout time.Duration, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           trackRequests(h),
		ConnContext:       withLimitConn,
		ConnState:         idleBetweenRequests,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// connKey is the context key of a request's *limitConn.
type connKey struct{}

// withLimitConn is http.Server.ConnContext: it keeps the connection's
// limitConn for trackRequests.
func withLimitConn(ctx context.Context, c net.Conn) context.Context {
	if lc := limitConnOf(c); lc != nil {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// idleBetweenRequests is http.Server.ConnState: a keep-alive connection
// waiting for its next request is idle from then on.
func idleBetweenRequests(c net.Conn, st http.ConnState) {
	if st == http.StateIdle {
		if lc := limitConnOf(c); lc != nil {
			lc.idleSince.Store(time.Now().UnixNano())
		}
	}
}

// trackRequests marks a connection busy while a request is under way, so
// that its listener, at its cap, never closes it for a new one: from the
// end of the request's headers, or of its body when it has one, until
// its answer is written. A connection whose request line, headers or body
// are still arriving stays idle: a client that sends them slowly holds no
// slot a prober needs (issue 24, case 5).
func trackRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(connKey{}).(*limitConn)
		if lc == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.Body == nil || r.Body == http.NoBody {
			lc.idleSince.Store(0)
		} else {
			r.Body = &busyAtEOF{ReadCloser: r.Body, c: lc}
		}
		// Idle again once the answer is written and the connection
		// waits for its next request (idleBetweenRequests), or closed.
		next.ServeHTTP(w, r)
	})
}

// busyAtEOF marks its connection busy once the body has arrived whole.
type busyAtEOF struct {
	io.ReadCloser
	c *limitConn
}

func (b *busyAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.c.idleSince.Store(0)
	}
	return n, err
}
