package memcached

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// A descriptor's list of limits (rate_limits, the ops of one
// limiter.Op.Group) keeps every limit's state in one item, so that one
// update (gets, then cas) applies them all: concurrent requests meet the
// limits in one order, so admission is exact, and an AllOrNothing batch
// records all of a list's hits or none in one step. The item's key is the
// part that the keys of the list's limits share (limiter.SplitListKey:
// prefix + "{" + domain + "_" + key + "_" + value ... + "}"), which no
// other key ends with, and its value
//
//	'L' version uvarint(n) n × [uvarint(len(id)) id varint(idle) uvarint(len(state)) state]
//
// holds n limits: id is the limit's part of its key (SplitListKey: the
// multiplier, the unit, and the algorithm when it is not a fixed window),
// idle when its state is the zero state again (Unix µs), and state the
// encoding of a continuous algorithm's state (encoding.go) or,
// for a fixed window,
//
//	'f' varint(start) uvarint(count) varint(previous start) uvarint(previous count)
//
// with the counts of the two latest windows, starts in Unix seconds: an op
// whose clock is a little behind another instance's still counts in its
// own window, as it would in the window's own key, instead of resetting
// the newer one's count (see fixedState).
//
// A limit a reload removed from the list stays in the item until it is
// idle. An item whose version this instance does not know, or that does
// not decode, fails its list's ops with ErrData, as any item the store
// cannot read.
const (
	listTag     = 'L'
	listVersion = 1
	tagFixed    = 'f'
	// maxListSlots bounds the limits an item holds: those of the list
	// (at most rules.MaxLimits), and those a reload removed, until they
	// are idle. When more are left, the ones that go idle first go.
	maxListSlots = 2 * rules.MaxLimits
	// maxSlotID bounds a limit's id: "4294967295_second_sliding_window"
	// is the longest the limiter makes.
	maxSlotID = 64
	// maxListBytes bounds an item's value below memcached's default item
	// size (1 MiB with the key and the item's header; its -I setting). A
	// list's own limits fit (at most rules.MaxLimits sliding logs of
	// rules.MaxSlidingLog hits, at most 10 bytes each); removed limits
	// are dropped to make room.
	maxListBytes = 1_000_000
)

// errListTooLarge is the cause of an item that would not fit in maxListBytes.
var errListTooLarge = errors.New("list state over the item size")

// listMode says how runList applies the ops of a list.
type listMode uint8

const (
	// listEach decides and records each op by its own algorithm, as
	// ops of different descriptors would be, but in one step.
	listEach listMode = iota
	// listAll records the list's hits only when every op is admitted
	// (an AllOrNothing batch); when one is refused, Remaining and
	// ResetAfter are those of the unchanged state.
	listAll
	// listRead reads: every op as with Hits 0, setting only Remaining
	// and ResetAfter (the second pass of a refused AllOrNothing batch).
	listRead
)

// listSlot is one limit's state in a list's item.
type listSlot struct {
	id    []byte
	idle  int64 // Unix µs
	state []byte
	// fresh is set for a state this update wrote: it is never dropped.
	fresh bool
}

// applyList applies ops, the ops of one list whose item's key is key (before
// itemKey), at now, and fills res. It returns the undo of the ops that
// recorded hits in mode listAll.
func (s *Store) applyList(ctx context.Context, key string, ops []limiter.Op, now time.Time, res []limiter.Result, mode listMode) (undo, error) {
	key = itemKey(key)
	var marks []undo
	if mode == listAll {
		marks = make([]undo, len(ops))
	}
	wrote, err := s.update(ctx, key, now, forRequest, func(it *cacheItem) ([]byte, int64, error) {
		var data []byte
		if it != nil {
			data = it.Value
		}
		clear(marks)
		return runList(ops, now, data, it != nil, mode, res, marks)
	})
	if err != nil || !wrote || marks == nil {
		return undo{}, err
	}
	return undo{op: &ops[0], key: key, now: now, list: marks}, nil
}

// undoList takes back the hits u.list recorded in a list's item: each op's
// by its inverse (see takeBack), in one update.
func (s *Store) undoList(ctx context.Context, u *undo) error {
	_, err := s.update(ctx, u.key, u.now, takingBack, func(it *cacheItem) ([]byte, int64, error) {
		if it == nil { // expired or evicted: nothing to take back
			return nil, 0, nil
		}
		return takeBackList(u, it.Value)
	})
	return err
}

// runList applies ops at now to the list state encoded in data (none when
// !found) with the limiter's pure functions, in mode, and fills res; marks,
// when not nil, gets each op's undo (op nil for one that recorded
// nothing). It returns the new encoding and when it goes idle (Unix µs), or
// a nil value when nothing changed.
func runList(ops []limiter.Op, now time.Time, data []byte, found bool, mode listMode, res []limiter.Result, marks []undo) (value []byte, idle int64, err error) {
	var buf [maxListSlots]listSlot
	slots := buf[:0]
	if found {
		if slots, err = parseList(data, slots); err != nil {
			return nil, 0, err
		}
	}
	// The new states, one after the other: most lists' fit at once. Each
	// op has a slot of its own (listKey), so an op's step does not depend
	// on another's: the steps are taken first, and written once it is
	// known which are recorded.
	scratch := make([]byte, 0, 128)
	var buf2 [rules.MaxLimits]listStep
	steps, scratch, refused, err := stepList(ops, now, slots, mode, res, buf2[:0], scratch)
	if err != nil || mode == listRead {
		return nil, 0, err
	}
	var unchanged [rules.MaxLimits]int
	slots, reread, changed := keepSteps(ops, steps, slots, mode, refused, res, marks, unchanged[:0])
	if len(reread) > 0 {
		// Recorded nothing: Remaining and ResetAfter are those of the
		// state as it is.
		if err := readList(ops, reread, now, data, found, res); err != nil {
			return nil, 0, err
		}
	}
	if !changed {
		return nil, 0, nil
	}
	return encodeList(slots, now, len(data)+len(scratch))
}

// listStep is the step of one op of a list, taken and not yet written.
type listStep struct {
	id    string
	j     int // the slot, or -1
	state []byte
	idle  int64
	u     undo
}

// stepList takes the step of each op on its slot's state, appending the
// new states to scratch, and sets res; with listRead it sets only
// Remaining and ResetAfter and returns no steps. refused says an op that
// is not a shadow one was refused.
func stepList(ops []limiter.Op, now time.Time, slots []listSlot, mode listMode, res []limiter.Result, steps []listStep, scratch []byte) (_ []listStep, _ []byte, refused bool, err error) {
	for i := range ops {
		op := ops[i]
		if mode == listRead {
			if op.Shadow {
				// The second pass of a refused AllOrNothing batch: a
				// shadow op is by itself, its results set (see keepSteps).
				continue
			}
			op.Hits = 0
		}
		_, id, ok := limiter.SplitListKey(op.Key, op.Algorithm)
		if !ok { // units checked every key
			return nil, nil, false, fmt.Errorf("key %q is not a list's", op.Key)
		}
		j := findSlot(slots, id)
		var state []byte
		if j >= 0 {
			state = slots[j].state
		}
		var r limiter.Result
		var grown []byte
		var stIdle int64
		var u undo
		if op.Algorithm.Continuous() {
			grown, stIdle, u, err = step(scratch, &op, now, state, j >= 0, &r)
		} else {
			grown, stIdle, u, err = fixedStep(scratch, &op, now, state, j >= 0, &r)
		}
		if err != nil {
			return nil, nil, false, fmt.Errorf("limit %s: %w", id, err)
		}
		if mode == listRead {
			res[i].Remaining, res[i].ResetAfter = r.Remaining, r.ResetAfter
			continue
		}
		res[i] = r
		refused = refused || !r.Allowed && !op.Shadow
		p := listStep{id: id, j: j, idle: stIdle, u: u}
		if grown != nil {
			p.state = grown[len(scratch):]
			scratch = grown
		}
		steps = append(steps, p)
	}
	return steps, scratch, refused, nil
}

// keepSteps writes into slots the steps that are recorded: each, or with
// listAll none but a shadow op's own unless none was refused; marks gets
// the undo of each recorded op that is not a shadow one. It returns the
// slots, the ops whose results must be read again (recorded nothing) in
// reread, and whether a slot changed.
func keepSteps(ops []limiter.Op, steps []listStep, slots []listSlot, mode listMode, refused bool, res []limiter.Result, marks []undo, reread []int) (_ []listSlot, _ []int, changed bool) {
	for i := range ops {
		p := &steps[i]
		if mode == listAll {
			// A shadow op is all-or-nothing by itself
			// (limiter.Op.Shadow); the others all together.
			if ops[i].Shadow && !res[i].Allowed || !ops[i].Shadow && refused {
				reread = append(reread, i)
				continue
			}
		}
		if p.state == nil {
			continue
		}
		j := p.j
		if j < 0 {
			slots = append(slots, listSlot{id: []byte(p.id)})
			j = len(slots) - 1
		}
		slots[j].state, slots[j].idle, slots[j].fresh = p.state, p.idle, true
		changed = true
		if marks != nil && !ops[i].Shadow {
			// A shadow op is never taken back with the batch.
			p.u.op = &ops[i]
			marks[i] = p.u
		}
	}
	return slots, reread, changed
}

// readList sets Remaining and ResetAfter of res[i] for each i of which to
// those of the list state encoded in data (none when !found), as a read
// of ops[i] with Hits 0 gives them.
func readList(ops []limiter.Op, which []int, now time.Time, data []byte, found bool, res []limiter.Result) error {
	var read [rules.MaxLimits]limiter.Op
	var out [rules.MaxLimits]limiter.Result
	for k, i := range which {
		read[k] = ops[i]
		read[k].Shadow = false // to be read (see runList)
	}
	if _, _, err := runList(read[:len(which)], now, data, found, listRead, out[:len(which)], nil); err != nil {
		return err
	}
	for k, i := range which {
		res[i].Remaining, res[i].ResetAfter = out[k].Remaining, out[k].ResetAfter
	}
	return nil
}

// takeBackList removes the hits of u.list from the list state encoded in
// data and returns the new encoding and when it goes idle, or a nil value
// when none of the hits is still there.
func takeBackList(u *undo, data []byte) (value []byte, idle int64, err error) {
	var buf [maxListSlots]listSlot
	slots, err := parseList(data, buf[:0])
	if err != nil {
		return nil, 0, err
	}
	var scratch []byte
	changed := false
	for i := range u.list {
		m := &u.list[i]
		if m.op == nil {
			continue
		}
		_, id, _ := limiter.SplitListKey(m.op.Key, m.op.Algorithm)
		j := findSlot(slots, id)
		if j < 0 {
			continue
		}
		sl := &slots[j]
		var grown []byte
		stIdle := sl.idle
		if m.op.Algorithm.Continuous() {
			if grown, stIdle, err = takeBack(scratch, m, sl.state); err != nil {
				return nil, 0, err
			}
		} else if grown, err = takeBackFixed(scratch, m, sl.state); err != nil {
			return nil, 0, err
		}
		if grown == nil { // the hits are no longer there
			continue
		}
		sl.state, sl.idle, sl.fresh = grown[len(scratch):], stIdle, true
		scratch = grown
		changed = true
	}
	if !changed {
		return nil, 0, nil
	}
	return encodeList(slots, u.now, len(data)+len(scratch))
}

// fixedState is a fixed window's state in a list's item: the counts of
// the two latest windows it saw (a key per window elsewhere), so that an
// op whose clock is a little behind, or a read of the previous window,
// finds the count the window's own key would hold.
type fixedState struct {
	start, prevStart int64 // window starts, Unix s; prevStart < start
	count, prevCount uint64
}

// window returns a pointer to the count of the window that starts at
// start, making room for it when it is newer than those kept (the older
// then goes), or nil when it is older than both: such a window's hits
// are decided on a count of 0 and not kept.
func (f *fixedState) window(start int64) *uint64 {
	switch {
	case start == f.start:
		return &f.count
	case start == f.prevStart:
		return &f.prevCount
	case start > f.start:
		f.prevStart, f.prevCount = f.start, f.count
		f.start, f.count = start, 0
		return &f.count
	case start > f.prevStart:
		f.prevStart, f.prevCount = start, 0
		return &f.prevCount
	}
	return nil
}

// fixedStep is step for a fixed window kept in a list's item: it applies
// op at now to the state encoded in data (none when !found), fills *r with
// limiter.FixedWindow's result, and, when the op has hits (recorded even
// over the limit, as the anchor does), returns the new encoding appended
// to dst, when it goes idle (the latest window's end, Unix µs) and the
// op's undo (a: the window start; b: 1 when the count saturated).
func fixedStep(dst []byte, op *limiter.Op, now time.Time, data []byte, found bool, r *limiter.Result) (value []byte, idle int64, u undo, err error) {
	w := max(int64(op.Window/time.Second), 1)
	start := limiter.WindowStart(now, w)
	var f fixedState
	if found {
		if f, err = parseFixed(data); err != nil {
			return nil, 0, undo{}, err
		}
	}
	var count uint64
	p := f.window(start)
	if p != nil {
		count = *p
	}
	st, res := limiter.FixedWindow(limiter.FixedWindowState{Count: count}, now, *op)
	*r = res
	if op.Hits == 0 || p == nil || op.Refund && st.Count == count {
		// A read, a window older than those kept, or a refund that
		// gave nothing back (a list never hit stays absent).
		return nil, 0, undo{}, nil
	}
	*p = st.Count
	u.a = start
	if st.Count == math.MaxUint64 {
		u.b = 1
	}
	return appendFixed(dst, f), secondsToMicros(f.start, w), u, nil
}

// takeBackFixed removes the hits m recorded from the fixed window state
// encoded in data and returns the new encoding appended to dst, or nil
// when they are no longer there: their window has gone, or its count
// saturated (never taken back, see counted).
func takeBackFixed(dst []byte, m *undo, data []byte) ([]byte, error) {
	f, err := parseFixed(data)
	if err != nil {
		return nil, err
	}
	if m.b != 0 || m.a != f.start && m.a != f.prevStart {
		return nil, nil
	}
	p := f.window(m.a)
	if *p == 0 {
		return nil, nil
	}
	*p = limiter.FixedWindowState{Count: *p}.TakeBack(m.op.Hits).Count
	return appendFixed(dst, f), nil
}

// secondsToMicros is start + w seconds in Unix µs, saturating.
func secondsToMicros(start, w int64) int64 {
	end := start + w // both far below 2^62: rules bound the window
	if end > math.MaxInt64/1_000_000 {
		return math.MaxInt64
	}
	if end < math.MinInt64/1_000_000 {
		return math.MinInt64
	}
	return end * 1_000_000
}

// appendFixed appends the encoding of a fixed window's state in a list's
// item: 'f' varint(start) uvarint(count) varint(prevStart) uvarint(prevCount).
func appendFixed(dst []byte, f fixedState) []byte {
	dst = append(dst, tagFixed)
	dst = binary.AppendVarint(dst, f.start)
	dst = binary.AppendUvarint(dst, f.count)
	dst = binary.AppendVarint(dst, f.prevStart)
	return binary.AppendUvarint(dst, f.prevCount)
}

// parseFixed decodes what appendFixed wrote.
func parseFixed(data []byte) (fixedState, error) {
	var f fixedState
	if len(data) == 0 || data[0] != tagFixed {
		return f, fmt.Errorf("%w: not a fixed window", errCorruptState)
	}
	d := data[1:]
	ok := true
	varint := func() int64 {
		v, n := shortestVarint(d)
		ok = ok && n > 0
		d = d[max(n, 0):]
		return v
	}
	uvarint := func() uint64 {
		v, n := shortestUvarint(d)
		ok = ok && n > 0
		d = d[max(n, 0):]
		return v
	}
	f.start, f.count, f.prevStart, f.prevCount = varint(), uvarint(), varint(), uvarint()
	if !ok || len(d) > 0 || f.prevStart >= f.start && f.prevCount > 0 {
		return fixedState{}, fmt.Errorf("%w: fixed window: bad encoding", errCorruptState)
	}
	return f, nil
}

// findSlot returns the index of the slot of id, or -1.
func findSlot(slots []listSlot, id string) int {
	for i := range slots {
		if string(slots[i].id) == id {
			return i
		}
	}
	return -1
}

// parseList decodes a list's item into slots (appended to slots), whose
// ids and states are sub-slices of data. It refuses anything but what
// encodeList writes, within its bounds.
func parseList(data []byte, slots []listSlot) ([]listSlot, error) {
	corrupt := func(what string) ([]listSlot, error) {
		return nil, fmt.Errorf("%w: list of limits: %s", errCorruptState, what)
	}
	switch {
	case len(data) < 2 || data[0] != listTag:
		return corrupt("not a list's item")
	case data[1] != listVersion:
		return corrupt(fmt.Sprintf("version %d, want %d", data[1], listVersion))
	}
	d := data[2:]
	n, k := shortestUvarint(d)
	if k <= 0 || n > maxListSlots {
		return corrupt("bad number of limits")
	}
	d = d[k:]
	for range n {
		l, k := shortestUvarint(d)
		if k <= 0 || l == 0 || l > maxSlotID || l > uint64(len(d)-k) {
			return corrupt("bad limit id")
		}
		id := d[k : k+int(l)]
		d = d[k+int(l):]
		idle, k := shortestVarint(d)
		if k <= 0 {
			return corrupt("bad idle time")
		}
		d = d[k:]
		l, k = shortestUvarint(d)
		if k <= 0 || l > uint64(len(d)-k) {
			return corrupt("bad state length")
		}
		state := d[k : k+int(l)]
		d = d[k+int(l):]
		if findSlot(slots, string(id)) >= 0 {
			return corrupt("limit " + string(id) + " twice")
		}
		slots = append(slots, listSlot{id: id, idle: idle, state: state})
	}
	if len(d) > 0 {
		return corrupt(fmt.Sprintf("%d bytes left over", len(d)))
	}
	return slots, nil
}

// encodeList returns the encoding of slots (about size bytes) and when the
// last of them goes idle. Slots this update did not write are dropped when
// idle at now, and, the first to go idle first, while there are more than
// maxListSlots or the encoding is over maxListBytes.
func encodeList(slots []listSlot, now time.Time, size int) (value []byte, idle int64, err error) {
	t := now.UnixMicro()
	kept := slots[:0]
	for i := range slots {
		if slots[i].fresh || slots[i].idle > t {
			kept = append(kept, slots[i])
		}
	}
	slots = kept
	for i := range slots {
		size += len(slots[i].id) + 2*binary.MaxVarintLen64
	}
	for {
		over := len(slots) > maxListSlots
		if !over {
			value = appendList(make([]byte, 0, size+16), slots)
			over = len(value) > maxListBytes
		}
		if !over {
			break
		}
		first := -1
		for i := range slots {
			if !slots[i].fresh && (first < 0 || slots[i].idle < slots[first].idle) {
				first = i
			}
		}
		if first < 0 {
			return nil, 0, fmt.Errorf("%w: %d limits, %d bytes", errListTooLarge, len(slots), len(value))
		}
		slots = slices.Delete(slots, first, first+1)
	}
	idle = math.MinInt64
	for i := range slots {
		idle = max(idle, slots[i].idle)
	}
	return value, idle, nil
}

// appendList appends the encoding of slots to dst.
func appendList(dst []byte, slots []listSlot) []byte {
	dst = append(dst, listTag, listVersion)
	dst = binary.AppendUvarint(dst, uint64(len(slots)))
	for i := range slots {
		sl := &slots[i]
		dst = binary.AppendUvarint(dst, uint64(len(sl.id)))
		dst = append(dst, sl.id...)
		dst = binary.AppendVarint(dst, sl.idle)
		dst = binary.AppendUvarint(dst, uint64(len(sl.state)))
		dst = append(dst, sl.state...)
	}
	return dst
}

// listKey returns the key of the item that holds the limits of ops, the
// ops of one group, and true, when every op's key is a list's limit's
// (limiter.SplitListKey) with one shared part, and there are no more than
// a list has. A group that is not (a batch that did not come from the
// limiter) is applied one op at a time, as ops of different descriptors.
func listKey(ops []limiter.Op) (string, bool) {
	if len(ops) > rules.MaxLimits {
		return "", false
	}
	var key string
	for i := range ops {
		k, id, ok := limiter.SplitListKey(ops[i].Key, ops[i].Algorithm)
		if !ok || len(id) > maxSlotID || i > 0 && k != key {
			return "", false
		}
		for j := range i {
			if _, other, _ := limiter.SplitListKey(ops[j].Key, ops[j].Algorithm); other == id {
				return "", false
			}
		}
		key = k
	}
	return key, true
}
