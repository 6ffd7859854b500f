package limiter

import (
	"math"
	"strconv"
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
// A limit with an unknown unit is keyed as a one-second window; the rules
// package never builds one.
func CacheKey(dst []byte, prefix, domain string, entries []rules.Entry, l *rules.Limit, now time.Time) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, domain...)
	dst = append(dst, '_')
	for _, e := range entries {
		dst = append(dst, e.Key...)
		dst = append(dst, '_')
		dst = append(dst, e.Value...)
		dst = append(dst, '_')
	}
	w := windowSeconds(l)
	if l.Algorithm == rules.FixedWindow {
		return strconv.AppendInt(dst, WindowStart(now, w), 10)
	}
	dst = strconv.AppendInt(dst, w, 10)
	dst = append(dst, '_')
	return append(dst, l.Algorithm.String()...)
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
