package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
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

// wireRequest is a request line as written (see the format in record.go).
type wireRequest struct {
	NS          *int64           `json:"ns"`
	Domain      string           `json:"domain"`
	Hits        uint32           `json:"hits"`
	Descriptors []wireDescriptor `json:"descriptors"`
	Code        string           `json:"code"`
	Codes       []string         `json:"codes"`
	Degraded    bool             `json:"degraded"`
	Summary     *wireSummary     `json:"summary"`
}

type wireDescriptor struct {
	Entries [][]string `json:"entries"`
	Hits    *uint64    `json:"hits"`
	Limit   *struct {
		RequestsPerUnit uint32 `json:"requests_per_unit"`
		Unit            string `json:"unit"`
		UnitMultiplier  uint32 `json:"unit_multiplier"`
	} `json:"limit"`
}

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
	var w wireRequest
	if err := strict(b, &w); err != nil {
		return r.errorf("not a request: %s", describe(b, err))
	}
	if w.Summary != nil {
		if w.NS != nil || w.Domain != "" || w.Descriptors != nil || w.Codes != nil || w.Code != "" {
			return r.errorf("a summary with a request's fields")
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
	}
	return r.request(&w, req)
}

// request checks w's form and copies it into req.
func (r *Reader) request(w *wireRequest, req *Request) error {
	switch {
	case w.NS == nil:
		return r.errorf(`no "ns": not a request`)
	case *w.NS <= 0:
		return r.errorf("time %d ns is not after 1970", *w.NS)
	case len(w.Codes) != len(w.Descriptors):
		return r.errorf("%d codes for %d descriptors", len(w.Codes), len(w.Descriptors))
	}
	over, ok := parseCode(w.Code)
	if !ok {
		return r.errorf("code %q (want %s or %s)", w.Code, codeOK, codeOverLimit)
	}
	*req = Request{
		Time: time.Unix(0, *w.NS), Domain: w.Domain, Hits: w.Hits, OverLimit: over, Degraded: w.Degraded,
		Descriptors: req.Descriptors[:0], Codes: req.Codes[:0],
	}
	for i, wd := range w.Descriptors {
		d := Descriptor{Entries: make([]rules.Entry, len(wd.Entries))}
		for j, e := range wd.Entries {
			if len(e) != 2 {
				return r.errorf("descriptor %d entry %d: %d strings, want [key, value]", i, j, len(e))
			}
			d.Entries[j] = rules.Entry{Key: e[0], Value: e[1]}
		}
		if wd.Hits != nil {
			d.HasHits, d.Hits = true, *wd.Hits
		}
		if l := wd.Limit; l != nil {
			unit, ok := rules.ParseUnit(l.Unit)
			if !ok {
				return r.errorf("descriptor %d: limit unit %q", i, l.Unit)
			}
			d.Limit = &Override{RequestsPerUnit: l.RequestsPerUnit, Unit: unit, UnitMultiplier: l.UnitMultiplier}
		}
		req.Descriptors = append(req.Descriptors, d)
		over, ok := parseCode(w.Codes[i])
		if !ok {
			return r.errorf("descriptor %d: code %q (want %s or %s)", i, w.Codes[i], codeOK, codeOverLimit)
		}
		req.Codes = append(req.Codes, over)
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
