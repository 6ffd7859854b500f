package redis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimit/src/quota"
)

// The Rate Limit Quota Service's pools, shared by the replicas of the
// service through Redis (docs/RLQS.md, "Several replicas"). Each pool has
// four keys that share a hash slot (Cluster-safe), named by a hash of the
// pool's name so that a bucket id of any length makes a short key:
//
//	ratelimit_rlqs_{h}:l  hash: the lease (owner, epoch, until)
//	ratelimit_rlqs_{h}:u  hash: the reports handed over, by subscriber
//	ratelimit_rlqs_{h}:g  hash: the grants, by subscriber
//	ratelimit_rlqs_{h}:s  string: the pool's state
//
// Every key expires Keep after the last write, so a pool nobody uses any
// more goes away by itself. Times are the replicas' clocks, given with
// each call, not Redis's: a lease is a value compared with the caller's
// time, which replicas keep in step (NTP), and a simulator can run them
// on a fake clock.

// quotaSyncLua is a replica's exchange of one tick for one pool (see
// quota.SyncRequest). KEYS: lease, reports, grants, state. ARGV: replica,
// now and lease and keep (ms), 1 to ask for the state, a replica seen dead
// (or ""), the number of pushes and (subscriber, merged, alone) for each,
// the number of grants wanted and their subscribers. It returns {1,
// fresh, epoch, merged, reports, state, grants} to the owner
// and {0, 0, epoch, merged, grants, owner} to another replica.
const quotaSyncLua = `
local me, now, lease, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local dead = ARGV[6]
local np = tonumber(ARGV[7])
local merged = {}
local i = 8
for k = 1, np do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    merged[k] = 1
  else
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
    merged[k] = 0
  end
  i = i + 3
end
if np > 0 then redis.call('PEXPIRE', KEYS[2], keep) end
local nw = tonumber(ARGV[i])
i = i + 1
local l = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'until')
local epoch = tonumber(l[2]) or 0
if l[1] == me or not l[1] or (tonumber(l[3]) or 0) <= now or (dead ~= '' and l[1] == dead) then
  local fresh = l[1] ~= me
  if fresh then epoch = epoch + 1 end
  redis.call('HSET', KEYS[1], 'owner', me, 'epoch', epoch, 'until', now + lease)
  redis.call('PEXPIRE', KEYS[1], keep)
  local reports = redis.call('HGETALL', KEYS[2])
  redis.call('DEL', KEYS[2])
  local state, grants = false, {}
  if fresh or ARGV[5] == '1' then
    state = redis.call('GET', KEYS[4])
    grants = redis.call('HGETALL', KEYS[3])
  end
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('PEXPIRE', KEYS[4], keep)
  return {1, fresh and 1 or 0, epoch, merged, reports, state, grants}
end
local grants = {}
for k = 1, nw do
  grants[k] = redis.call('HGET', KEYS[3], ARGV[i + k - 1])
end
return {0, 0, epoch, merged, grants, l[1]}
`

// quotaCommitLua is an owner's write of a pool (see quota.CommitRequest),
// only while the lease is still its own, which it renews. KEYS: lease,
// reports, grants, state. ARGV: replica, epoch, now and lease and keep
// (ms), state, the number of grants and (subscriber, grant) for each, the
// number of grants to drop and their subscribers. It returns 1, or 0 when
// the lease changed hands.
const quotaCommitLua = `
local l = redis.call('HMGET', KEYS[1], 'owner', 'epoch')
if l[1] ~= ARGV[1] or tonumber(l[2]) ~= tonumber(ARGV[2]) then return 0 end
local keep = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'until', tonumber(ARGV[3]) + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('SET', KEYS[4], ARGV[6], 'PX', keep)
local n = tonumber(ARGV[7])
local i = 8
for k = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local d = tonumber(ARGV[i])
i = i + 1
for k = 1, d do
  redis.call('HDEL', KEYS[3], ARGV[i])
  i = i + 1
end
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], keep) end
return 1
`

// quotaBeatLua is a replica's beat (see quota.Beat). KEYS: the replicas'
// sorted set (by the time of their last beat). ARGV: replica, now, alive
// and keep (ms), the most replicas to return. It returns the replicas
// that beat within alive.
const quotaBeatLua = `
local now = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[3]), '+inf', 'LIMIT', 0, tonumber(ARGV[5]))
`

// quotaStartedLua returns the time the shared pools started (ms), which it
// sets to ARGV[1] when there is none: after Redis lost its data, the
// first replica to ask starts them again.
const quotaStartedLua = `
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
`

var (
	quotaSyncSHA    = scriptSHA(quotaSyncLua)
	quotaCommitSHA  = scriptSHA(quotaCommitLua)
	quotaStartedSHA = scriptSHA(quotaStartedLua)
	quotaBeatSHA    = scriptSHA(quotaBeatLua)
)

// quotaKeys returns a pool's four keys.
func quotaKeys(pool string) []string {
	sum := sha256.Sum256([]byte(pool))
	base := "ratelimit_rlqs_{" + hex.EncodeToString(sum[:16]) + "}:"
	return []string{base + "l", base + "u", base + "g", base + "s"}
}

func millis(t time.Time) int64        { return t.UnixMilli() }
func durMillis(d time.Duration) int64 { return max(1, d.Milliseconds()) }

// SyncQuota makes each request's exchange with Redis (see
// quota.SyncRequest), all in one round trip (one per node of a Cluster).
// Each reply carries its own error: a pool whose script failed, or whose
// reply no correct Redis gives, fails alone.
func (s *Store) SyncQuota(ctx context.Context, reqs []quota.SyncRequest) []quota.SyncReply {
	cmds := make([]*goredis.Cmd, len(reqs))
	for i, r := range reqs {
		args := []any{r.Replica, millis(r.Now), durMillis(r.Lease), durMillis(r.Keep), boolArg(r.State), r.Dead, len(r.Push)}
		for _, p := range r.Push {
			args = append(args, p.Sub, p.Merged, p.Alone)
		}
		args = append(args, len(r.Want))
		for _, w := range r.Want {
			args = append(args, w)
		}
		cmds[i] = goredis.NewCmd(ctx, evalArgs(quotaSyncSHA, quotaKeys(r.Pool), args)...)
	}
	err := s.runQuota(ctx, cmds)
	out := make([]quota.SyncReply, len(reqs))
	for i, c := range cmds {
		if e := cmdErr(c, err); e != nil {
			out[i].Err = e
			continue
		}
		out[i] = syncReply(c.Val(), reqs[i])
	}
	return out
}

// CommitQuota makes each owner's write (see quota.CommitRequest), and
// leaves the notes, all in one round trip. Each write has its error:
// quota.ErrNotOwner when the lease changed hands (nothing was written),
// or the failure. A note that fails is lost: replicas read every pool
// now and then besides their notes.
func (s *Store) CommitQuota(ctx context.Context, reqs []quota.CommitRequest, notes []quota.Note) []error {
	cmds := make([]*goredis.Cmd, len(reqs), len(reqs)+2*len(notes))
	for i, r := range reqs {
		args := []any{r.Replica, r.Epoch, millis(r.Now), durMillis(r.Lease), durMillis(r.Keep), r.State, len(r.Grants)}
		for _, g := range r.Grants {
			args = append(args, g.Sub, g.Value)
		}
		args = append(args, len(r.Drop))
		for _, d := range r.Drop {
			args = append(args, d)
		}
		cmds[i] = goredis.NewCmd(ctx, evalArgs(quotaCommitSHA, quotaKeys(r.Pool), args)...)
	}
	cmds = appendNotes(ctx, cmds, notes)
	err := s.runQuota(ctx, cmds)
	out := make([]error, len(reqs))
	for i, c := range cmds[:len(reqs)] {
		if e := cmdErr(c, err); e != nil {
			out[i] = e
			continue
		}
		switch v, _ := c.Val().(int64); v {
		case 1:
		case 0:
			out[i] = quota.ErrNotOwner
		default:
			out[i] = badQuotaReply("commit: %v", c.Val())
		}
	}
	return out
}

// QuotaStarted returns when the shared pools of scope (the key prefix)
// started: the time the first replica asked, or, after Redis lost its
// data, the first to ask since. now is the caller's time, set when there
// is none.
func (s *Store) QuotaStarted(ctx context.Context, scope string, now time.Time) (time.Time, error) {
	sum := sha256.Sum256([]byte(scope))
	key := "ratelimit_rlqs_started_" + hex.EncodeToString(sum[:8])
	cmds := []*goredis.Cmd{goredis.NewCmd(ctx, evalArgs(quotaStartedSHA, []string{key}, []any{millis(now)})...)}
	err := s.runQuota(ctx, cmds)
	cmd := cmds[0] // runQuota replaces a command it sends again
	if e := cmdErr(cmd, err); e != nil {
		return time.Time{}, e
	}
	v, ok := cmd.Val().(string)
	ms, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil || ms <= 0 || len(v) > 15 {
		return time.Time{}, badQuotaReply("started: %q", v)
	}
	return time.UnixMilli(ms), nil
}

// appendNotes appends the commands that leave notes: one SADD (and its
// PEXPIRE) per mailbox.
func appendNotes(ctx context.Context, cmds []*goredis.Cmd, notes []quota.Note) []*goredis.Cmd {
	byBox := map[string][]any{}
	var boxes []string
	for _, n := range notes {
		k := quotaMailbox(n.Scope, n.Replica)
		if byBox[k] == nil {
			boxes = append(boxes, k)
			byBox[k] = []any{"sadd", k}
		}
		byBox[k] = append(byBox[k], n.Tag)
	}
	for _, k := range boxes {
		cmds = append(cmds, goredis.NewCmd(ctx, byBox[k]...), goredis.NewCmd(ctx, "pexpire", k, quotaNoteKeep.Milliseconds()))
	}
	return cmds
}

// quotaNoteKeep is how long a mailbox nobody reads is kept: its replica
// is gone.
const quotaNoteKeep = time.Minute

// quotaScope names the keys of a scope's replicas.
func quotaScope(scope string) string {
	sum := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(sum[:8])
}

// quotaMailbox is the key of a replica's notes: a set of pool tags.
func quotaMailbox(scope, replica string) string {
	return "ratelimit_rlqs_mail_" + quotaScope(scope) + "_" + replica
}

// BeatQuota records the replica's beat, reads which replicas beat
// lately, and takes the notes left for it (see quota.Beat), in one round
// trip (two commands: in a Cluster the two keys are in different slots).
func (s *Store) BeatQuota(ctx context.Context, b quota.Beat) (quota.BeatReply, error) {
	alive := "ratelimit_rlqs_alive_" + quotaScope(b.Scope)
	cmds := []*goredis.Cmd{goredis.NewCmd(ctx, "spop", quotaMailbox(b.Scope, b.Replica), b.Max)}
	if !b.NotesOnly {
		cmds = append(cmds, goredis.NewCmd(ctx, evalArgs(quotaBeatSHA, []string{alive}, []any{b.Replica, millis(b.Now), durMillis(b.Alive), durMillis(b.Keep), b.Max})...))
	}
	err := s.runQuota(ctx, cmds)
	var out quota.BeatReply
	for i, c := range cmds {
		if e := cmdErr(c, err); e != nil && !(i == 0 && errors.Is(c.Err(), goredis.Nil)) {
			return quota.BeatReply{}, e
		}
	}
	var ok bool
	if cmds[0].Err() == nil {
		if out.Tags, ok = stringList(cmds[0].Val(), b.Max); !ok {
			return quota.BeatReply{}, badQuotaReply("notes: %v", cmds[0].Val())
		}
	}
	if !b.NotesOnly {
		if out.Alive, ok = stringList(cmds[1].Val(), b.Max); !ok {
			return quota.BeatReply{}, badQuotaReply("beat: %v", cmds[1].Val())
		}
	}
	return out, nil
}

// stringList reads a list of at most max strings.
func stringList(v any, max int) ([]string, bool) {
	a, ok := v.([]any)
	if !ok || len(a) > max {
		return nil, false
	}
	out := make([]string, len(a))
	for i, e := range a {
		if out[i], ok = e.(string); !ok {
			return nil, false
		}
	}
	return out, true
}

func boolArg(b bool) int {
	if b {
		return 1
	}
	return 0
}

// evalArgs is EVALSHA of sha on keys with args.
func evalArgs(sha string, keys []string, args []any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", sha, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return append(a, args...)
}

// runQuota sends cmds in one pipeline, bounded by REDIS_TIMEOUT, and sends
// again, with EVAL, those Redis refused with NOSCRIPT (after a restart or
// a failover). Each command keeps its own error; the error returned is
// only that of a panic recovered (go-redis reading a reply it should not).
func (s *Store) runQuota(ctx context.Context, cmds []*goredis.Cmd) (err error) {
	defer recovered(&err)
	if len(cmds) == 0 {
		return nil
	}
	// The circuit breakers' hooks refuse the pipeline, unsent, while
	// Redis is known to fail.
	ctx, cancel := context.WithTimeout(ctx, s.main.timeout)
	defer cancel()
	pipe := s.main.client.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx)
	var again []*goredis.Cmd
	for i, c := range cmds {
		if !goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			continue
		}
		args := append([]any(nil), c.Args()...)
		sha, _ := args[1].(string)
		args[0], args[1] = "eval", scriptSource(sha)
		cmds[i] = goredis.NewCmd(ctx, args...)
		again = append(again, cmds[i])
	}
	if len(again) > 0 {
		pipe := s.main.client.Pipeline()
		for _, c := range again {
			_ = pipe.Process(ctx, c)
		}
		_, _ = pipe.Exec(ctx)
	}
	return nil
}

// cmdErr is c's error as the store reports it (see cmdError), or that of
// the panic runQuota recovered.
func cmdErr(c *goredis.Cmd, recovered error) error {
	if recovered != nil {
		return unavailable("redis", recovered)
	}
	if err := c.Err(); err != nil {
		// The first key: after the script and the key count of an
		// EVALSHA, else after the command's name.
		args, i := c.Args(), 1
		if n := c.Name(); n == "evalsha" || n == "eval" {
			i = 3
		}
		key, _ := args[min(i, len(args)-1)].(string)
		if isOOM(err) {
			return fmt.Errorf("%w: %w", quota.ErrStoreFull, cmdError("redis", key, err))
		}
		return cmdError("redis", key, err)
	}
	return nil
}

func badQuotaReply(format string, args ...any) error {
	return fmt.Errorf("redis: quota: %w: %s", errBadReply, fmt.Sprintf(format, args...))
}

// syncReply checks a sync script's reply, which is hostile until checked:
// its shape, and that it answers the request it was sent with.
func syncReply(v any, req quota.SyncRequest) (out quota.SyncReply) {
	fail := func(what string) quota.SyncReply {
		return quota.SyncReply{Err: badQuotaReply("sync: %s", what)}
	}
	a, ok := v.([]any)
	if !ok || (len(a) != 7 && len(a) != 6) {
		return fail("not a reply of 6 or 7 values")
	}
	owner, ok1 := zeroOne(a[0])
	fresh, ok2 := zeroOne(a[1])
	epoch, ok3 := a[2].(int64)
	if !ok1 || !ok2 || !ok3 || epoch < 0 || owner != (len(a) == 7) {
		return fail("bad lease")
	}
	out.Owner, out.Fresh, out.Epoch = owner, fresh, uint64(epoch)
	merged, ok := a[3].([]any)
	if !ok || len(merged) != len(req.Push) {
		return fail("not one answer per report handed over")
	}
	out.Merged = make([]bool, len(merged))
	for i, m := range merged {
		if out.Merged[i], ok = zeroOne(m); !ok {
			return fail("bad answer to a report handed over")
		}
	}
	if !owner {
		grants, ok := a[4].([]any)
		if !ok || len(grants) != len(req.Want) {
			return fail("not one grant per subscriber asked")
		}
		switch h := a[5].(type) {
		case nil:
		case string:
			out.Holder = h
		default:
			return fail("a lease holder that is not a string")
		}
		out.Grants = make([][]byte, len(grants))
		for i, g := range grants {
			switch g := g.(type) {
			case nil:
			case string:
				out.Grants[i] = []byte(g)
			default:
				return fail("a grant that is not a string")
			}
		}
		return out
	}
	if out.Reports, ok = fields(a[4]); !ok {
		return fail("reports not pairs of strings")
	}
	switch st := a[5].(type) {
	case nil:
	case string:
		out.State = []byte(st)
	default:
		return fail("a state that is not a string")
	}
	if out.Stored, ok = fields(a[6]); !ok {
		return fail("grants not pairs of strings")
	}
	return out
}

// fields reads a hash's fields and values, in pairs.
func fields(v any) ([]quota.Field, bool) {
	a, ok := v.([]any)
	if !ok || len(a)%2 != 0 {
		return nil, false
	}
	out := make([]quota.Field, 0, len(a)/2)
	for i := 0; i < len(a); i += 2 {
		k, ok1 := a[i].(string)
		v, ok2 := a[i+1].(string)
		if !ok1 || !ok2 {
			return nil, false
		}
		out = append(out, quota.Field{Sub: k, Value: []byte(v)})
	}
	return out, true
}

// zeroOne reads a 0 or 1.
func zeroOne(v any) (bool, bool) {
	n, ok := v.(int64)
	return n == 1, ok && (n == 0 || n == 1)
}
