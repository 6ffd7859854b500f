package capture

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// sample is a request with every field set, and values that need escaping.
func sample() Request {
	return Request{
		Time:   time.Unix(1_764_246_000, 123_456_789),
		Domain: "web",
		Hits:   3,
		Descriptors: []Descriptor{
			{Entries: []rules.Entry{{Key: "user", Value: "al\"ice\\\n\x01é"}, {Key: "path", Value: "/x"}}},
			{Entries: []rules.Entry{{Key: "ip", Value: ""}}, HasHits: true, Hits: 0},
			{Entries: []rules.Entry{{Key: "k", Value: "v"}}, HasHits: true, Hits: 7,
				Limit: &Override{RequestsPerUnit: 5, Unit: rules.Minute, UnitMultiplier: 2}},
			{Entries: []rules.Entry{{Key: "k", Value: "w"}}, Limit: &Override{RequestsPerUnit: 1, Unit: rules.Hour}},
			{Entries: []rules.Entry{{Key: "k", Value: "r"}}, HasHits: true, Hits: 2, Refund: true},
		},
		OverLimit: true,
		Codes:     []bool{false, false, true, false, false},
		Degraded:  true,
	}
}

// capture writes a capture of the requests, with a header and a summary.
func capture(reqs ...Request) []byte {
	b := appendHeader(nil, &Header{Start: time.Unix(1_764_246_000, 0), Values: "plain", Seconds: 10, Requests: 100})
	for i := range reqs {
		b = AppendRequest(b, &reqs[i], nil)
	}
	return appendSummary(b, &Summary{End: time.Unix(1_764_246_010, 0), Requests: int64(len(reqs)), Reason: "seconds"})
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	want := sample()
	plain := Request{Time: time.Unix(1_764_246_001, 0), Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "a", Value: "b"}}}}, Codes: []bool{false}}
	rd, err := NewReader(bytes.NewReader(capture(want, plain)))
	if err != nil {
		t.Fatal(err)
	}
	if h := rd.Header(); h.Seconds != 10 || h.Requests != 100 || h.Values != "plain" || !h.Start.Equal(time.Unix(1_764_246_000, 0)) {
		t.Errorf("Header() = %+v", h)
	}
	var got Request
	for _, w := range []Request{want, plain} {
		if err := rd.Next(&got); err != nil {
			t.Fatal(err)
		}
		if !got.Time.Equal(w.Time) {
			t.Errorf("Time = %v, want %v", got.Time, w.Time)
		}
		got.Time = w.Time
		if !reflect.DeepEqual(got, w) {
			t.Errorf("read\n%+v\nwant\n%+v", got, w)
		}
	}
	if err := rd.Next(&got); err != io.EOF {
		t.Fatalf("after the last request: %v, want io.EOF", err)
	}
	if s := rd.Summary(); s == nil || s.Requests != 2 || s.Reason != "seconds" {
		t.Errorf("Summary() = %+v", s)
	}
}

// TestAppendRequestLine pins the format of a request line.
func TestAppendRequestLine(t *testing.T) {
	t.Parallel()
	r := sample()
	got := string(AppendRequest(nil, &r, nil))
	want := `{"ns":1764246000123456789,"domain":"web","hits":3,"descriptors":[` +
		`{"entries":[["user","al\"ice\\\n\u0001é"],["path","/x"]]},` +
		`{"entries":[["ip",""]],"hits":0},` +
		`{"entries":[["k","v"]],"hits":7,"limit":{"requests_per_unit":5,"unit":"MINUTE","unit_multiplier":2}},` +
		`{"entries":[["k","w"]],"limit":{"requests_per_unit":1,"unit":"HOUR"}},` +
		`{"entries":[["k","r"]],"hits":2,"is_negative_hits":true}],` +
		`"code":"OVER_LIMIT","codes":["OK","OK","OVER_LIMIT","OK","OK"],"degraded":true}` + "\n"
	if got != want {
		t.Errorf("AppendRequest =\n%s\nwant\n%s", got, want)
	}
	// Values a request cannot hold (the service refuses invalid UTF-8)
	// still make a valid line.
	r = Request{Time: time.Unix(1, 0), Domain: "d\xff", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "\xc3"}}}}, Codes: []bool{false}}
	if got := string(AppendRequest(nil, &r, nil)); !strings.Contains(got, `"domain":"d\ufffd"`) || !strings.Contains(got, `["k","\ufffd"]`) {
		t.Errorf("AppendRequest of invalid UTF-8 = %s", got)
	}
	// show writes the values it is given, never the keys or the domain.
	r = Request{Time: time.Unix(1, 0), Domain: "d", Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "user", Value: "alice"}}}}, Codes: []bool{false}}
	if got := string(AppendRequest(nil, &r, func(v string) string { return "#" + strings.ToUpper(v) })); !strings.Contains(got, `"domain":"d"`) || !strings.Contains(got, `["user","#ALICE"]`) {
		t.Errorf("AppendRequest with show = %s", got)
	}
}

// TestReaderRefusesBadLines: every line that is not what AppendRequest
// writes is an error naming its line, and no input makes the Reader
// hold more than a line.
func TestReaderRefusesBadLines(t *testing.T) {
	t.Parallel()
	head := string(appendHeader(nil, &Header{Start: time.Unix(1, 0), Values: "plain", Seconds: 1, Requests: 1}))
	ok := `{"ns":1,"domain":"d","descriptors":[{"entries":[["k","v"]]}],"code":"OK","codes":["OK"]}` + "\n"
	tests := []struct {
		name string
		give string
		line int
		msg  string
	}{
		{"empty", "", 1, "empty: not a capture"},
		{"not_json", "hello\n", 1, "not a capture's first line"},
		{"no_header", ok, 1, "not a capture's first line"},
		{"other_version", `{"capture":2,"ns":1}` + "\n", 1, "capture format 2, this version reads 1"},
		{"garbage", head + ok + "\x00\x01{\n", 3, "not a request: at byte 1: want '{'"},
		{"unknown_field", head + `{"ns":1,"domain":"d","descriptors":[],"code":"OK","codes":[],"extra":1}` + "\n", 2, `unknown field "extra"`},
		{"no_time", head + `{"domain":"d","descriptors":[],"code":"OK","codes":[]}` + "\n", 2, `no "ns"`},
		{"negative_time", head + `{"ns":-5,"domain":"d","descriptors":[],"code":"OK","codes":[]}` + "\n", 2, "time -5 ns is not after 1970"},
		{"codes_count", head + `{"ns":1,"domain":"d","descriptors":[{"entries":[]}],"code":"OK","codes":[]}` + "\n", 2, "0 codes for 1 descriptors"},
		{"bad_code", head + `{"ns":1,"domain":"d","descriptors":[],"code":"MAYBE","codes":[]}` + "\n", 2, `code "MAYBE"`},
		{"bad_entry", head + `{"ns":1,"domain":"d","descriptors":[{"entries":[["k","v","x"]]}],"code":"OK","codes":["OK"]}` + "\n", 2, "descriptor 0 entry 0: 3 strings, want [key, value]"},
		{"entry_not_strings", head + `{"ns":1,"domain":"d","descriptors":[{"entries":[[1,2]]}],"code":"OK","codes":["OK"]}` + "\n", 2, "not a request: at byte 50: want '\"'"},
		{"bad_unit", head + `{"ns":1,"domain":"d","descriptors":[{"entries":[],"limit":{"requests_per_unit":1,"unit":"FORTNIGHT"}}],"code":"OK","codes":["OK"]}` + "\n", 2, `limit unit "FORTNIGHT"`},
		{"huge_hits", head + `{"ns":1,"domain":"d","hits":99999999999,"descriptors":[],"code":"OK","codes":[]}` + "\n", 2, "99999999999 is not a whole number from 0 to 4294967295"},
		{"two_values", head + ok[:len(ok)-1] + `{}` + "\n", 2, "more than one JSON value"},
		{"too_long", head + ok + `{"ns":1,"domain":"` + strings.Repeat("a", MaxLine) + "\"}\n", 3, fmt.Sprintf("longer than %d bytes", MaxLine)},
		{"bad_escape", head + `{"ns":1,"domain":"d\q","descriptors":[],"code":"OK","codes":[]}` + "\n", 2, `a bad escape \q`},
		{"not_utf8", head + "{\"ns\":1,\"domain\":\"d\xff\",\"descriptors\":[],\"code\":\"OK\",\"codes\":[]}\n", 2, "a string that is not UTF-8"},
		{"control_character", head + "{\"ns\":1,\"domain\":\"d\x01\",\"descriptors\":[],\"code\":\"OK\",\"codes\":[]}\n", 2, "a control character in a string"},
		{"float", head + `{"ns":1.5,"domain":"d","descriptors":[],"code":"OK","codes":[]}` + "\n", 2, "want a whole number"},
		{"unterminated", head + `{"ns":1,"domain":"d` + "\n", 2, "an unterminated string"},
		{"unknown_descriptor_field", head + `{"ns":1,"domain":"d","descriptors":[{"entries":[],"x":1}],"code":"OK","codes":["OK"]}` + "\n", 2, `unknown field "x"`},
		{"after_summary", head + `{"summary":{"ns":1,"requests":0,"reason":"seconds"}}` + "\n" + ok, 3, "a line after the summary"},
		{"summary_and_request", head + `{"ns":1,"summary":{"ns":1}}` + "\n", 2, `not a summary: json: unknown field "ns"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rd, err := NewReader(strings.NewReader(tt.give))
			var req Request
			for err == nil {
				err = rd.Next(&req)
			}
			var le *LineError
			if !errors.As(err, &le) || le.Line != tt.line || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error = %v, want line %d: %q", err, tt.line, tt.msg)
			}
		})
	}
}

// TestReaderSkipsLongLines: a line longer than MaxLine is an error wrapping
// ErrTooLong that names it, after which the Reader reads on; it reads past
// such a line without holding it (16 MiB of one line, read through, cost
// no more than the Reader's buffer), and Held counts what a request keeps.
// Not parallel: it counts the bytes the process allocates.
func TestReaderSkipsLongLines(t *testing.T) {
	head := string(appendHeader(nil, &Header{Start: time.Unix(1, 0), Values: "plain", Seconds: 1, Requests: 1}))
	ok := `{"ns":1,"domain":"d","descriptors":[{"entries":[["k","v"]]}],"code":"OK","codes":["OK"]}` + "\n"
	escaped := `{"ns":2,"domain":"d","descriptors":[{"entries":[["k","\n\n"]]}],"code":"OK","codes":["OK"]}` + "\r\n"
	long := io.MultiReader(strings.NewReader(`{"ns":1,"domain":"`), bytes.NewReader(bytes.Repeat([]byte{'a'}, 16<<20)), strings.NewReader("\"}\n"))
	in := io.MultiReader(strings.NewReader(head+ok), long, strings.NewReader(escaped+strings.Repeat("x", MaxLine)))
	rd, err := NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	var req Request
	if err := rd.Next(&req); err != nil || rd.Held() != len(ok)-1 {
		t.Fatalf("line 2: %v, held %d, want %d", err, rd.Held(), len(ok)-1)
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	err = rd.Next(&req)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	var le *LineError
	if !errors.As(err, &le) || le.Line != 3 || !errors.Is(err, ErrTooLong) {
		t.Fatalf("line 3 = %v, want line 3, too long", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("reading past a line of 16 MiB allocated %d bytes", got)
	}
	if err := rd.Next(&req); err != nil || req.Descriptors[0].Entries[0].Value != "\n\n" || rd.Line() != 4 {
		t.Fatalf("line 4 = %v, %+v", err, req)
	}
	if held := rd.Held(); held <= len(escaped)-2 {
		t.Errorf("Held() = %d, want the line's %d bytes and its escapes'", held, len(escaped)-2)
	}
	// A last line of MaxLine bytes without its newline is too long as well.
	if err := rd.Next(&req); !errors.Is(err, ErrTooLong) || rd.Line() != 5 {
		t.Fatalf("line 5 = %v", err)
	}
	if err := rd.Next(&req); err != io.EOF {
		t.Fatalf("after the last line: %v, want io.EOF", err)
	}
}

// TestReaderCopiesLongLinesStrings: the strings of a line longer than
// sliceMax are copies, so that keeping one (as the service keeps a domain
// in a statistic's name) does not keep the line: the domains of 2,000
// lines of 8 KB kept, the heap grows by far less than the lines. Not
// parallel: it measures the heap.
func TestReaderCopiesLongLinesStrings(t *testing.T) {
	var b strings.Builder
	b.WriteString(string(appendHeader(nil, &Header{Start: time.Unix(1, 0), Values: "plain", Seconds: 1, Requests: 1})))
	for i := range 2000 {
		fmt.Fprintf(&b, `{"ns":1,"domain":"d%d","descriptors":[{"entries":[["k","%s"]]}],"code":"OK","codes":["OK"]}`+"\n", i, strings.Repeat("v", 8<<10))
	}
	in := b.String()
	rd, err := NewReader(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kept := make([]string, 0, 2000)
	for {
		var req Request
		if err := rd.Next(&req); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, req.Domain)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); len(kept) != 2000 || grown > 1<<20 {
		t.Errorf("keeping the domains of %d lines of 8 KB grew the heap by %d bytes", len(kept), grown)
	}
	runtime.KeepAlive(kept)
	runtime.KeepAlive(in)
}

func FuzzReader(f *testing.F) {
	f.Add(capture(sample()))
	f.Add([]byte(`{"capture":1}` + "\n" + `{"ns":1,"domain":"","descriptors":null,"code":"OK","codes":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		var req Request
		for range 1000 {
			if err := rd.Next(&req); err != nil {
				return
			}
			// What reads must write back and read again the same.
			again, err := NewReader(bytes.NewReader(capture(req)))
			if err != nil {
				t.Fatal(err)
			}
			var req2 Request
			if err := again.Next(&req2); err != nil {
				t.Fatalf("a request read does not read again: %v", err)
			}
			req2.Time = req.Time
			if !reflect.DeepEqual(req.Descriptors, req2.Descriptors) && len(req.Descriptors) > 0 {
				t.Fatalf("read %+v, then %+v", req, req2)
			}
		}
	})
}
