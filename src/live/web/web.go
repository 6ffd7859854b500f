// Package web is the live view's HTTP side, served on the debug listener:
// a JSON API (/api/v1/rules, /api/v1/traffic, /api/v1/topkeys,
// /api/v1/unmatched), a stream of server-sent events with the live
// figures (/api/v1/stream), and a self-contained page (/ui/) that uses only that API. The page's files are
// embedded in the binary and load nothing from elsewhere, so it works in
// air-gapped clusters.
//
// It reads a live.Recorder and what the server tells it of the rules'
// source and of the store; it knows no store, provider or service.
package web

import (
	"cmp"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimit/src/live"
)

// Defaults and bounds of Config and of the API.
const (
	// DefaultMaxStreams is Config.MaxStreams's default.
	DefaultMaxStreams = 8
	// DefaultWriteTimeout is Config.WriteTimeout's default.
	DefaultWriteTimeout = 10 * time.Second
	// maxTopKeys bounds /api/v1/topkeys?n=; defaultTopKeys is its
	// default and what each stream event carries.
	maxTopKeys     = 100
	defaultTopKeys = 10
	// streamRetry is the reconnection delay a stream asks of its client.
	streamRetry = 2 * time.Second
)

// Source says where the rules in use came from, and the last failed load
// since then.
type Source struct {
	// Kind is "files" or "xds"; empty when no rules are loaded.
	Kind, Location, Version string
	LoadedAt                time.Time
	// LastError is the last failed load since LoadedAt, at LastErrorAt;
	// empty when none failed.
	LastError   string
	LastErrorAt time.Time
}

// Store is the store's state now.
type Store struct {
	// Backend is BACKEND_TYPE: memory, redis or memcache.
	Backend string
	// Healthy reports whether the store answers.
	Healthy bool
	// Breakers is the circuit breakers' state; nil for a store without.
	Breakers *Breakers
	// NearCache is the near cache's state; nil when it is off
	// (LOCAL_CACHE_SIZE_IN_BYTES=0).
	NearCache *NearCache
}

// Breakers is the state of a store's circuit breakers.
type Breakers struct {
	// Open is the number of breakers open now; Trips counts the times one
	// opened, Rejections the requests an open breaker refused at once.
	Open       int64
	Trips      uint64
	Rejections uint64
}

// NearCache is the state of the near cache.
type NearCache struct {
	// Entries is the number of keys it holds.
	Entries int
}

// Config is what a Handler serves.
type Config struct {
	// Live is the recorder of the traffic; required.
	Live *live.Recorder
	// Source returns where the rules came from; nil reports nothing.
	Source func() Source
	// Store returns the store's state; nil reports nothing.
	Store func() Store
	// Quota returns the state of the Rate Limit Quota Service as a JSON
	// document (the service's QuotaState); nil when it is off.
	Quota func() any
	// MaxStreams bounds the /api/v1/stream clients at once (default
	// DefaultMaxStreams); one more is answered 503.
	MaxStreams int
	// WriteTimeout bounds the writing of one event to a stream client
	// (default DefaultWriteTimeout). A client that reads no more than
	// that is dropped; it never holds up anyone else.
	WriteTimeout time.Duration
	// Values is how the keys' descriptor values are shown (default
	// PlainValues, as sent).
	Values Values
}

//go:embed assets
var assets embed.FS

// Handler serves the page and the API. It is safe for concurrent use.
// Make one with New; Close ends the streams.
type Handler struct {
	cfg     Config
	values  masker
	mux     *http.ServeMux
	streams chan struct{} // one token per stream client
	done    chan struct{}
	close   sync.Once

	// mu guards the fields below: the last stream event, encoded once
	// for every client.
	mu        sync.Mutex
	eventEnd  time.Time
	eventData []byte
}

// New returns a Handler.
func New(cfg Config) *Handler {
	cfg.MaxStreams = cmp.Or(max(cfg.MaxStreams, 0), DefaultMaxStreams)
	cfg.WriteTimeout = cmp.Or(max(cfg.WriteTimeout, 0), DefaultWriteTimeout)
	if cfg.Source == nil {
		cfg.Source = func() Source { return Source{} }
	}
	if cfg.Store == nil {
		cfg.Store = func() Store { return Store{} }
	}
	h := &Handler{cfg: cfg, values: newMasker(cfg.Values), mux: http.NewServeMux(), streams: make(chan struct{}, cfg.MaxStreams), done: make(chan struct{})}
	page, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(page))
	h.mux.Handle("GET /ui/", pageHeaders(files))
	h.mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	h.mux.HandleFunc("GET /api/v1/rules", h.serveRules)
	h.mux.HandleFunc("GET /api/v1/traffic", h.serveTraffic)
	h.mux.HandleFunc("GET /api/v1/topkeys", h.serveTopKeys)
	h.mux.HandleFunc("GET /api/v1/stream", h.serveStream)
	h.mux.HandleFunc("GET /api/v1/quota", h.serveQuota)
	h.mux.HandleFunc("GET /api/v1/unmatched", h.serveUnmatched)
	h.mux.HandleFunc("GET /api/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: see /api/v1/rules, /api/v1/traffic, /api/v1/topkeys, /api/v1/unmatched, /api/v1/stream, /api/v1/quota")
	})
	return h
}

// ServeHTTP serves /ui/ and /api/v1/.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	h.mux.ServeHTTP(w, r)
}

// Close ends the streams under way and refuses new ones; the rest of the
// API still answers. It is for the server's shutdown, which would
// otherwise wait for streams that never end by themselves.
func (h *Handler) Close() { h.close.Do(func() { close(h.done) }) }

// contentSecurityPolicy lets the page load its own script and style and
// call its own API, and nothing else: no inline script (so a value that
// slipped into the markup could not run), no other origin, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func pageHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// intParam reads a whole-number query parameter within [lo, hi], def when
// absent.
func intParam(r *http.Request, name string, def, lo, hi int) (int, bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, false
	}
	return n, true
}

func (h *Handler) serveRules(w http.ResponseWriter, _ *http.Request) { writeJSON(w, h.rules()) }

// serveQuota serves the quota service's state, or {"enabled": false} when
// it is off (RLQS_ENABLED=false).
func (h *Handler) serveQuota(w http.ResponseWriter, _ *http.Request) {
	if h.cfg.Quota == nil {
		writeJSON(w, map[string]any{"enabled": false, "rules": []any{}})
		return
	}
	writeJSON(w, h.cfg.Quota())
}

func (h *Handler) serveTraffic(w http.ResponseWriter, r *http.Request) {
	seconds, ok := intParam(r, "seconds", live.Window, 1, live.Window)
	if !ok {
		writeError(w, http.StatusBadRequest, "seconds: a whole number from 1 to "+strconv.Itoa(live.Window))
		return
	}
	writeJSON(w, h.traffic(seconds))
}

func (h *Handler) serveTopKeys(w http.ResponseWriter, r *http.Request) {
	n, ok := intParam(r, "n", defaultTopKeys, 1, maxTopKeys)
	if !ok {
		writeError(w, http.StatusBadRequest, "n: a whole number from 1 to "+strconv.Itoa(maxTopKeys))
		return
	}
	writeJSON(w, h.topKeys(n, r.URL.Query().Get("domain")))
}

func (h *Handler) serveUnmatched(w http.ResponseWriter, r *http.Request) {
	n, ok := intParam(r, "n", defaultTopKeys, 1, maxTopKeys)
	if !ok {
		writeError(w, http.StatusBadRequest, "n: a whole number from 1 to "+strconv.Itoa(maxTopKeys))
		return
	}
	writeJSON(w, h.unmatched(n))
}
