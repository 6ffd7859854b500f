package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// LineError is a problem of one line of a capture.
type LineError struct {
	Line int // 1-based
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("capture: line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// Reader reads a capture, one line at a time, each at most MaxLine bytes;
// memory stays within a few times that whatever the file holds. It checks
// the form of every line (the fields this package writes, of the right
// types, nothing else) and says which line is wrong; whether a request is
// one the service accepts (its bounds, its units) is for the service to
// say. A Reader is not safe for concurrent use.
type Reader struct {
	sc      *bufio.Scanner
	line    int
	header  Header
	summary *Summary
}

// NewReader returns a Reader of the capture in r, having read its header.
func NewReader(r io.Reader) (*Reader, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	rd := &Reader{sc: sc}
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
// summary as this package writes them.
func (r *Reader) Next(req *Request) error {
	b, err := r.next()
	if err != nil {
		return err
	}
	if r.summary != nil {
		return r.errorf("a line after the summary")
	}
	// One string for the line: the request's strings are slices of it.
	isSummary, err := parseRequestLine(string(b), req)
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

func parseCode(s string) (over, ok bool) {
	switch s {
	case codeOK:
		return false, true
	case codeOverLimit:
		return true, true
	}
	return false, false
}

// next returns the next line, without its newline.
func (r *Reader) next() ([]byte, error) {
	if !r.sc.Scan() {
		r.line++
		switch err := r.sc.Err(); {
		case errors.Is(err, bufio.ErrTooLong):
			return nil, r.errorf("longer than %d bytes", MaxLine)
		case err != nil:
			return nil, &LineError{Line: r.line, Err: err}
		}
		return nil, io.EOF
	}
	r.line++
	return r.sc.Bytes(), nil
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
