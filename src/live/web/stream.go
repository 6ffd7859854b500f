package web

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// streamDoc is one event of /api/v1/stream: the second that just closed.
type streamDoc struct {
	// End is the Unix second the figures are of.
	End int64 `json:"end"`
	// RulesVersion is the rules document's version: a client refetches
	// /api/v1/rules (and /api/v1/traffic) when it changes.
	RulesVersion uint64 `json:"rules_version"`
	// LoadErrorAt is when the last load of rules since those in use
	// failed (RFC 3339), "" when none did: a client refetches
	// /api/v1/rules when it changes too.
	LoadErrorAt string `json:"load_error_at"`
	// Rules holds, for each tracked rule with a decision in that second,
	// [decisions, over_limit, near_limit].
	Rules map[string][3]uint32 `json:"rules"`
	// Totals is [decisions, over_limit, near_limit, near_cache_hits,
	// store_errors] of that second.
	Totals  [5]uint32  `json:"totals"`
	TopKeys topKeysDoc `json:"topkeys"`
	// Unmatched is /api/v1/unmatched's document (10 of each).
	Unmatched unmatchedDoc `json:"unmatched"`
	Store     storeDoc     `json:"store"`
}

// event returns the current event, encoded once per second for every
// client, as an SSE event, and the second it is of.
func (h *Handler) event() (time.Time, []byte) {
	t := h.cfg.Live.Traffic(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.eventData != nil && t.End.Equal(h.eventEnd) {
		return h.eventEnd, h.eventData
	}
	_, version := h.cfg.Live.Rules()
	doc := streamDoc{RulesVersion: version, Rules: map[string][3]uint32{}, TopKeys: h.topKeys(defaultTopKeys, ""),
		Unmatched: h.unmatched(defaultTopKeys), Store: h.store()}
	if src := h.cfg.Source(); src.LastError != "" {
		doc.LoadErrorAt = src.LastErrorAt.UTC().Format(time.RFC3339Nano)
	}
	if !t.End.IsZero() {
		doc.End = t.End.Unix()
		for id, s := range t.Rules {
			if v := [3]uint32{s.Decisions[0], s.OverLimit[0], s.NearLimit[0]}; v != [3]uint32{} {
				doc.Rules[id] = v
			}
		}
		tt := t.Totals
		doc.Totals = [5]uint32{tt.Decisions[0], tt.OverLimit[0], tt.NearLimit[0], tt.NearCacheHits[0], tt.StoreErrors[0]}
	}
	var b bytes.Buffer
	b.WriteString("event: tick\ndata: ")
	_ = json.NewEncoder(&b).Encode(doc) // ends with the newline of the data line
	b.WriteByte('\n')
	h.eventEnd, h.eventData = t.End, b.Bytes()
	return h.eventEnd, h.eventData
}

// serveStream sends an event at once and then one a second, until the
// client goes, the handler is closed, or a write takes longer than
// Config.WriteTimeout. Each client costs one goroutine and a token of
// Config.MaxStreams; the events are shared bytes, so a slow client
// holds no buffer of its own beyond its connection's, and waits for no
// one: it skips the seconds it was too slow for.
func (h *Handler) serveStream(w http.ResponseWriter, r *http.Request) {
	select {
	case h.streams <- struct{}{}:
		defer func() { <-h.streams }()
	default:
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "too many live streams at once (at most "+strconv.Itoa(cap(h.streams))+")")
		return
	}
	rc := http.NewResponseController(w)
	// The listener's read deadline would end the stream (net/http reads
	// the connection in the background to notice a close); the write
	// deadline is renewed at each event below.
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	write := func(b []byte) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout)); err != nil {
			return false
		}
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write([]byte("retry: " + strconv.Itoa(int(streamRetry/time.Millisecond)) + "\n\n")) {
		return
	}
	sent := time.Unix(-1, 0)
	for {
		ticked := h.cfg.Live.Ticked()
		// A tick between Ticked and event has its event sent now, and
		// not again when ticked fires.
		if end, data := h.event(); !end.Equal(sent) {
			if !write(data) {
				return
			}
			sent = end
		}
		select {
		case <-r.Context().Done():
			return
		case <-h.done:
			return
		case <-ticked:
		}
	}
}
