package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// LineError is a problem of one line of a capture.
type LineError struct {
	Line int // 1-based
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("capture: line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// ErrTooLong is wrapped by the *LineError of a line longer than MaxLine.
// The Reader never holds such a line: it reads past it, and the next call
// reads the line after it.
var ErrTooLong = fmt.Errorf("longer than %d bytes", MaxLine)

// Reader reads a capture, one line at a time, each at most MaxLine bytes;
// it holds a buffer of MaxLine and the request last read, whatever the
// file holds. It checks the form of every line (the fields this package
// writes, of the right types, nothing else) and says which line is wrong;
// whether a request is one the service accepts (its bounds, its units) is
// for the service to say. A Reader is not safe for concurrent use.
type Reader struct {
	br      *bufio.Reader
	line    int
	held    int // bytes of the strings of the request last read
	header  Header
	summary *Summary
}

// NewReader returns a Reader of the capture in r, having read its header.
func NewReader(r io.Reader) (*Reader, error) {
	rd := &Reader{br: bufio.NewReaderSize(r, MaxLine)}
	b, err := rd.next()
	if err == io.EOF {
		return nil, &LineError{Line: 1, Err: errors.New("empty: not a capture")}
	}
	if err != nil {
		return nil, err
	}
	var w struct {
		Capture  *int   `json:"capture"`
		NS       int64  `json:"ns"`
		Values   string `json:"values"`
		Seconds  int    `json:"seconds"`
		Requests int    `json:"requests"`
		Domain   string `json:"domain"`
	}
	if err := strict(b, &w); err != nil || w.Capture == nil {
		return nil, rd.errorf("not a capture's first line (want {\"capture\":%d,...}): %s", Version, describe(b, err))
	}
	if *w.Capture != Version {
		return nil, rd.errorf("capture format %d, this version reads %d", *w.Capture, Version)
	}
	rd.header = Header{Start: time.Unix(0, w.NS), Values: w.Values, Seconds: w.Seconds, Requests: w.Requests, Domain: w.Domain}
	return rd, nil
}

// Header returns the capture's header.
func (r *Reader) Header() Header { return r.header }

// Summary returns the capture's summary, once Next has returned io.EOF;
// nil when the capture has none (it was cut short).
func (r *Reader) Summary() *Summary { return r.summary }

// Line returns the number of the line last read.
func (r *Reader) Line() int { return r.line }

// Held returns the bytes the strings of the request last read take: its
// line, which they are slices of, and the strings that held escapes.
func (r *Reader) Held() int { return r.held }

// wireSummary is a summary line's object.
type wireSummary struct {
	NS       int64  `json:"ns"`
	Requests int64  `json:"requests"`
	Dropped  int64  `json:"dropped"`
	TooLarge int64  `json:"too_large"`
	Bytes    int64  `json:"bytes"`
	Reason   string `json:"reason"`
}

// Next reads the next request into req, reusing its slices. It returns
// io.EOF after the last request (Summary is then set, when the capture
// has one), and a *LineError for a line that is not a request or the
// summary as this package writes them; one wrapping ErrTooLong for a line
// too long to read, after which Next reads on.
func (r *Reader) Next(req *Request) error {
	b, err := r.next()
	if err != nil {
		return err
	}
	if r.summary != nil {
		return r.errorf("a line after the summary")
	}
	// One string for the line: the request's strings are slices of it.
	p := &parser{s: string(b)}
	isSummary, err := p.requestLine(req)
	r.held = len(p.s) + p.escapes
	if err == nil && !isSummary && len(p.s) > sliceMax {
		req.detach()
	}
	switch {
	case isSummary:
		var w struct {
			Summary *wireSummary `json:"summary"`
		}
		if err := strict(b, &w); err != nil || w.Summary == nil {
			return r.errorf("not a summary: %s", describe(b, err))
		}
		s := w.Summary
		r.summary = &Summary{End: time.Unix(0, s.NS), Requests: s.Requests, Dropped: s.Dropped, TooLarge: s.TooLarge, Bytes: s.Bytes, Reason: s.Reason}
		if _, err := r.next(); err != io.EOF {
			if err == nil {
				return r.errorf("a line after the summary")
			}
			return err
		}
		return io.EOF
	case err != nil:
		return r.errorf("not a request: %v", err)
	}
	return nil
}

// sliceMax is the longest line whose request's strings are slices of it.
// Those of a longer line are copied out of it, so that whatever keeps one
// (a statistic named after a domain) keeps that string and not the line:
// its strings take no more than the line did, and Held still counts them.
const sliceMax = 4 << 10

// detach makes each of r's strings a copy of its own.
func (r *Request) detach() {
	r.Domain = strings.Clone(r.Domain)
	for i := range r.Descriptors {
		for j := range r.Descriptors[i].Entries {
			e := &r.Descriptors[i].Entries[j]
			e.Key, e.Value = strings.Clone(e.Key), strings.Clone(e.Value)
		}
	}
}

func parseCode(s string) (over, ok bool) {
	switch s {
	case codeOK:
		return false, true
	case codeOverLimit:
		return true, true
	}
	return false, false
}

// next returns the next line, without its newline (nor a carriage return
// before it), valid until the next call. A line longer than MaxLine, its
// newline included, is read past, a buffer at a time.
func (r *Reader) next() ([]byte, error) {
	r.line++
	b, err := r.br.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull:
		for err == bufio.ErrBufferFull {
			_, err = r.br.ReadSlice('\n')
		}
		if err != nil && err != io.EOF {
			return nil, &LineError{Line: r.line, Err: err}
		}
		return nil, &LineError{Line: r.line, Err: ErrTooLong}
	case err == io.EOF && len(b) == 0:
		return nil, io.EOF
	case err != nil && err != io.EOF:
		return nil, &LineError{Line: r.line, Err: err}
	}
	b = bytes.TrimSuffix(b, []byte{'\n'})
	return bytes.TrimSuffix(b, []byte{'\r'}), nil
}

func (r *Reader) errorf(format string, args ...any) error {
	return &LineError{Line: r.line, Err: fmt.Errorf(format, args...)}
}

// strict decodes one JSON object into v: every field known, nothing
// after it.
func strict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// describe says what is wrong with line b: err, or, for a line that is
// not JSON at all, its first bytes (quoted, so that whatever it holds
// prints as text).
func describe(b []byte, err error) string {
	if err == nil {
		return "missing fields"
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		head := b
		if len(head) > 40 {
			head = head[:40]
		}
		return fmt.Sprintf("%v, in %q", err, head)
	}
	return err.Error()
}
