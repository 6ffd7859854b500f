package server

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/ratelimitd/ratelimit/src/server/listen"
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
// listener's connections when a request is under way (listen.TrackRequests).
func newHTTPServer(h http.Handler, writeTimeout time.Duration, log *slog.Logger) *http.Server {
	return listen.TrackRequests(&http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	})
}
