package loadgen

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// precomputeLimit is the largest number of distinct strings a field expands
// to that is built once up front. Larger key spaces are formatted per request
// into a per-worker buffer (one string allocation each).
const precomputeLimit = 1 << 17

// Template is a compiled descriptor template: a chain of key=value entries
// in which every {lo..hi} range is replaced, per request, by an integer drawn
// uniformly at random from lo to hi inclusive.
//
// The syntax is entries separated by commas, each `key=value`:
//
//	user_id=user-{0..9999}
//	tenant=t-{0..9},path=/api/{0..99},method=GET
//
// Ranges may appear in keys and values, several per field; the draws are
// independent. Commas, '=' and braces cannot be escaped. A Template is
// immutable and safe for concurrent use.
type Template struct {
	src     string
	entries []templateEntry
}

type templateEntry struct {
	key, value field
}

// field is one key or value: literal text and ranges, in order.
type field struct {
	parts []part
	// size is the number of distinct strings the field expands to, capped at
	// precomputeLimit+1 so the product cannot overflow.
	size int64
	// values holds every expansion when size <= precomputeLimit, in
	// mixed-radix order of the ranges.
	values []string
}

// part is literal text when n == 0, else the range lo..lo+n-1.
type part struct {
	lit string
	lo  int64
	n   int64
}

// ParseTemplate compiles one descriptor template.
func ParseTemplate(s string) (*Template, error) {
	if s == "" {
		return nil, errors.New("bench: empty descriptor template")
	}
	t := &Template{src: s}
	for i, raw := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(raw, "=")
		if !ok {
			return nil, fmt.Errorf("bench: descriptor %q: entry %d %q: want key=value", s, i+1, raw)
		}
		if k == "" {
			return nil, fmt.Errorf("bench: descriptor %q: entry %d: empty key", s, i+1)
		}
		kf, err := parseField(k)
		if err != nil {
			return nil, fmt.Errorf("bench: descriptor %q: entry %d key: %w", s, i+1, err)
		}
		vf, err := parseField(v)
		if err != nil {
			return nil, fmt.Errorf("bench: descriptor %q: entry %d value: %w", s, i+1, err)
		}
		t.entries = append(t.entries, templateEntry{key: kf, value: vf})
	}
	return t, nil
}

func parseField(s string) (field, error) {
	var f field
	f.size = 1
	for s != "" {
		open := strings.IndexByte(s, '{')
		if open < 0 {
			f.parts = append(f.parts, part{lit: s})
			break
		}
		if open > 0 {
			f.parts = append(f.parts, part{lit: s[:open]})
		}
		end := strings.IndexByte(s[open:], '}')
		if end < 0 {
			return field{}, fmt.Errorf("unterminated range in %q", s)
		}
		spec := s[open+1 : open+end]
		los, his, ok := strings.Cut(spec, "..")
		if !ok {
			return field{}, fmt.Errorf("range {%s}: want {lo..hi}", spec)
		}
		lo, err1 := strconv.ParseInt(los, 10, 64)
		hi, err2 := strconv.ParseInt(his, 10, 64)
		if err1 != nil || err2 != nil || lo < 0 || hi < lo || hi-lo == 1<<63-1 {
			return field{}, fmt.Errorf("range {%s}: want non-negative integers lo <= hi", spec)
		}
		p := part{lo: lo, n: hi - lo + 1}
		f.parts = append(f.parts, p)
		f.size = min(f.size*min(p.n, precomputeLimit+1), precomputeLimit+1)
		s = s[open+end+1:]
	}
	if f.size <= precomputeLimit && f.dynamic() {
		f.values = make([]string, f.size)
		buf := make([]byte, 0, 64)
		for i := range f.values {
			buf = f.appendIndex(buf[:0], int64(i))
			f.values[i] = string(buf)
		}
	}
	return f, nil
}

func (f *field) dynamic() bool {
	for _, p := range f.parts {
		if p.n > 0 {
			return true
		}
	}
	return false
}

// literal returns the field's text when it has no ranges.
func (f *field) literal() string {
	if len(f.parts) == 1 {
		return f.parts[0].lit
	}
	return ""
}

// appendIndex appends expansion number i in mixed-radix order (last range
// varies fastest).
func (f *field) appendIndex(buf []byte, i int64) []byte {
	digits := make([]int64, len(f.parts))
	for j := len(f.parts) - 1; j >= 0; j-- {
		if p := f.parts[j]; p.n > 0 {
			digits[j] = i % p.n
			i /= p.n
		}
	}
	for j, p := range f.parts {
		if p.n == 0 {
			buf = append(buf, p.lit...)
		} else {
			buf = strconv.AppendInt(buf, p.lo+digits[j], 10)
		}
	}
	return buf
}

// pick returns a random expansion. buf is scratch space owned by the caller.
func (f *field) pick(r *rand.Rand, buf *[]byte) string {
	if f.values != nil {
		return f.values[r.Int64N(int64(len(f.values)))]
	}
	b := (*buf)[:0]
	for _, p := range f.parts {
		if p.n == 0 {
			b = append(b, p.lit...)
		} else {
			b = strconv.AppendInt(b, p.lo+r.Int64N(p.n), 10)
		}
	}
	*buf = b
	return string(b)
}

// String returns the template as it was written.
func (t *Template) String() string { return t.src }

// Size returns the number of distinct descriptors the template expands to,
// saturating at the largest int64.
func (t *Template) Size() int64 {
	size := int64(1)
	for _, e := range t.entries {
		for _, f := range []*field{&e.key, &e.value} {
			for _, p := range f.parts {
				if p.n == 0 {
					continue
				}
				if size > (1<<63-1)/p.n {
					return 1<<63 - 1
				}
				size *= p.n
			}
		}
	}
	return size
}

// Expand returns one random expansion as key/value pairs, in order. It is
// meant for tests and display; the load loop reuses request messages instead.
func (t *Template) Expand(r *rand.Rand) [][2]string {
	var buf []byte
	out := make([][2]string, len(t.entries))
	for i := range t.entries {
		e := &t.entries[i]
		out[i] = [2]string{e.key.expand(r, &buf), e.value.expand(r, &buf)}
	}
	return out
}

func (f *field) expand(r *rand.Rand, buf *[]byte) string {
	if !f.dynamic() {
		return f.literal()
	}
	return f.pick(r, buf)
}
