package mcclient

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
)

// parseAll reads every answer of verb v in b, as a connection's reader
// does, until the bytes run out or an answer is out of step.
func parseAll(v verb, b []byte, maxValue int) (answers []answer, desync error) {
	br := bufio.NewReaderSize(bytes.NewReader(b), 4096)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return answers, nil
		}
		a, desync := parseAnswer(v, line, br, maxValue)
		if desync != nil {
			return answers, desync
		}
		answers = append(answers, a)
	}
}

// TestGetsValueSizeIsBounded: a gets answer that names a data block larger
// than the largest item the store writes is out of step, before anything
// is allocated for it; one at the bound is read.
func TestGetsValueSizeIsBounded(t *testing.T) {
	const maxValue = 16
	at := "VALUE k 0 16 7\r\n" + strings.Repeat("x", 16) + "\r\nEND\r\n"
	got, desync := parseAll(verbGets, []byte(at), maxValue)
	if desync != nil || len(got) != 1 || len(got[0].value) != 16 || got[0].num != 7 {
		t.Fatalf("a block at the bound: %v, %v; want one value of 16 bytes, cas 7", got, desync)
	}
	over := "VALUE k 0 17 7\r\n" + strings.Repeat("x", 17) + "\r\nEND\r\n"
	if got, desync := parseAll(verbGets, []byte(over), maxValue); desync == nil {
		t.Errorf("a block of 17 bytes, bound %d: read %v, want out of step", maxValue, got)
	}
	for _, size := range []string{"1073741824", "18446744073709551615"} {
		if _, desync := parseAll(verbGets, []byte("VALUE k 0 "+size+" 7\r\n"), maxValue); desync == nil {
			t.Errorf("a block of %s bytes, bound %d: read, want out of step", size, maxValue)
		}
	}
	if c := New(Config{}); c.cfg.MaxValue != maxValueDefault {
		t.Errorf("MaxValue by default = %d, want %d", c.cfg.MaxValue, maxValueDefault)
	}
}

// FuzzParseAnswer: whatever a server (or a man in the middle) answers,
// the parser never panics, never hands back a value over the bound, and
// an answer it accepts is one the request can have.
func FuzzParseAnswer(f *testing.F) {
	for _, s := range []string{
		"STORED\r\n", "NOT_STORED\r\n", "EXISTS\r\n", "NOT_FOUND\r\n", "42\r\n",
		"18446744073709551615\r\n", "18446744073709551616\r\n", "END\r\n",
		"VALUE k 0 3 9\r\nabc\r\nEND\r\n", "VALUE k 0 3 9\r\nabcd\r\nEND\r\n",
		"VALUE k 0 99999999999 9\r\n", "VERSION 1.6.21\r\n",
		"SERVER_ERROR out of memory storing object\r\n", "CLIENT_ERROR bad data chunk\r\n",
		"ERROR\r\n", "\r\n", "STORED\r\nSTORED\r\n",
	} {
		for v := verbIncr; v <= verbAddNum; v++ {
			f.Add(uint8(v), []byte(s))
		}
	}
	const maxValue = 64
	f.Fuzz(func(t *testing.T, v uint8, b []byte) {
		vb := verb(v%uint8(verbAddNum) + 1)
		answers, _ := parseAll(vb, b, maxValue)
		for _, a := range answers {
			if len(a.value) > maxValue {
				t.Fatalf("%s: a value of %d bytes, bound %d", vb, len(a.value), maxValue)
			}
			if a.value != nil && vb != verbGets {
				t.Fatalf("%s: a value in an answer to a command that reads none", vb)
			}
			var se *ServerError
			var ce *ClientError
			if a.err != nil && !errors.As(a.err, &se) && !errors.As(a.err, &ce) &&
				!errors.Is(a.err, ErrCacheMiss) && !errors.Is(a.err, ErrNotStored) && !errors.Is(a.err, ErrExists) {
				t.Fatalf("%s: an answer's error %v is none memcached gives", vb, a.err)
			}
		}
	})
}
