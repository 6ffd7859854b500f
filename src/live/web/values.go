package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

// Values says how the API shows the descriptor values of the keys it
// lists (LIVE_VIEW_VALUES). Values are request data (client addresses,
// user ids, API keys): whoever can read the debug listener reads them.
type Values int

const (
	// PlainValues shows values as the requests sent them (the default).
	PlainValues Values = iota
	// HashedValues shows a keyed hash of each value: the same value shows
	// the same while the process runs, so a client can be followed from
	// one refresh to the next, but the value cannot be found from it (the
	// key is random per process, so even a value from a small set, such
	// as an IPv4 address, cannot be looked up).
	HashedValues
	// TruncatedValues shows the first half of each value, at most
	// truncatedRunes characters, then "…".
	TruncatedValues
)

// ParseValues reads LIVE_VIEW_VALUES: plain, hashed or truncated.
func ParseValues(s string) (Values, error) {
	switch s {
	case "plain":
		return PlainValues, nil
	case "hashed":
		return HashedValues, nil
	case "truncated":
		return TruncatedValues, nil
	}
	return 0, fmt.Errorf("web: unknown values %q (want plain, hashed or truncated)", s)
}

// String is the setting's value for v.
func (v Values) String() string {
	switch v {
	case HashedValues:
		return "hashed"
	case TruncatedValues:
		return "truncated"
	}
	return "plain"
}

// truncatedRunes is the most characters a truncated value keeps, and
// hashedBytes the bytes of a hashed value's HMAC shown (as hex).
const (
	truncatedRunes = 4
	hashedBytes    = 8
)

// masker shows values as its Values says. It is safe for concurrent use.
type masker struct {
	values Values
	key    []byte // of the HMAC, random per process
}

func newMasker(v Values) masker {
	m := masker{values: v}
	if v == HashedValues {
		m.key = make([]byte, 32)
		_, _ = rand.Read(m.key) // never fails (crypto/rand)
	}
	return m
}

// show returns value as m shows it.
func (m masker) show(value string) string {
	switch m.values {
	case HashedValues:
		mac := hmac.New(sha256.New, m.key)
		_, _ = mac.Write([]byte(value))
		return "#" + hex.EncodeToString(mac.Sum(nil)[:hashedBytes])
	case TruncatedValues:
		keep := min(utf8.RuneCountInString(value)/2, truncatedRunes)
		i := 0
		for range keep {
			_, size := utf8.DecodeRuneInString(value[i:])
			i += size
		}
		return value[:i] + "…"
	}
	return value
}

// Shower returns what shows a value as v says, for the debug listener's
// other views of request values (a capture), or nil for PlainValues. A
// hashed value is keyed apart from the live view's, with a key of its own
// for the process's life: one value shows the same in every capture.
func (v Values) Shower() func(string) string {
	if v == PlainValues {
		return nil
	}
	return newMasker(v).show
}
