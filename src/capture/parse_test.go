package capture

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// jsonRequest decodes a request line with encoding/json, strictly: the
// reference parseRequestLine must agree with.
func jsonRequest(line []byte) (Request, bool) {
	var w struct {
		NS          *int64 `json:"ns"`
		Domain      string `json:"domain"`
		Hits        uint32 `json:"hits"`
		Descriptors []struct {
			Entries [][]string `json:"entries"`
			Hits    *uint64    `json:"hits"`
			Refund  bool       `json:"is_negative_hits"`
			Limit   *struct {
				RequestsPerUnit uint32 `json:"requests_per_unit"`
				Unit            string `json:"unit"`
				UnitMultiplier  uint32 `json:"unit_multiplier"`
			} `json:"limit"`
		} `json:"descriptors"`
		Code     string   `json:"code"`
		Codes    []string `json:"codes"`
		Degraded bool     `json:"degraded"`
	}
	if strict(line, &w) != nil || w.NS == nil || *w.NS <= 0 || len(w.Codes) != len(w.Descriptors) {
		return Request{}, false
	}
	r := Request{Time: time.Unix(0, *w.NS), Domain: w.Domain, Hits: w.Hits, Degraded: w.Degraded}
	var ok bool
	if r.OverLimit, ok = parseCode(w.Code); !ok {
		return Request{}, false
	}
	for i, wd := range w.Descriptors {
		d := Descriptor{}
		for _, e := range wd.Entries {
			if len(e) != 2 {
				return Request{}, false
			}
			d.Entries = append(d.Entries, rules.Entry{Key: e[0], Value: e[1]})
		}
		if wd.Hits != nil {
			d.HasHits, d.Hits = true, *wd.Hits
		}
		d.Refund = wd.Refund
		if l := wd.Limit; l != nil {
			u, ok := rules.ParseUnit(l.Unit)
			if !ok {
				return Request{}, false
			}
			d.Limit = &Override{RequestsPerUnit: l.RequestsPerUnit, Unit: u, UnitMultiplier: l.UnitMultiplier}
		}
		r.Descriptors = append(r.Descriptors, d)
		over, ok := parseCode(w.Codes[i])
		if !ok {
			return Request{}, false
		}
		r.Codes = append(r.Codes, over)
	}
	return r, true
}

// normal makes empty slices nil, so that two decodings compare equal.
func normal(r Request) Request {
	if len(r.Descriptors) == 0 {
		r.Descriptors = nil
	}
	if len(r.Codes) == 0 {
		r.Codes = nil
	}
	for i := range r.Descriptors {
		if len(r.Descriptors[i].Entries) == 0 {
			r.Descriptors[i].Entries = nil
		}
	}
	return r
}

// TestParseRequestLineReadsAnyJSON: a request written otherwise than
// AppendRequest writes it (keys in another order, white space, every
// escape) reads as encoding/json reads it.
func TestParseRequestLineReadsAnyJSON(t *testing.T) {
	t.Parallel()
	line := ` { "codes" : [ "OVER_LIMIT" ] , "degraded":false, "code":"OVER_LIMIT",
		"descriptors":[{"limit":{"unit":"minute","requests_per_unit":5},"hits":0,"entries":[["us\u0065r","a\"b\\c\/d\n\u00e9\ud83d\ude00\ud800"]]}],
		"domain":"web","ns":1764246000123456789,"hits":7 } `
	want, ok := jsonRequest([]byte(line))
	if !ok {
		t.Fatal("encoding/json refuses the line")
	}
	var got Request
	if isSummary, err := parseRequestLine(line, &got); err != nil || isSummary {
		t.Fatalf("parseRequestLine: %v, %v", isSummary, err)
	}
	if !reflect.DeepEqual(normal(got), normal(want)) {
		t.Errorf("parseRequestLine =\n%+v\nencoding/json:\n%+v", got, want)
	}
}

// FuzzParseRequestLine: what the hand parser reads, encoding/json reads the
// same (the parser may refuse what encoding/json's leniency takes: keys in
// another case, a key twice, null for a string), and what AppendRequest
// writes, both read.
func FuzzParseRequestLine(f *testing.F) {
	r := sample()
	f.Add(string(AppendRequest(nil, &r, nil)))
	f.Add(`{"ns":1,"domain":"d","descriptors":[{"entries":[["k","v"]],"hits":3}],"code":"OK","codes":["OK"]}`)
	f.Add(`{"ns":1,"domain":"\u00e9\ud83d\ude00","descriptors":null,"code":"OK","codes":null}`)
	f.Fuzz(func(t *testing.T, line string) {
		var got Request
		isSummary, err := parseRequestLine(line, &got)
		if isSummary {
			return
		}
		want, ok := jsonRequest([]byte(line))
		if err != nil {
			if ok && string(AppendRequest(nil, &want, nil)) == line+"\n" {
				t.Fatalf("line %q as AppendRequest writes it: %v", line, err)
			}
			return
		}
		if !ok {
			t.Fatalf("line %q: parseRequestLine reads %+v, encoding/json refuses it", line, got)
		}
		if !reflect.DeepEqual(normal(got), normal(want)) {
			t.Fatalf("line %q:\nparseRequestLine %+v\nencoding/json    %+v", line, got, want)
		}
	})
}

// BenchmarkParseRequestLine is the hand parser's reason to be (see the
// package doc): a line of typical's request, as AppendRequest writes it,
// read by parseRequestLine as Reader.Next reads it (one string of the
// line) and by encoding/json (jsonRequest: a strict decoding into a wire
// struct, as Reader reads a header, then the same Request).
func BenchmarkParseRequestLine(b *testing.B) {
	line := bytes.TrimSuffix(AppendRequest(nil, typical(), nil), []byte("\n"))
	b.Run("parser", func(b *testing.B) {
		b.ReportAllocs()
		var req Request
		for b.Loop() {
			if _, err := parseRequestLine(string(line), &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := jsonRequest(line); !ok {
				b.Fatal("encoding/json refuses the line")
			}
		}
	})
}

// parseRequestLine parses a request line into req, reusing its slices;
// what it reports as isSummary is a line with a "summary" key, which the
// caller reads apart.
func parseRequestLine(line string, req *Request) (isSummary bool, err error) {
	p := &parser{s: line}
	return p.requestLine(req)
}
