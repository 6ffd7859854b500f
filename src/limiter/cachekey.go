package limiter

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/rules"
)

// CacheKey appends the cache key of one descriptor under limit l to dst and
// returns the extended slice, in the style of strconv.AppendInt: with a dst
// of enough capacity it does not allocate.
//
// For fixed_window the key is byte for byte envoyproxy/ratelimit's (its
// src/limiter/cache_key.go), so a rolling upgrade keeps counting in the same
// Redis or Memcached keys:
//
//	prefix + domain + "_" + key1 + "_" + value1 + "_" + ... + keyN + "_" + valueN + "_" + start
//
// where start is the window start in Unix seconds, now.Unix() / w * w, and w
// is the window in seconds (unit × unit_multiplier; windows are aligned to
// the epoch, so a 5-minute window starts at :00, :05, ...).
//
// The other algorithms keep continuous state, so their key has no window
// start; it ends with the window in seconds and the algorithm's YAML name:
//
//	prefix + domain + "_" + key1 + "_" + value1 + "_" + ... + w + "_" + algorithm
//
// for example "rl_api_user_alice_60_token_bucket". A fixed-window key always
// ends with a digit and these end with a letter, so the two never collide;
// no algorithm name is a suffix of another, so the three never collide
// with each other either. Putting w in the key means a rule whose window
// changes starts afresh instead of reading state kept for another window.
//
// A limit of a descriptor's rate_limits (rules.Limit.InList) keys its
// window by its unit and multiplier, so that the limits of one list, and a
// single rate_limit on the same descriptor, never share a key:
//
//	prefix + "{" + domain + "_" + key1 + "_" + value1 + ... + valueN + "}_" + start + "_" + m + "_" + unit
//	prefix + "{" + domain + "_" + key1 + "_" + value1 + ... + valueN + "}_" + m + "_" + unit + "_" + algorithm
//
// for fixed windows and the other algorithms, where m is unit_multiplier
// and unit the lower-case unit ("rl_{api_user_alice}_1699920000_1_second",
// "rl_{api_user_alice}_1_hour_token_bucket"). A list's fixed-window key
// ends with a unit's name, a letter that no single-limit key ends with,
// and its other keys have a unit's name before the algorithm where
// single-limit keys have digits; the rules refuse two limits of one list
// with the same algorithm, unit and multiplier. The braces are a Redis
// Cluster hash tag: the keys of one descriptor's limits hash to one slot
// whatever the values hold (a '{' or '}' in them can only end the tag
// sooner, within the part the keys share), so that Redis applies them in
// one script.
//
// A shadow limit of a list (rules.Limit.Shadow) counts in a key of its
// own: its list key followed by "_shadow"
// ("rl_{api_user_alice}_1699920000_1_minute_shadow"), so that it may have
// the algorithm and window of a limit in force beside it, whose counts it
// must never change. No unit or algorithm name ends with "shadow".
//
// A limit with an unknown unit is keyed as a one-second window; the rules
// package never builds one.
func CacheKey(dst []byte, prefix, domain string, entries []rules.Entry, l *rules.Limit, now time.Time) []byte {
	dst = append(dst, prefix...)
	dst = openTag(dst, l)
	dst = append(dst, domain...)
	dst = append(dst, '_')
	for _, e := range entries {
		dst = append(dst, e.Key...)
		dst = append(dst, '_')
		dst = append(dst, e.Value...)
		dst = append(dst, '_')
	}
	return appendSuffix(dst, l, now)
}

// openTag opens the hash tag of a list's key (see CacheKey).
func openTag(dst []byte, l *rules.Limit) []byte {
	if l.InList() {
		return append(dst, '{')
	}
	return dst
}

// KeyFormat selects how the limiter builds cache keys (CACHE_KEY_FORMAT).
type KeyFormat uint8

// The key formats.
const (
	// AnchorKeys is CacheKey, envoyproxy/ratelimit's format: the zero
	// value, for Redis and Memcached shared with the anchor during a
	// rolling upgrade.
	AnchorKeys KeyFormat = iota
	// EscapedKeys is EscapedCacheKey, where no two descriptors share a key.
	EscapedKeys
)

// EscapedCacheKey appends the cache key of one descriptor under limit l to
// dst in the escaped format and returns the extended slice; like CacheKey,
// it does not allocate when dst has enough capacity.
//
// CacheKey joins the parts with '_' as the anchor does, so a '_' inside a
// part can move the border between two parts: under a rule k1 -> k2 the
// descriptors (k1=x_k2_y)(k2=z) and (k1=x)(k2=y_k2_z) both give
// "d_k1_x_k2_y_k2_z_..." and count on one key, and a client that controls a
// header value can spend another client's budget. Here the domain, every
// entry key and every value are escaped, '\' as `\\` and '_' as `\_`:
//
//	prefix + esc(domain) + "_" + esc(key1) + "_" + esc(value1) + "_" + ... + esc(valueN) + "_" + suffix
//
// with CacheKey's suffix (the window start, or the window and the
// algorithm's name). Every unescaped '_' after the prefix is a border, so
// the parts read back unambiguously and two descriptors that differ in any
// part (or in their number of entries) never share a key. The prefix is the
// operator's and is kept as it is. A key whose parts hold neither '_' nor
// '\' is the same in both formats.
func EscapedCacheKey(dst []byte, prefix, domain string, entries []rules.Entry, l *rules.Limit, now time.Time) []byte {
	dst = append(dst, prefix...)
	dst = openTag(dst, l)
	dst = appendEscaped(dst, domain)
	dst = append(dst, '_')
	for _, e := range entries {
		dst = appendEscaped(dst, e.Key)
		dst = append(dst, '_')
		dst = appendEscaped(dst, e.Value)
		dst = append(dst, '_')
	}
	return appendSuffix(dst, l, now)
}

// appendEscaped appends s with '\' and '_' preceded by a '\', copying the
// runs between them whole.
func appendEscaped(dst []byte, s string) []byte {
	run := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '_' || c == '\\' {
			dst = append(dst, s[run:i]...)
			dst = append(dst, '\\')
			run = i
		}
	}
	return append(dst, s[run:]...)
}

// appendSuffix appends what ends every key: the window start for a fixed
// window, the window and the algorithm's name otherwise (see CacheKey).
func appendSuffix(dst []byte, l *rules.Limit, now time.Time) []byte {
	w := windowSeconds(l)
	if l.InList() {
		// Close the hash tag over the descriptor: "..._valueN}_".
		dst = append(dst[:len(dst)-1], '}', '_')
		if l.Algorithm.Windowed() {
			dst = strconv.AppendInt(dst, WindowStart(now, w), 10)
			dst = append(dst, '_')
		}
		dst = strconv.AppendUint(dst, uint64(max(l.UnitMultiplier, 1)), 10)
		dst = append(dst, '_')
		dst = append(dst, unitNames[unitIndex(l.Unit)]...)
		if !l.Algorithm.Windowed() {
			dst = append(dst, '_')
			dst = append(dst, l.Algorithm.String()...)
		}
		if l.Shadow {
			dst = append(dst, shadowSuffix...)
		}
		return dst
	}
	if l.Algorithm.Windowed() {
		return strconv.AppendInt(dst, WindowStart(now, w), 10)
	}
	dst = strconv.AppendInt(dst, w, 10)
	dst = append(dst, '_')
	return append(dst, l.Algorithm.String()...)
}

// SplitListKey splits key, the key CacheKey or EscapedCacheKey built for a
// limit of algorithm a in a descriptor's rate_limits, into the part every
// limit of that descriptor shares, prefix + "{" + ... + "}", and the part
// that tells the limit apart and stays the same from one window to the
// next: the key's end without a fixed window's start ("1_second" for
// "rl_{api_user_alice}_1699920000_1_second", "1_hour_token_bucket" for
// "rl_{api_user_alice}_1_hour_token_bucket"). A store that keeps all the
// limits of a list in one item (Memcached) names the item and each limit's
// state in it so. ok is false when key is not such a key. Both parts are
// substrings of key.
//
// The descriptor's part ends at the last '}': a value may hold braces, but
// what CacheKey appends after the descriptor holds none.
func SplitListKey(key string, a rules.Algorithm) (shared, limit string, ok bool) {
	end := strings.LastIndexByte(key, '}')
	if end < 0 || !strings.HasPrefix(key[end+1:], "_") {
		return "", "", false
	}
	shared, rest := key[:end+1], key[end+2:]
	if a.Windowed() {
		// The window start, maybe negative, then '_'.
		n := digits(strings.TrimPrefix(rest, "-"))
		if n == 0 {
			return "", "", false
		}
		n += len(rest) - len(strings.TrimPrefix(rest, "-"))
		if !strings.HasPrefix(rest[n:], "_") {
			return "", "", false
		}
		rest = rest[n+1:]
	}
	// The multiplier, '_' and the unit; then '_' and the algorithm for
	// the continuous ones; then shadowSuffix for a shadow limit, which is
	// part of the limit's part.
	limit = rest
	rest = strings.TrimSuffix(rest, shadowSuffix)
	n := digits(rest)
	if n == 0 || !strings.HasPrefix(rest[n:], "_") {
		return "", "", false
	}
	unit := rest[n+1:]
	if !a.Windowed() {
		var ok bool
		if unit, ok = strings.CutSuffix(unit, a.String()); !ok {
			return "", "", false
		}
		if unit, ok = strings.CutSuffix(unit, "_"); !ok {
			return "", "", false
		}
	}
	if !slices.Contains(unitNames[:], unit) {
		return "", "", false
	}
	return shared, limit, true
}

// shadowSuffix ends the key of a shadow limit of a list (see CacheKey).
const shadowSuffix = "_shadow"

// digits is the length of the run of ASCII digits s starts with.
func digits(s string) int {
	n := 0
	for n < len(s) && '0' <= s[n] && s[n] <= '9' {
		n++
	}
	return n
}

// unitNames are the units' lower-case names in list keys, by rules.Unit;
// "second" for Unknown, which is keyed as a second.
var unitNames = [...]string{"second", "second", "minute", "hour", "day", "month", "year", "week"}

func unitIndex(u rules.Unit) int {
	if u < 0 || int(u) >= len(unitNames) {
		return 0
	}
	return int(u)
}

// WindowStart is the start, in Unix seconds, of the fixed window of
// windowSeconds that holds now: now.Unix() / windowSeconds * windowSeconds,
// with Go's truncating division exactly as envoyproxy/ratelimit computes it.
// A windowSeconds below 1 counts as 1.
func WindowStart(now time.Time, windowSeconds int64) int64 {
	if windowSeconds < 1 {
		windowSeconds = 1
	}
	t := now.Unix()
	return t / windowSeconds * windowSeconds
}

// windowSeconds is l's window in seconds: unit × unit_multiplier, at least 1.
// The product cannot overflow: a year times the largest uint32 multiplier is
// about 1.4e17 seconds.
func windowSeconds(l *rules.Limit) int64 {
	m := int64(l.UnitMultiplier)
	if m < 1 {
		m = 1
	}
	w := l.Unit.Seconds() * m
	if w < 1 {
		return 1
	}
	return w
}

// windowDuration converts window seconds to a Duration, saturating at the
// largest Duration (about 292 years) instead of overflowing.
func windowDuration(seconds int64) time.Duration {
	if seconds > math.MaxInt64/int64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(seconds) * time.Second
}
