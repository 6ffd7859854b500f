package rules

import (
	"bytes"
	"strings"
)

// wildcard is a child whose composite key ("key_value") contains '*'. Each
// '*' matches any run of bytes, empty included, anywhere in the pattern:
// "path_/api/*" is a prefix, "host_*.example.com" a suffix and
// "path_/v*/users" has one in the middle. As in envoyproxy/ratelimit the
// pattern is matched against the whole composite "key_value" of the
// request entry.
type wildcard struct {
	// parts is the pattern split at each '*'; there are at least two.
	parts [][]byte
	// fixed is the total length of parts.
	fixed int
	node  *node
}

func newWildcard(pattern string, n *node) *wildcard {
	w := &wildcard{node: n}
	for _, p := range strings.Split(pattern, "*") {
		w.parts = append(w.parts, []byte(p))
		w.fixed += len(p)
	}
	return w
}

// match reports whether s matches the pattern. It does not allocate.
func (w *wildcard) match(s []byte) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(s) < w.fixed || !bytes.HasPrefix(s, first) || !bytes.HasSuffix(s, last) {
		return false
	}
	// The middle parts must appear in order between the first and the
	// last; taking the leftmost occurrence of each is always best.
	rest := s[len(first) : len(s)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := bytes.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
