package capture

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// parser reads one request line. It is encoding/json's job done for this
// one shape, several times faster (measured in the package doc). It
// takes any JSON of the shape (keys in any order, any white space, every
// escape) and refuses anything else; where encoding/json is lenient (keys
// in another case, a key twice, null for a string) it refuses too, so
// that what it reads, encoding/json reads the same (FuzzParseRequestLine).
// Its strings are slices of the line, which the caller converts to a
// string once, unless they hold escapes.
type parser struct {
	s   string
	pos int
	// escapes counts the bytes of the strings made for escapes.
	escapes int
}

// errUnknownField marks a key the line's object must not have.
var errUnknownField = errors.New("unknown field")

func (p *parser) fail(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.pos+1, fmt.Sprintf(format, args...))
}

func (p *parser) space() {
	for p.pos < len(p.s) {
		switch p.s[p.pos] {
		case ' ', '\t', '\r', '\n':
			p.pos++
		default:
			return
		}
	}
}

// consume skips white space and the byte c, or fails.
func (p *parser) consume(c byte) error {
	p.space()
	if p.pos >= len(p.s) || p.s[p.pos] != c {
		return p.fail("want %q", c)
	}
	p.pos++
	return nil
}

// peek skips white space and reports whether the next byte is c.
func (p *parser) peek(c byte) bool {
	p.space()
	return p.pos < len(p.s) && p.s[p.pos] == c
}

// object calls field for each key of an object, and expects field to read
// its value. A key given twice is refused (encoding/json would keep the
// last; no writer of captures gives one twice).
func (p *parser) object(field func(key string) error) error {
	if err := p.consume('{'); err != nil {
		return err
	}
	if p.peek('}') {
		p.pos++
		return nil
	}
	var seen [8]string
	n := 0
	for {
		key, err := p.str()
		if err != nil {
			return err
		}
		for _, k := range seen[:n] {
			if k == key {
				return p.fail("%q twice", key)
			}
		}
		if n < len(seen) {
			seen[n] = key
			n++
		}
		if err := p.consume(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		p.space()
		if p.pos < len(p.s) && p.s[p.pos] == ',' {
			p.pos++
			continue
		}
		return p.consume('}')
	}
}

// array calls elem for each element of an array; null is none.
func (p *parser) array(elem func(i int) error) error {
	if p.null() {
		return nil
	}
	if err := p.consume('['); err != nil {
		return err
	}
	if p.peek(']') {
		p.pos++
		return nil
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		p.space()
		if p.pos < len(p.s) && p.s[p.pos] == ',' {
			p.pos++
			continue
		}
		return p.consume(']')
	}
}

// null reads a null, if there is one.
func (p *parser) null() bool {
	p.space()
	if strings.HasPrefix(p.s[p.pos:], "null") {
		p.pos += 4
		return true
	}
	return false
}

func (p *parser) boolean() (bool, error) {
	p.space()
	switch {
	case strings.HasPrefix(p.s[p.pos:], "true"):
		p.pos += 4
		return true, nil
	case strings.HasPrefix(p.s[p.pos:], "false"):
		p.pos += 5
		return false, nil
	case p.null():
		return false, nil
	}
	return false, p.fail("want true or false")
}

// uint reads a non-negative integer of at most max; null is 0.
func (p *parser) uint(max uint64) (uint64, error) {
	if p.null() {
		return 0, nil
	}
	start := p.pos
	for p.pos < len(p.s) && '0' <= p.s[p.pos] && p.s[p.pos] <= '9' {
		p.pos++
	}
	digits := p.s[start:p.pos]
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' ||
		p.pos < len(p.s) && (p.s[p.pos] == '.' || p.s[p.pos] == 'e' || p.s[p.pos] == 'E') {
		p.pos = start
		return 0, p.fail("want a whole number from 0 to %d", max)
	}
	v, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || v > max {
		p.pos = start
		return 0, p.fail("%s is not a whole number from 0 to %d", digits, max)
	}
	return v, nil
}

// int reads an integer that fits an int64; null is 0.
func (p *parser) int() (int64, error) {
	p.space()
	neg := p.pos < len(p.s) && p.s[p.pos] == '-'
	if neg {
		p.pos++
	}
	v, err := p.uint(math.MaxInt64)
	if neg {
		v := -int64(v)
		return v, err
	}
	return int64(v), err
}

// str reads a string: a slice of the line, or, when it holds escapes, a
// new string with them undone. Invalid UTF-8 is refused, as a JSON
// decoder replaces it.
func (p *parser) str() (string, error) {
	if err := p.consume('"'); err != nil {
		return "", err
	}
	start := p.pos
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch {
		case c == '"':
			v := p.s[start:p.pos]
			p.pos++
			if !utf8.ValidString(v) {
				return "", p.fail("a string that is not UTF-8")
			}
			return v, nil
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return "", p.fail("a control character in a string")
		}
		p.pos++
	}
	return "", p.fail("an unterminated string")
}

// escaped finishes a string that holds an escape, from start.
func (p *parser) escaped(start int) (string, error) {
	var b strings.Builder
	b.WriteString(p.s[start:p.pos])
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		switch {
		case c == '"':
			p.pos++
			v := b.String()
			if !utf8.ValidString(v) {
				return "", p.fail("a string that is not UTF-8")
			}
			p.escapes += b.Cap()
			return v, nil
		case c < 0x20:
			return "", p.fail("a control character in a string")
		case c != '\\':
			b.WriteByte(c)
			p.pos++
			continue
		}
		if p.pos+1 >= len(p.s) {
			break
		}
		e := p.s[p.pos+1]
		p.pos += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.fail("a bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				if r2, ok := p.lowSurrogate(); ok {
					r = utf16.DecodeRune(r, r2)
				} else {
					r = utf8.RuneError
				}
			}
			b.WriteRune(r)
		default:
			return "", p.fail("a bad escape \\%c", e)
		}
	}
	return "", p.fail("an unterminated string")
}

// hex4 reads the four hex digits of a \u escape.
func (p *parser) hex4() (rune, bool) {
	if p.pos+4 > len(p.s) {
		return 0, false
	}
	v, err := strconv.ParseUint(p.s[p.pos:p.pos+4], 16, 32)
	if err != nil {
		return 0, false
	}
	p.pos += 4
	return rune(v), true
}

// lowSurrogate reads the \u escape of a surrogate pair's second half, if
// one follows.
func (p *parser) lowSurrogate() (rune, bool) {
	if !strings.HasPrefix(p.s[p.pos:], `\u`) {
		return 0, false
	}
	save := p.pos
	p.pos += 2
	r, ok := p.hex4()
	if !ok || r < 0xdc00 || r > 0xdfff {
		p.pos = save
		return 0, false
	}
	return r, true
}

// requestLine parses p's line, a request line, into req, reusing its
// slices; what it reports as isSummary is a line with a "summary" key,
// which the caller reads apart.
func (p *parser) requestLine(req *Request) (isSummary bool, err error) {
	var ns *int64
	var code string
	codes := req.Codes[:0]
	descs := req.Descriptors[:0]
	*req = Request{}
	err = p.object(func(key string) error {
		switch key {
		case "ns":
			v, err := p.int()
			ns = &v
			return err
		case "domain":
			v, err := p.str()
			req.Domain = v
			return err
		case "hits":
			v, err := p.uint(math.MaxUint32)
			req.Hits = uint32(v)
			return err
		case "descriptors":
			return p.array(func(i int) error {
				if i < cap(descs) {
					descs = descs[:i+1]
					descs[i] = Descriptor{Entries: descs[i].Entries[:0]}
				} else {
					descs = append(descs, Descriptor{})
				}
				return p.descriptor(&descs[i], i)
			})
		case "code":
			v, err := p.str()
			code = v
			return err
		case "codes":
			return p.codes(&codes)
		case "degraded":
			v, err := p.boolean()
			req.Degraded = v
			return err
		case "summary":
			isSummary = true
			return errSummary
		}
		return fmt.Errorf("%w %q", errUnknownField, key)
	})
	if isSummary {
		return true, nil
	}
	if err == nil {
		p.space()
		if p.pos < len(p.s) {
			err = p.fail("more than one JSON value")
		}
	}
	req.Descriptors, req.Codes = descs, codes
	if err != nil {
		return false, err
	}
	return false, req.complete(ns, code)
}

// codes parses a request's "codes", appending them to codes.
func (p *parser) codes(codes *[]bool) error {
	return p.array(func(i int) error {
		v, err := p.str()
		if err != nil {
			return err
		}
		over, ok := parseCode(v)
		if !ok {
			return fmt.Errorf("descriptor %d: code %q (want %s or %s)", i, v, codeOK, codeOverLimit)
		}
		*codes = append(*codes, over)
		return nil
	})
}

// complete checks a request parsed and sets its time, ns, and its answer,
// code.
func (req *Request) complete(ns *int64, code string) error {
	switch {
	case ns == nil:
		return errors.New(`no "ns": not a request`)
	case *ns <= 0:
		return fmt.Errorf("time %d ns is not after 1970", *ns)
	case len(req.Codes) != len(req.Descriptors):
		return fmt.Errorf("%d codes for %d descriptors", len(req.Codes), len(req.Descriptors))
	}
	req.Time = time.Unix(0, *ns)
	over, ok := parseCode(code)
	if !ok {
		return fmt.Errorf("code %q (want %s or %s)", code, codeOK, codeOverLimit)
	}
	req.OverLimit = over
	return nil
}

// errSummary stops the parse of a summary line.
var errSummary = errors.New("summary")

// descriptor parses one descriptor (the i-th) into d.
func (p *parser) descriptor(d *Descriptor, i int) error {
	return p.object(func(key string) error {
		switch key {
		case "entries":
			return p.array(func(j int) error {
				var e rules.Entry
				n := 0
				err := p.array(func(k int) error {
					n++
					v, err := p.str()
					switch k {
					case 0:
						e.Key = v
					case 1:
						e.Value = v
					}
					return err
				})
				if err != nil {
					return err
				}
				if n != 2 {
					return fmt.Errorf("descriptor %d entry %d: %d strings, want [key, value]", i, j, n)
				}
				d.Entries = append(d.Entries, e)
				return nil
			})
		case "hits":
			if p.null() {
				return nil
			}
			v, err := p.uint(math.MaxUint64)
			d.HasHits, d.Hits = true, v
			return err
		case "is_negative_hits":
			v, err := p.boolean()
			d.Refund = v
			return err
		case "limit":
			if p.null() {
				return nil
			}
			o := &Override{}
			d.Limit = o
			return p.object(func(key string) error {
				switch key {
				case "requests_per_unit":
					v, err := p.uint(math.MaxUint32)
					o.RequestsPerUnit = uint32(v)
					return err
				case "unit":
					v, err := p.str()
					if err != nil {
						return err
					}
					u, ok := rules.ParseUnit(v)
					if !ok {
						return fmt.Errorf("descriptor %d: limit unit %q", i, v)
					}
					o.Unit = u
					return nil
				case "unit_multiplier":
					v, err := p.uint(math.MaxUint32)
					o.UnitMultiplier = uint32(v)
					return err
				}
				return fmt.Errorf("%w %q", errUnknownField, key)
			})
		}
		return fmt.Errorf("%w %q", errUnknownField, key)
	})
}
