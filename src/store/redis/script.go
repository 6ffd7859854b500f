package redis

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// decideLua applies ops to their keys atomically. It mirrors, line for line,
// the pure functions of src/limiter/algorithm.go (FixedWindow, SlidingWindow,
// SlidingLog, TokenBucket): same integer arithmetic, same roundings, times in
// Unix microseconds. Lua numbers are doubles, exact below 2^53; every value
// stays below that for limits up to 2^32 and windows up to a century, and
// divisions go through idiv, which corrects the rounding of a / b. Two
// values can pass 2^53, and are clamped below 2^63 (see MAXN): the count of
// a fixed-window key that plain INCRBY took there, and the TAT of a token
// bucket whose Burst × window / limit spans more than 285 years; they are
// then exact to 53 bits only (so such a bucket's tokens in use may be one
// off), and never wrap.
//
// KEYS[i] is the key of op i. ARGV[1] is the time in µs, or "" for Redis
// TIME (production: one clock for the whole fleet); ARGV[2] is "1" when no
// op may be recorded unless every op is allowed (used for single ops too: an
// op is recorded only if it is allowed, except fixed windows without "1",
// which count every hit as the anchor does). After that "1", ARGV[2] may
// hold one character per op, 's' for a shadow op (limiter.Op.Shadow): it
// is all-or-nothing alone, recorded when it is itself allowed, whatever
// the others are, and its refusal refuses nothing else. Then six ARGV per op:
// algorithm (0 fixed_window, 1 sliding_window, 2 sliding_log,
// 3 token_bucket), limit, capacity (op.Capacity()), window in µs, hits, and
// the TTL in seconds of a fixed-window key (window + jitter). Negative
// hits are a refund of -hits (limiter.Op.Refund), which refund mirrors;
// the store never sends one in an all-or-nothing call.
//
// The reply is {recorded, then per op: allowed, before, after, remaining,
// reset_us, undo1, undo2}; undoLua takes the undo values to take a recorded
// op back (see Store.compensate); a refund's undo1 is what it gave back.
// When nothing was recorded because an op was refused, allowed, before and
// after are those of the evaluation in order (a key given twice
// sees the first op) and remaining and reset those of the unchanged state,
// as the memory store reports them. A fixed window's reset is left to the
// caller: its window is in the key, on the instance's clock.
//
// State per key: fixed_window an integer string (INCRBY, anchor-compatible);
// the others one string of little-endian 64-bit integers (Redis's
// struct.pack "<i8"), at keys ending in stateSuffix: sliding_window start,
// prev and curr (24 bytes); sliding_log the hit times, oldest first, at
// most limit of them (8 bytes each); token_bucket the TAT (8 bytes). One
// GET and one SET per key, whatever the algorithm. A value of another
// length is refused as data (limiter.ErrData), never misread. Every key
// expires when its state would be the zero state again (IdleAt).
//
// decideLua serves batches: AllOrNothing, a group's limits, and the lean
// scripts' fallback; a single op uses the lean script of its algorithm.
const decideLua = luaPrelude + decideMain

// luaPrelude holds what decideLua and undoLua share: the time, integer
// division, the state views and decide, the mirror of the pure functions.
const luaPrelude = `
if redis.replicate_commands then redis.replicate_commands() end
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- floor(a / b) for integers, exact: a / b is rounded, so correct it.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end
local function str(x) return string.format('%.0f', x) end
-- MAXN is the largest double below 2^63. Redis turns a reply number of
-- 2^63 or more into -2^63, so counts and times are clamped to it: a fixed
-- window's count recorded near 2^63-1 by INCRBY (beyond doubles' exact
-- 2^53, so reported to 53 bits), a token bucket's TAT far in the future.
local MAXN = 9223372036854774784
local function ttlms(us)
  local ms = cdiv(us, 1000)
  if ms < 1 then ms = 1 end
  return str(ms)
end

-- State views, loaded once per key: a key given twice sees the first op's effect.
-- The continuous algorithms keep packed little-endian 64-bit integers (see
-- decideLua's comment in script.go); a value of another length was not written by
-- this version and is refused as data, never misread.
local function unpackState(v, size)
  if #v ~= size then error('not a state of this algorithm') end
  return struct.unpack(string.rep('<i8', size / 8), v)
end
local function load(alg, key)
  if alg == 0 then
    return {count = tonumber(redis.call('GET', key) or '0')}
  elseif alg == 1 then
    local v = redis.call('GET', key)
    if v then
      local a, b, c = unpackState(v, 24)
      return {start = a, prev = b, curr = c}
    end
    return {start = 0, prev = 0, curr = 0}
  elseif alg == 2 then
    -- v: the packed log in Redis, len entries; popped: entries dropped
    -- from its head; npush entries of time tpush pushed by this call.
    -- Every entry pushed in one call has the same time (see decide), so a
    -- count is enough.
    local v = redis.call('GET', key) or ''
    if #v % 8 ~= 0 then error('not a sliding_log state') end
    -- cut: entries a refund took off the end of v.
    return {v = v, len = #v / 8, popped = 0, npush = 0, cut = 0}
  end
  local v = redis.call('GET', key)
  if v then return {tat = unpackState(v, 8)} end
  return {tat = 0}
end

local function logN(s) return s.len - s.cut - s.popped + s.npush end
local function logAt(s, i)
  local j = s.popped + i
  if j < s.len - s.cut then return (struct.unpack('<i8', s.v, 8 * j + 1)) end
  return s.tpush
end

-- weigh: ceil(prev * ceil(rem * 1e6 / w) / 1e6). Windows are whole seconds,
-- so rem * 1e6 / w is rem / (w / 1e6), exact in doubles for any window.
local function mulw(x, w) -- floor(x * w / 1e6)
  if w % 1000000 == 0 then return x * (w / 1000000) end
  return idiv(x * w, 1000000)
end
local function weigh(prev, rem, w)
  if prev == 0 then return 0 end
  local wt
  if w % 1000000 == 0 then wt = cdiv(rem, w / 1000000) else wt = cdiv(rem * 1000000, w) end
  return cdiv(prev * wt, 1000000)
end

-- decide applies one op to state s and returns allowed, before, after,
-- remaining, reset, and two values that let undo take the op back: the
-- sliding window's start, the sliding log's time, the bucket's TAT before
-- and after.
local function decide(alg, s, limit, cap, w, hits)
  local t = now
  if alg == 0 then
    local before = math.min(s.count, MAXN)
    s.count = math.min(before + hits, MAXN)
    local allowed = s.count <= limit
    local remaining = 0
    if allowed then remaining = limit - s.count end
    return allowed, before, s.count, remaining, 0, 0, 0
  elseif alg == 1 then
    local start = idiv(t, w) * w
    if start <= s.start then
    elseif start - w == s.start then
      s.start, s.prev, s.curr = start, s.curr, 0
    else
      s.start, s.prev, s.curr = start, 0, 0
    end
    if t < s.start then t = s.start end
    local rem = s.start + w - t
    local used = s.curr + weigh(s.prev, rem, w)
    local before, after = used, used + hits
    local allowed = false
    if after <= limit then
      allowed = true
      s.curr = s.curr + hits
      used = after
    end
    local remaining = 0
    if used < limit then remaining = limit - used end
    local reset
    if limit == 0 then
      reset = w
    elseif s.curr < limit then
      if s.prev == 0 then
        reset = 0
      else
        local rmax = mulw(idiv((limit - 1 - s.curr) * 1000000, s.prev), w)
        if rmax >= rem then reset = 0 else reset = rem - rmax end
      end
    else
      local rmax = mulw(idiv((limit - 1) * 1000000, s.curr), w)
      reset = rem + w - rmax
    end
    return allowed, before, after, remaining, reset, s.start, 0
  elseif alg == 2 then
    local n = logN(s)
    if n > 0 then
      local last = logAt(s, n - 1)
      t = math.max(t, last)
      -- Drop the expired entries, a prefix of the sorted log: a binary
      -- search finds how many in log2(n) + 2 reads, and commit cuts them
      -- off the string.
      if last <= t - w then
        s.popped = s.popped + n
        n = 0
      elseif logAt(s, 0) <= t - w then
        -- logAt(lo - 1) has expired and logAt(hi) has not: the number
        -- expired is in [lo, hi].
        local lo, hi = 1, n - 1
        while lo < hi do
          local mid = idiv(lo + hi, 2)
          if logAt(s, mid) <= t - w then lo = mid + 1 else hi = mid end
        end
        s.popped = s.popped + lo
        n = n - lo
      end
    end
    local before, after = n, n + hits
    local used = n
    local allowed = false
    if after <= limit then
      allowed = true
      -- t is the same for every op of this call on this key: it is at
      -- least the newest entry, which an earlier push made t.
      s.npush, s.tpush = s.npush + hits, t
      used = after
    end
    local remaining = 0
    if used < limit then remaining = limit - used end
    local reset = 0
    if limit == 0 then
      reset = w
    elseif logN(s) > 0 then
      reset = logAt(s, 0) + w - t
    end
    s.newest = t
    return allowed, before, after, remaining, reset, t, 0
  end
  if cap == 0 then
    return hits == 0, 0, hits, 0, 0, 0, 0
  end
  local T = cdiv(w, limit)
  local x = 0
  if s.tat > t then x = s.tat - t end
  local used = cdiv(x, T)
  local before, after = used, used + hits
  local allowed, tat0 = false, s.tat
  if after <= cap then
    allowed = true
    -- TokenBucket saturates the TAT at 2^63-1 µs; here at MAXN. Both give
    -- the same ResetAfter: beyond 2^63 ns a Duration saturates.
    s.tat = math.min(t + x + hits * T, MAXN)
    x = s.tat - t
    used = after
  end
  local remaining = 0
  if used < cap then remaining = cap - used end
  return allowed, before, after, remaining, x, tat0, s.tat
end

`

const decideMain = `
-- refund gives back up to h hits of state s, newest first and never below
-- the zero state, and returns what decide returns for a read of the state
-- after it, allowed, with the hits it gave back as undo1. It mirrors the
-- refund branches of the pure functions (limiter.Op.Refund). s.gave
-- marks a state a refund changed, for commit.
local function refund(alg, s, limit, cap, w, h)
  local given = 0
  if alg == 0 then
    local c = math.min(s.count, MAXN)
    given = math.min(c, h)
    s.count = c - given
  elseif alg == 1 then
    decide(1, s, limit, cap, w, 0) -- rolls s to the current window
    local k = math.min(s.curr, h)
    local k2 = math.min(s.prev, h - k)
    s.curr, s.prev = s.curr - k, s.prev - k2
    given = k + k2
  elseif alg == 2 then
    decide(2, s, limit, cap, w, 0) -- drops the entries that left the window
    given = math.min(logN(s), h)
    -- The newest: those pushed in this call, then the end of v.
    local k = math.min(s.npush, given)
    s.npush, s.cut = s.npush - k, s.cut + given - k
  elseif cap > 0 and s.tat > now then
    given = math.min(s.tat - now, h * cdiv(w, limit))
    s.tat = s.tat - given
  end
  if given > 0 then s.gave = true end
  local _, before, after, remaining, reset = decide(alg, s, limit, cap, w, 0)
  return true, before, after, remaining, reset, given, 0
end

local aon = string.sub(ARGV[2], 1, 1) == '1'
-- alone(i): op i is a shadow op of an all-or-nothing call (see decideLua).
local function alone(i) return aon and string.byte(ARGV[2], i + 1) == 115 end
-- commit writes the final state of a continuous algorithm's key.
local function commit(alg, key, s, w)
  if alg == 1 then
    redis.call('SET', key, struct.pack('<i8<i8<i8', s.start, s.prev, s.curr), 'PX', ttlms(s.start + 2 * w - now))
  elseif alg == 2 then
    -- Keep the entries not popped nor cut, then the k pushed ones still
    -- in the log.
    local keep, k, stored = '', s.npush, s.len - s.cut
    if s.popped < stored then
      keep = string.sub(s.v, 8 * s.popped + 1, 8 * stored)
    else
      k = k - (s.popped - stored)
    end
    if k > 0 then
      redis.call('SET', key, keep .. string.rep(struct.pack('<i8', s.tpush), k), 'PX', ttlms(s.newest + w - now))
    elseif #keep > 0 then
      redis.call('SET', key, keep, 'KEEPTTL')
    elseif s.len > 0 then
      redis.call('DEL', key)
    end
  elseif alg == 3 then
    redis.call('SET', key, struct.pack('<i8', s.tat), 'PX', ttlms(s.tat - now))
  end
end

local n = #KEYS
local function arg(i, f) return tonumber(ARGV[2 + (i - 1) * 6 + f]) end

local states, out = {}, {}
local refused = false
for i = 1, n do
  local alg, key = arg(i, 1), KEYS[i]
  local s = states[key]
  if not s then s = load(alg, key); states[key] = s end
  local allowed, before, after, remaining, reset, u1, u2
  if arg(i, 5) < 0 then
    allowed, before, after, remaining, reset, u1, u2 = refund(alg, s, arg(i, 2), arg(i, 3), arg(i, 4), -arg(i, 5))
  else
    allowed, before, after, remaining, reset, u1, u2 = decide(alg, s, arg(i, 2), arg(i, 3), arg(i, 4), arg(i, 5))
  end
  if not allowed then
    if alone(i) then
      -- Not recorded, and seen so by a later op on its key; remaining
      -- is that of the unchanged state (continuous algorithms leave a
      -- refused op's state as it was).
      if alg == 0 then
        s.count = before
        remaining = 0
        if before < arg(i, 2) then remaining = arg(i, 2) - before end
      end
    else
      refused = true
    end
  end
  out[i] = {allowed, before, after, remaining, reset, u1, u2}
end

local reply = {}
-- record writes op i's hits, and puts its reply.
local done = {}
local function record(i)
  local alg, key, hits = arg(i, 1), KEYS[i], arg(i, 5)
  local o = out[i]
  if alg == 0 then
    if hits > 0 and (o[1] or not alone(i)) then
      -- Past 2^63-1 INCRBY fails and the count stays where it is, within
      -- hits of the top of its range and over any limit: the count
      -- saturates, which is not an error. (AllOrNothing records only
      -- admitted hits, so this needs a count written by plain INCRBY.)
      local r = redis.pcall('INCRBY', key, str(hits))
      if type(r) == 'table' and r.err and not string.find(r.err, 'overflow', 1, true) then return r end
      redis.call('EXPIRE', key, ARGV[2 + (i - 1) * 6 + 6])
    elseif hits < 0 and o[6] > 0 then
      -- A refund: DECRBY keeps the key's TTL, and a key never hit gave
      -- nothing back, so none is made.
      redis.call('DECRBY', key, str(o[6]))
    end
  elseif (o[1] and hits > 0 or hits < 0 and states[key].gave) and not done[key] then
    done[key] = true
    commit(alg, key, states[key], arg(i, 4))
  end
  local allowed = 0
  if o[1] then allowed = 1 end
  local p = 2 + (i - 1) * 7
  reply[p], reply[p + 1], reply[p + 2], reply[p + 3], reply[p + 4] = allowed, o[2], o[3], o[4], o[5]
  reply[p + 5], reply[p + 6] = o[6], o[7]
end

if refused and aon then
  -- Record nothing but the shadow ops' own. allowed, before and after
  -- stay those of the evaluation in order; remaining and reset become
  -- those of the unchanged state. (A shadow op's key is never another
  -- op's: see limiter.Op.Shadow.)
  local evaluated = states
  states = {}
  reply[1] = 0
  for i = 1, n do
    if not alone(i) then
      local alg, key = arg(i, 1), KEYS[i]
      local s = states[key]
      if not s then s = load(alg, key); states[key] = s end
      local _, _, _, remaining, reset = decide(alg, s, arg(i, 2), arg(i, 3), arg(i, 4), 0)
      local o, allowed = out[i], 0
      if o[1] then allowed = 1 end
      local p = 2 + (i - 1) * 7
      reply[p], reply[p + 1], reply[p + 2], reply[p + 3], reply[p + 4] = allowed, o[2], o[3], remaining, reset
      reply[p + 5], reply[p + 6] = 0, 0
    end
  end
  states = evaluated
  for i = 1, n do
    if alone(i) then
      local err = record(i)
      if err then return err end
    end
  end
  return reply
end

-- Record: fixed windows count every op's hits; continuous keys get their final state.
reply[1] = 1
for i = 1, n do
  local err = record(i)
  if err then return err end
end
return reply
`

// undoLua takes back recorded ops; see its comment.
const undoLua = luaPrelude + `
-- undo takes back the ops of an earlier decide call that recorded them,
-- newest first, and replies with the state's remaining and reset per op.
-- It mirrors the TakeBack functions of src/limiter/takeback.go, which
-- state the rules (only the op's own hits leave, never below zero).
-- KEYS as for decide; ARGV[1] the time; then seven ARGV per op: algorithm,
-- limit, capacity, window µs, hits, and the two undo values decide gave.
local n = #KEYS
local function arg(i, f) return tonumber(ARGV[1 + (i - 1) * 7 + f]) end
for i = n, 1, -1 do
  local alg, key, w, hits, u1, u2 = arg(i, 1), KEYS[i], arg(i, 4), arg(i, 5), arg(i, 6), arg(i, 7)
  if hits > 0 then
    if alg == 0 then
      local c = tonumber(redis.call('GET', key) or '0')
      if c > 0 then redis.call('DECRBY', key, str(math.min(c, hits))) end
    elseif alg == 1 then
      -- limiter.SlidingWindowState.TakeBack
      local s = load(1, key)
      if s.start == u1 then
        s.curr = math.max(s.curr - hits, 0)
      elseif s.start == u1 + w then
        s.prev = math.max(s.prev - hits, 0)
      end
      if s.start == u1 or s.start == u1 + w then
        redis.call('SET', key, struct.pack('<i8<i8<i8', s.start, s.prev, s.curr), 'KEEPTTL')
      end
    elseif alg == 2 then
      -- limiter.SlidingLogState.TakeBack: drop up to hits entries logged
      -- at u1, newest first. The log is sorted, so they are one run,
      -- followed by the entries logged since at later times.
      local s = load(2, key)
      local hi = s.len
      while hi > 0 and logAt(s, hi - 1) > u1 do hi = hi - 1 end
      local lo = hi
      while lo > 0 and hi - lo < hits and logAt(s, lo - 1) == u1 do lo = lo - 1 end
      if lo < hi then
        local v = string.sub(s.v, 1, 8 * lo) .. string.sub(s.v, 8 * hi + 1)
        if #v > 0 then redis.call('SET', key, v, 'KEEPTTL') else redis.call('DEL', key) end
      end
    else
      -- limiter.TokenBucketState.TakeBack: exact when no op came since
      -- ours; else take back our tokens only.
      local v = redis.call('GET', key)
      if v then
        local tat = unpackState(v, 8)
        if tat == u2 then tat = u1 else tat = tat - hits * cdiv(w, arg(i, 2)) end
        redis.call('SET', key, struct.pack('<i8', tat), 'KEEPTTL')
      end
    end
  end
end
local reply = {}
for i = 1, n do
  local alg = arg(i, 1)
  local _, _, _, remaining, reset = decide(alg, load(alg, KEYS[i]), arg(i, 2), arg(i, 3), arg(i, 4), 0)
  reply[2 * i - 1], reply[2 * i] = remaining, reset
end
return reply
`

// The lean scripts decide one op of one algorithm that is neither part of
// an AllOrNothing batch nor of a group: the common case, which a deployment
// pays for per decision. Each is decide's branch for its algorithm, inlined
// with the state's load and commit: no dispatch, no tables but the reply,
// four ARGV. A script call costs Redis a fixed overhead of about the price
// of an INCRBY before its first instruction, so what the scripts can save
// is in their own work (see docs/BENCHMARKS.md, "Lua algorithms, round
// two").
//
// KEYS[1] is the key (stateKey); ARGV[1] the time in µs, or "" for Redis
// TIME; ARGV[2..4] the limit (token_bucket: the capacity), the window in µs
// (token_bucket: the refill interval T) and the hits. The reply is
// {allowed, before, after, remaining, reset_us}, as decideLua's per op.
// Divisions use math.floor and math.ceil directly where the dividend stays
// below 2^53, where a double's quotient rounds to the right integer.
const leanHead = `
local now
if ARGV[1] == '' then
  local tm = redis.call('TIME')
  if redis.replicate_commands then redis.replicate_commands() end
  now = tm[1] * 1000000 + tm[2]
else
  now = tonumber(ARGV[1])
end
local key, limit, w, hits = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
`

// leanSlidingWindowLua is decide's sliding_window branch for one op.
const leanSlidingWindowLua = leanHead + `
local start, prev, curr = 0, 0, 0
local v = redis.call('GET', key)
if v then
  if #v ~= 24 then error('not a sliding_window state') end
  start, prev, curr = struct.unpack('<i8<i8<i8', v)
end
local t = now
local s0 = math.floor(t / w) * w
if s0 <= start then
elseif s0 - w == start then
  start, prev, curr = s0, curr, 0
else
  start, prev, curr = s0, 0, 0
end
if t < start then t = start end
local rem = start + w - t
local whole = w % 1000000 == 0
local used = curr
if prev > 0 then
  local wt
  if whole then wt = math.ceil(rem / (w / 1000000)) else wt = math.ceil(rem * 1000000 / w) end
  used = curr + math.ceil(prev * wt / 1000000)
end
local before, after, allowed = used, used + hits, 0
if after <= limit then
  allowed, used, curr = 1, after, curr + hits
  if hits > 0 then
    local ms = math.ceil((start + 2 * w - now) / 1000)
    if ms < 1 then ms = 1 end
    redis.call('SET', key, struct.pack('<i8<i8<i8', start, prev, curr), 'PX', string.format('%.0f', ms))
  end
end
local remaining = 0
if used < limit then remaining = limit - used end
local reset, k, n = 0, nil, nil
if limit == 0 then
  reset = w
elseif curr < limit then
  if prev > 0 then k, n = limit - 1 - curr, prev end
else
  k, n = limit - 1, curr
end
if k then
  -- rmax = floor(floor(k * 1e6 / n) * w / 1e6), as decide's mulw
  local rmax = math.floor(k * 1000000 / n)
  if whole then
    rmax = rmax * (w / 1000000)
  else
    local p = rmax * w
    rmax = math.floor(p / 1000000)
    local r = p - rmax * 1000000
    if r < 0 then rmax = rmax - 1 elseif r >= 1000000 then rmax = rmax + 1 end
  end
  if curr >= limit then
    reset = rem + w - rmax
  elseif rmax < rem then
    reset = rem - rmax
  end
end
return {allowed, before, after, remaining, reset}
`

// leanSlidingLogLua is decide's sliding_log branch for one op. The log is
// one string of packed times, oldest first, at most limit of them: the
// expired ones are found by a binary search and cut off when the op is
// recorded, which rewrites the string (at most 8 × rules.MaxSlidingLog
// bytes).
const leanSlidingLogLua = leanHead + `
local v = redis.call('GET', key) or ''
local len = #v
if len % 8 ~= 0 then error('not a sliding_log state') end
local n, drop, t = len / 8, 0, now
if n > 0 then
  local last = struct.unpack('<i8', v, len - 7)
  if last > t then t = last end
  local cut = t - w
  if last <= cut then
    drop = n
  elseif struct.unpack('<i8', v) <= cut then
    local lo, hi = 1, n - 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if struct.unpack('<i8', v, 8 * mid + 1) <= cut then lo = mid + 1 else hi = mid end
    end
    drop = lo
  end
  n = n - drop
end
local before, after, allowed, used = n, n + hits, 0, n
if after <= limit then
  allowed, used = 1, after
  if hits > 0 then
    local ms = math.ceil((t + w - now) / 1000)
    redis.call('SET', key, string.sub(v, 8 * drop + 1) .. string.rep(struct.pack('<i8', t), hits), 'PX', string.format('%.0f', ms))
  end
end
local remaining, reset = 0, 0
if used < limit then remaining = limit - used end
if limit == 0 then
  reset = w
elseif n > 0 then
  reset = struct.unpack('<i8', v, 8 * drop + 1) + w - t
elseif used > 0 then
  reset = w
end
return {allowed, before, after, remaining, reset}
`

// leanTokenBucketLua is decide's token_bucket branch for one op; limit is
// the capacity and w the refill interval T = ceil(window / limit).
const leanTokenBucketLua = leanHead + `
if limit == 0 then
  if hits == 0 then return {1, 0, 0, 0, 0} end
  return {0, 0, hits, 0, 0}
end
local tat = 0
local v = redis.call('GET', key)
if v then
  if #v ~= 8 then error('not a token_bucket state') end
  tat = struct.unpack('<i8', v)
end
local x = 0
if tat > now then x = tat - now end
-- used = ceil(x / w), exact: a far TAT puts x past 2^53.
local used = math.floor(x / w)
local r = x - used * w
if r < 0 then used = used - 1 elseif r >= w then used = used + 1 end
if used * w < x then used = used + 1 end
local before, after, allowed = used, used + hits, 0
if after <= limit then
  allowed, used = 1, after
  tat = math.min(now + x + hits * w, 9223372036854774784)
  x = tat - now
  if hits > 0 then
    local ms = math.ceil(x / 1000)
    if ms < 1 then ms = 1 end
    redis.call('SET', key, struct.pack('<i8', tat), 'PX', string.format('%.0f', ms))
  end
end
local remaining = 0
if used < limit then remaining = limit - used end
return {allowed, before, after, remaining, x}
`

// argsPerOp and resultsPerOp are the per-op widths of decideLua's ARGV and
// reply; undoArgsPerOp is undoLua's.
const (
	argsPerOp     = 6
	resultsPerOp  = 7
	undoArgsPerOp = 7
)

// The scripts' SHA1s, for EVALSHA.
var (
	decideSHA = scriptSHA(decideLua)
	undoSHA   = scriptSHA(undoLua)
)

// leanScripts are the lean scripts by algorithmIndex (none for fixed
// windows), leanSHAArgs their SHA1s as command arguments, boxed once.
var (
	leanScripts = [...]string{"", leanSlidingWindowLua, leanSlidingLogLua, leanTokenBucketLua}
	leanSHAArgs = func() (a [len(leanScripts)]any) {
		for i, src := range leanScripts {
			if src != "" {
				a[i] = scriptSHA(src)
			}
		}
		return a
	}()
)

// scriptSources maps every script's SHA1 to its source, for EVAL after
// NOSCRIPT.
var scriptSources = func() map[string]string {
	m := map[string]string{decideSHA: decideLua, undoSHA: undoLua,
		quotaSyncSHA: quotaSyncLua, quotaCommitSHA: quotaCommitLua, quotaStartedSHA: quotaStartedLua,
		quotaBeatSHA: quotaBeatLua}
	for _, src := range leanScripts {
		if src != "" {
			m[scriptSHA(src)] = src
		}
	}
	return m
}()

func scriptSHA(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// scriptSource returns the script whose SHA1 is sha, for EVAL after NOSCRIPT.
func scriptSource(sha string) string {
	if src, ok := scriptSources[sha]; ok {
		return src
	}
	return decideLua
}

// stateSuffix ends the Redis key of every algorithm but fixed_window: it
// names the layout of the state (packed integers, see decideLua), so that
// an instance of this version never reads a key an older one wrote in
// another layout ("start:prev:curr", a list of times, a decimal TAT) and
// the other way round. A rolling upgrade from such a version counts these
// algorithms apart for one window (docs/STORES.md, Redis). Fixed-window
// keys are envoyproxy/ratelimit's and never change.
const stateSuffix = ":v2"

// stateKey is the Redis key of op's state: op.Key, plus stateSuffix for
// the continuous algorithms. It is a fresh string (the limiter reuses the
// op's key memory after Do returns).
func stateKey(op *limiter.Op) string {
	if op.Algorithm == rules.FixedWindow {
		return strings.Clone(op.Key)
	}
	return op.Key + stateSuffix
}

// decideSHAArg is decideSHA as a command argument, boxed once.
var decideSHAArg any = decideSHA

// algorithmCodes are the numbers decideLua uses for the algorithms, by
// algorithmIndex; algorithmArgs the same as command arguments, boxed once.
var (
	algorithmCodes = [...]string{"0", "1", "2", "3"}
	algorithmArgs  = [...]any{"0", "1", "2", "3"}
)

// algorithmIndex is a's number in decideLua: 0 fixed_window,
// 1 sliding_window, 2 sliding_log, 3 token_bucket.
func algorithmIndex(a rules.Algorithm) int {
	switch a {
	case rules.SlidingWindow:
		return 1
	case rules.SlidingLog:
		return 2
	case rules.TokenBucket:
		return 3
	}
	return 0
}

// countArgs are small counts as command arguments, boxed once.
var countArgs = func() (a [64]any) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// countArg is n as a command argument.
func countArg(n int) any {
	if n < len(countArgs) {
		return countArgs[n]
	}
	return strconv.Itoa(n)
}

// appendOpArgs appends the six ARGV of op for decideLua.
func appendOpArgs(args []any, op *limiter.Op, ttlSeconds int64) []any {
	return append(args,
		algorithmCodes[algorithmIndex(op.Algorithm)],
		strconv.FormatUint(op.Limit, 10),
		strconv.FormatUint(op.Capacity(), 10),
		strconv.FormatInt(windowMicros(op.Window), 10),
		strconv.FormatUint(op.Hits, 10),
		strconv.FormatInt(ttlSeconds, 10),
	)
}

// windowMicros is the window in whole microseconds, at least 1, as the
// limiter's pure functions count it.
func windowMicros(w time.Duration) int64 {
	if m := int64(w / time.Microsecond); m > 0 {
		return m
	}
	return 1
}
