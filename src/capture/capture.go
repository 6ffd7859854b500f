package capture

import (
	"cmp"
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults and bounds of a capture.
const (
	// DefaultMaxBytes is Config.MaxBytes's default (CAPTURE_MAX_BYTES):
	// the request lines of one capture, 256 MiB.
	DefaultMaxBytes = 256 << 20
	// MaxSeconds and MaxRequests bound what one capture may ask for: an
	// hour, ten million requests.
	MaxSeconds  = 3600
	MaxRequests = 10_000_000
	// bufferBytes bounds the lines recorded and not yet written: past it,
	// while the reader is slow, requests are dropped (Summary.Dropped).
	// The writer takes them every flushEvery, or at once past half of it,
	// so the recording holds at most two such buffers.
	bufferBytes = 8 << 20
	flushEvery  = 100 * time.Millisecond
)

// ErrBusy is returned by Run while another capture runs: there is one at a
// time.
var ErrBusy = errors.New("capture: another capture is running")

// Config tunes a Recorder. The zero value is usable.
type Config struct {
	// MaxBytes bounds the request lines of one capture, in bytes
	// (CAPTURE_MAX_BYTES; default DefaultMaxBytes); the capture ends
	// when the next line would pass it.
	MaxBytes int64
	// Values, when not nil, writes each descriptor value as it returns it
	// instead of as the request sent it, and ValuesMode names it in the
	// header ("plain" when Values is nil). It is the hook for a setting
	// that hides values (a keyed hash keeps a replay's keys apart, but
	// no longer matches rules that name values).
	Values     func(string) string
	ValuesMode string
	// Now is the clock of the header and the summary; default time.Now.
	Now func() time.Time
}

// Options are what one capture asks for.
type Options struct {
	// Seconds bounds how long it records (1..MaxSeconds).
	Seconds int
	// Requests bounds how many requests it records (1..MaxRequests).
	Requests int
	// Domain, when not empty, records only that domain's requests.
	Domain string
}

// Recorder records the requests decided while a capture runs. It is safe
// for concurrent use; a nil *Recorder records nothing. While no capture
// runs, Active and Record cost one atomic load.
type Recorder struct {
	cfg  Config
	cur  atomic.Pointer[session]
	busy atomic.Bool
	// closed ends every capture, and refuses new ones (Close).
	closed    chan struct{}
	closeOnce sync.Once
}

// New returns a Recorder that is not capturing.
func New(cfg Config) *Recorder {
	cfg.MaxBytes = cmp.Or(max(cfg.MaxBytes, 0), DefaultMaxBytes)
	if cfg.Values == nil || cfg.ValuesMode == "" {
		cfg.ValuesMode = "plain"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Recorder{cfg: cfg, closed: make(chan struct{})}
}

// Active reports whether a capture runs: the service builds a Request
// only then.
func (r *Recorder) Active() bool { return r != nil && r.cur.Load() != nil }

// bufPool holds the buffers requests are encoded into before they join a
// session's, so that encoding happens outside the session's lock.
var bufPool = sync.Pool{New: func() any { return new([]byte) }}

// Record adds a decided request to the capture that runs, if any (and if
// it is of the capture's domain). It copies what it keeps: req may be
// reused once it returns.
func (r *Recorder) Record(req *Request) {
	if r == nil {
		return
	}
	s := r.cur.Load()
	if s == nil || s.domain != "" && req.Domain != s.domain {
		return
	}
	bp := bufPool.Get().(*[]byte)
	b := AppendRequest((*bp)[:0], req, r.cfg.Values)
	s.add(b)
	if cap(b) <= MaxLine {
		*bp = b
		bufPool.Put(bp)
	}
}

// session is one capture's recording.
type session struct {
	domain             string
	maxRequests        int64
	maxBytes           int64
	wake, done         chan struct{}
	mu                 sync.Mutex // guards the fields below
	buf                []byte     // lines not written yet
	requests, bytes    int64
	dropped, tooLarge  int64
	reason             string // why it ended, "" while it records
	closed, wokeWriter bool
}

// add appends one encoded line, within the session's bounds.
func (s *session) add(line []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed || s.reason != "":
	case len(line) > MaxLine:
		s.tooLarge++
	case s.bytes+int64(len(line)) > s.maxBytes:
		s.end("bytes")
	case len(s.buf)+len(line) > bufferBytes:
		s.dropped++
	default:
		s.buf = append(s.buf, line...)
		s.requests++
		s.bytes += int64(len(line))
		if s.requests >= s.maxRequests {
			s.end("requests")
		}
		if len(s.buf) > bufferBytes/2 && !s.wokeWriter {
			s.wokeWriter = true
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// end records that a bound was reached. The caller holds s.mu.
func (s *session) end(reason string) {
	if s.reason == "" {
		s.reason = reason
		close(s.done)
	}
}

// take returns the lines recorded since the last take, giving spare to
// record the next ones into; with last, no more are recorded after.
func (s *session) take(spare []byte, last bool) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buf
	s.buf = spare[:0]
	s.wokeWriter = false
	s.closed = s.closed || last
	return b
}

// Run runs one capture: it records the requests decided from now on (from
// before the header is written) until
// opts.Seconds pass, opts.Requests are recorded, Config.MaxBytes is
// reached, ctx ends or the Recorder is closed, and writes the capture to
// w as it goes (each write bounded by the deadline write sets itself, if
// any): the header at once, the request lines every flushEvery, the
// summary at the end. It returns the summary, and the first write error
// (the capture ends at it); ErrBusy when another capture runs.
func (r *Recorder) Run(ctx context.Context, opts Options, w io.Writer, flush func() error) (Summary, error) {
	if !r.busy.CompareAndSwap(false, true) {
		return Summary{}, ErrBusy
	}
	defer r.busy.Store(false)
	select {
	case <-r.closed:
		return Summary{}, errClosed
	default:
	}
	s := &session{
		domain: opts.Domain, maxRequests: int64(opts.Requests), maxBytes: r.cfg.MaxBytes,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
		buf: make([]byte, 0, 64<<10),
	}
	h := Header{Start: r.cfg.Now(), Values: r.cfg.ValuesMode, Seconds: opts.Seconds, Requests: opts.Requests, Domain: opts.Domain}
	out := sink{w, flush}
	// Recording starts before the header goes: a client that has read it
	// knows that what it sends from then on is recorded.
	r.cur.Store(s)
	if err := out.write(appendHeader(nil, &h)); err != nil {
		r.cur.Store(nil)
		return Summary{}, err
	}
	reason, spare, werr := r.record(ctx, s, out, time.Duration(opts.Seconds)*time.Second)
	r.cur.Store(nil)
	b := s.take(spare, true)
	s.mu.Lock()
	s.reason = cmp.Or(s.reason, reason)
	sum := Summary{End: r.cfg.Now(), Requests: s.requests, Dropped: s.dropped, TooLarge: s.tooLarge, Bytes: s.bytes, Reason: s.reason}
	s.mu.Unlock()
	if werr == nil {
		if werr = out.write(b); werr == nil {
			werr = out.write(appendSummary(nil, &sum))
		}
	}
	return sum, werr
}

// sink is where a capture goes: w, flushed after each write when flush is
// not nil.
type sink struct {
	w     io.Writer
	flush func() error
}

func (k sink) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := k.w.Write(b); err != nil {
		return err
	}
	if k.flush != nil {
		return k.flush()
	}
	return nil
}

// record writes what s records to out as it comes, until s is full (its
// own reason), seconds pass, ctx or the Recorder ends, or a write fails
// ("client"). It returns why, the buffer to take the rest into, and the
// write's error.
func (r *Recorder) record(ctx context.Context, s *session, out sink, seconds time.Duration) (reason string, spare []byte, werr error) {
	timer := time.NewTimer(seconds)
	defer timer.Stop()
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	spare = make([]byte, 0, 64<<10)
	for {
		select {
		case <-tick.C:
		case <-s.wake:
		case <-s.done:
			return "", spare, nil
		case <-timer.C:
			return "seconds", spare, nil
		case <-ctx.Done():
			return "client", spare, nil
		case <-r.closed:
			return "shutdown", spare, nil
		}
		b := s.take(spare, false)
		if werr = out.write(b); werr != nil {
			return "client", spare, werr
		}
		spare = b
	}
}

// errClosed refuses a capture once the Recorder is closed.
var errClosed = errors.New("capture: shutting down")

// Close ends the capture that runs, if any, and refuses new ones: a
// graceful shutdown calls it, since a capture never ends by itself before
// its time.
func (r *Recorder) Close() {
	if r == nil {
		return
	}
	r.closeOnce.Do(func() { close(r.closed) })
}
