// Package capture records the requests the service decides, for a bounded
// time or number of requests, as NDJSON (one JSON object a line), and reads
// such a capture back, for ratelimit-check -replay. A capture holds what
// clients sent: descriptor values are client addresses, user ids and API
// keys, so it is served on the debug listener only, under its access
// rules, and only while an operator asks for one.
//
// It knows the requests as plain data (Request), not as protos: the
// service, which decides them, fills it. It knows nothing of rules beyond
// their entries and units, of stores or of how a decision is made.
//
// Request lines are read by a parser of their own (parse.go), not by
// encoding/json, because a replay reads millions of them: a line of three
// descriptors takes a median 2.3 µs against 15.6 µs (6.9 times less), with
// 2 allocations (248 B) against 55 (2,752 B) (`go test -run '^$' -bench
// ParseRequestLine -count 6 ./src/capture/`, 2026-12-02, on a shared
// two-core machine). FuzzParseRequestLine holds it to encoding/json's
// reading.
package capture

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// Version is the format of the captures this package writes, in the first
// line of each; Reader refuses others.
const Version = 1

// Request is one decided request: what the client sent, when the service
// decided it, and what it answered.
type Request struct {
	// Time is when the service decided the request: the time its limits
	// counted the hits at. Captures keep it to the nanosecond.
	Time time.Time
	// Domain is the request's domain.
	Domain string
	// Hits is the request's hits_addend; 0 when it did not set one
	// (which counts as 1).
	Hits uint32
	// Descriptors are the request's descriptors, in order.
	Descriptors []Descriptor
	// OverLimit is the overall answer: true for OVER_LIMIT.
	OverLimit bool
	// Codes has each descriptor's answer: true for OVER_LIMIT.
	Codes []bool
	// Degraded says the service decided from this instance's own counts
	// while its store was unreachable (STORE_FAILURE_MODE=local).
	Degraded bool
}

// Descriptor is one descriptor of a Request.
type Descriptor struct {
	// Entries are the descriptor's key/value pairs, in order.
	Entries []rules.Entry
	// HasHits says the descriptor set its own hits_addend, Hits (0 checks
	// without counting); otherwise the request's applies.
	HasHits bool
	Hits    uint64
	// Refund says the descriptor gives its hits back (is_negative_hits).
	Refund bool
	// Limit is the descriptor's own limit override, nil when none.
	Limit *Override
}

// Override is a per-request limit override (Envoy's descriptor limit).
type Override struct {
	RequestsPerUnit uint32
	Unit            rules.Unit
	// UnitMultiplier is the override's unit_multiplier; 0 when it set
	// none (which counts as 1).
	UnitMultiplier uint32
}

// The lines of a capture: a header, one line per request, and a summary.
//
//	{"capture":1,"ns":1764246000000000000,"values":"plain","seconds":60,"requests":100000,"domain":"web"}
//	{"ns":1764246000123456789,"domain":"web","descriptors":[{"entries":[["user","alice"]]}],"code":"OK","codes":["OK"]}
//	{"summary":{"ns":1764246060000000000,"requests":1,"dropped":0,"too_large":0,"bytes":118,"reason":"seconds"}}
//
// A request line's "ns" is Request.Time in Unix nanoseconds; "hits" the
// request's hits_addend, when set; each descriptor's "entries" are [key,
// value] pairs, then its own "hits" when set (0 included),
// "is_negative_hits": true for a refund, and its "limit" override
// ({"requests_per_unit","unit","unit_multiplier"}) when set;
// "code" and "codes" the answer, OK or OVER_LIMIT; "degraded": true for a
// decision from local counts.

// Header is the first line of a capture.
type Header struct {
	// Start is when the capture started.
	Start time.Time `json:"start"`
	// Values says how descriptor values are written: "plain", as the
	// requests sent them, or the name of the transform of Config.Values.
	Values string `json:"values"`
	// Seconds and Requests are the capture's bounds as asked.
	Seconds  int `json:"seconds"`
	Requests int `json:"requests"`
	// Domain, when not empty, is the only domain captured.
	Domain string `json:"domain,omitempty"`
}

// Summary is the last line of a capture: why it ended and what it holds.
type Summary struct {
	// End is when the capture ended.
	End time.Time `json:"end"`
	// Requests is the number of request lines written.
	Requests int64 `json:"requests"`
	// Dropped counts the requests decided during the capture but not
	// written because the reader did not keep up (see Recorder); a
	// capture with drops is not the whole traffic.
	Dropped int64 `json:"dropped"`
	// TooLarge counts the requests left out because their line would
	// have been longer than MaxLine.
	TooLarge int64 `json:"too_large"`
	// Bytes is the size of the request lines written.
	Bytes int64 `json:"bytes"`
	// Reason is why it ended: "seconds", "requests", "bytes" (the
	// capture reached Config.MaxBytes), or "shutdown".
	Reason string `json:"reason"`
}

// MaxLine bounds one line of a capture, in bytes, its newline included. A
// request whose line would be longer is not written (Summary.TooLarge);
// Reader refuses longer lines. The service's requests are bounded by
// GRPC_MAX_RECV_MSG_SIZE (64 KiB by default), so only requests it was told
// to admit up to 4 MiB can reach it.
const MaxLine = 1 << 20

// AppendRequest appends r's line, newline included, to dst. show, when not
// nil, writes each descriptor value as it returns it (see Config.Values).
func AppendRequest(dst []byte, r *Request, show func(string) string) []byte {
	dst = append(dst, `{"ns":`...)
	dst = strconv.AppendInt(dst, r.Time.UnixNano(), 10)
	dst = append(dst, `,"domain":`...)
	dst = appendString(dst, r.Domain)
	if r.Hits != 0 {
		dst = append(dst, `,"hits":`...)
		dst = strconv.AppendUint(dst, uint64(r.Hits), 10)
	}
	dst = append(dst, `,"descriptors":[`...)
	for i := range r.Descriptors {
		d := &r.Descriptors[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"entries":[`...)
		for j, e := range d.Entries {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '[')
			dst = appendString(dst, e.Key)
			dst = append(dst, ',')
			v := e.Value
			if show != nil {
				v = show(v)
			}
			dst = appendString(dst, v)
			dst = append(dst, ']')
		}
		dst = append(dst, ']')
		if d.HasHits {
			dst = append(dst, `,"hits":`...)
			dst = strconv.AppendUint(dst, d.Hits, 10)
		}
		if d.Refund {
			dst = append(dst, `,"is_negative_hits":true`...)
		}
		if o := d.Limit; o != nil {
			dst = append(dst, `,"limit":{"requests_per_unit":`...)
			dst = strconv.AppendUint(dst, uint64(o.RequestsPerUnit), 10)
			dst = append(dst, `,"unit":"`...)
			dst = append(dst, o.Unit.String()...)
			dst = append(dst, '"')
			if o.UnitMultiplier != 0 {
				dst = append(dst, `,"unit_multiplier":`...)
				dst = strconv.AppendUint(dst, uint64(o.UnitMultiplier), 10)
			}
			dst = append(dst, '}')
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"code":`...)
	dst = appendCode(dst, r.OverLimit)
	dst = append(dst, `,"codes":[`...)
	for i, over := range r.Codes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendCode(dst, over)
	}
	dst = append(dst, ']')
	if r.Degraded {
		dst = append(dst, `,"degraded":true`...)
	}
	return append(dst, "}\n"...)
}

// The answers as a capture writes them.
const (
	codeOK        = "OK"
	codeOverLimit = "OVER_LIMIT"
)

func appendCode(dst []byte, over bool) []byte {
	if over {
		return append(dst, `"`+codeOverLimit+`"`...)
	}
	return append(dst, `"`+codeOK+`"`...)
}

// appendHeader appends h's line.
func appendHeader(dst []byte, h *Header) []byte {
	dst = append(dst, `{"capture":`...)
	dst = strconv.AppendInt(dst, Version, 10)
	dst = append(dst, `,"ns":`...)
	dst = strconv.AppendInt(dst, h.Start.UnixNano(), 10)
	dst = append(dst, `,"values":`...)
	dst = appendString(dst, h.Values)
	dst = append(dst, `,"seconds":`...)
	dst = strconv.AppendInt(dst, int64(h.Seconds), 10)
	dst = append(dst, `,"requests":`...)
	dst = strconv.AppendInt(dst, int64(h.Requests), 10)
	if h.Domain != "" {
		dst = append(dst, `,"domain":`...)
		dst = appendString(dst, h.Domain)
	}
	return append(dst, "}\n"...)
}

// appendSummary appends s's line.
func appendSummary(dst []byte, s *Summary) []byte {
	dst = append(dst, `{"summary":{"ns":`...)
	dst = strconv.AppendInt(dst, s.End.UnixNano(), 10)
	for _, f := range []struct {
		name string
		v    int64
	}{{"requests", s.Requests}, {"dropped", s.Dropped}, {"too_large", s.TooLarge}, {"bytes", s.Bytes}} {
		dst = append(dst, `,"`...)
		dst = append(dst, f.name...)
		dst = append(dst, `":`...)
		dst = strconv.AppendInt(dst, f.v, 10)
	}
	dst = append(dst, `,"reason":`...)
	dst = appendString(dst, s.Reason)
	return append(dst, "}}\n"...)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string: '"', '\' and control characters
// escaped; bytes that are not UTF-8 (the service refuses them in requests)
// written as U+FFFD.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\r':
				dst = append(dst, '\\', 'r')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
