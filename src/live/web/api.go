package web

import (
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// The JSON documents of the API; docs/LIVE.md describes every field.

type rulesDoc struct {
	// Version changes with every set of rules published (a reload).
	Version   uint64      `json:"version"`
	Source    *sourceDoc  `json:"source"`
	LastError *errorDoc   `json:"last_error"`
	Domains   []domainDoc `json:"domains"`
}

type sourceDoc struct {
	Kind     string    `json:"kind"`
	Location string    `json:"location"`
	Version  string    `json:"version,omitempty"`
	LoadedAt time.Time `json:"loaded_at"`
}

type errorDoc struct {
	At    time.Time `json:"at"`
	Error string    `json:"error"`
}

type domainDoc struct {
	Domain string    `json:"domain"`
	Rules  []ruleDoc `json:"rules"`
}

type limitDoc struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier"`
	WindowSeconds   int64  `json:"window_seconds"`
	Algorithm       string `json:"algorithm"`
	// Burst is a token bucket's capacity; 0 for the other algorithms.
	Burst uint32 `json:"burst"`
}

type ruleDoc struct {
	ID string `json:"id"`
	// Chain is the descriptor chain: "key" or "key_value" per level.
	Chain  []string `json:"chain"`
	Source string   `json:"source"`
	Name   string   `json:"name,omitempty"`
	limitDoc
	Unlimited      bool     `json:"unlimited"`
	ShadowMode     bool     `json:"shadow_mode"`
	QuotaMode      bool     `json:"quota_mode"`
	DetailedMetric bool     `json:"detailed_metric"`
	Replaces       []string `json:"replaces,omitempty"`
	// Shadow marks a shadow limit of a rate_limits list: counted, never
	// refusing; its over-limit figures are what it would have refused.
	Shadow bool `json:"shadow"`
	// Twins are the IDs of the limits of the same list in the other role
	// (live.Rule.Twins).
	Twins []string `json:"twins,omitempty"`
	// Tracked reports whether the rule has traffic series.
	Tracked bool `json:"tracked"`
}

func limitOf(l *rules.Limit) limitDoc {
	d := limitDoc{
		RequestsPerUnit: l.RequestsPerUnit,
		Unit:            l.Unit.String(),
		UnitMultiplier:  max(l.UnitMultiplier, 1),
		WindowSeconds:   int64(l.Window() / time.Second),
		Algorithm:       l.Algorithm.String(),
	}
	if l.Algorithm.HasBurst() {
		d.Burst = l.Capacity()
	}
	return d
}

func (h *Handler) rules() rulesDoc {
	rs, version := h.cfg.Live.Rules()
	src := h.cfg.Source()
	doc := rulesDoc{Version: version, Domains: []domainDoc{}}
	if src.Kind != "" {
		doc.Source = &sourceDoc{Kind: src.Kind, Location: src.Location, Version: src.Version, LoadedAt: src.LoadedAt.UTC()}
	}
	if src.LastError != "" {
		doc.LastError = &errorDoc{At: src.LastErrorAt.UTC(), Error: src.LastError}
	}
	for _, r := range rs {
		l := r.Limit
		if n := len(doc.Domains); n == 0 || doc.Domains[n-1].Domain != l.Domain {
			doc.Domains = append(doc.Domains, domainDoc{Domain: l.Domain})
		}
		d := &doc.Domains[len(doc.Domains)-1]
		d.Rules = append(d.Rules, ruleDoc{
			ID: r.ID, Chain: slices.Clone(l.Levels), Source: l.Source, Name: l.Name, limitDoc: limitOf(l),
			Unlimited: l.Unlimited, ShadowMode: l.ShadowMode, QuotaMode: l.QuotaMode, DetailedMetric: l.DetailedMetric,
			Replaces: l.Replaces, Shadow: l.Shadow, Twins: r.Twins, Tracked: r.Tracked,
		})
	}
	return doc
}

type seriesDoc struct {
	Decisions []uint32 `json:"decisions"`
	OverLimit []uint32 `json:"over_limit"`
	NearLimit []uint32 `json:"near_limit"`
}

type totalsDoc struct {
	seriesDoc
	NearCacheHits []uint32 `json:"near_cache_hits"`
	StoreErrors   []uint32 `json:"store_errors"`
}

type trafficDoc struct {
	// End is the Unix second of the last figure; each series ends there,
	// one figure a second. 0 before the first second closes.
	End     int64                `json:"end"`
	Seconds int                  `json:"seconds"`
	Rules   map[string]seriesDoc `json:"rules"`
	Totals  totalsDoc            `json:"totals"`
	Store   storeDoc             `json:"store"`
}

func (h *Handler) traffic(seconds int) trafficDoc {
	t := h.cfg.Live.Traffic(seconds)
	doc := trafficDoc{Seconds: seconds, Rules: make(map[string]seriesDoc, len(t.Rules)), Store: h.store()}
	if !t.End.IsZero() {
		doc.End = t.End.Unix()
	}
	for id, s := range t.Rules {
		doc.Rules[id] = seriesDoc{s.Decisions, s.OverLimit, s.NearLimit}
	}
	tt := t.Totals
	doc.Totals = totalsDoc{seriesDoc{tt.Decisions, tt.OverLimit, tt.NearLimit}, tt.NearCacheHits, tt.StoreErrors}
	return doc
}

type entryDoc struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type keyDoc struct {
	Entries   []entryDoc `json:"entries"`
	Truncated bool       `json:"truncated"`
	// Rule is the rule's ID; empty for a per-request override.
	Rule     string   `json:"rule"`
	Override bool     `json:"override"`
	Limit    limitDoc `json:"limit"`
	Used     uint64   `json:"used"`
	Capacity uint64   `json:"capacity"`
	Over     bool     `json:"over"`
	// Shadow says the rule is a shadow limit: Over means it would have
	// refused the key's last request, which was not refused for it.
	Shadow bool `json:"shadow"`
	// ResetInSeconds is the time until the limit resets (a token bucket:
	// until it is full).
	ResetInSeconds float64 `json:"reset_in_seconds"`
	// Count estimates the recent decisions near or over the limit (see
	// live.Key); CountError bounds its overestimate.
	Count              uint64  `json:"count"`
	CountError         uint64  `json:"count_error"`
	LastSeenSecondsAgo float64 `json:"last_seen_seconds_ago"`
}

type topDomainDoc struct {
	Domain string   `json:"domain"`
	Keys   []keyDoc `json:"keys"`
}

type topKeysDoc struct {
	// Capacity is the sketch's: the keys tracked at once.
	Capacity int `json:"capacity"`
	// Values is how the entries' values are shown: plain, hashed or
	// truncated (LIVE_VIEW_VALUES).
	Values  string         `json:"values"`
	Domains []topDomainDoc `json:"domains"`
}

// topKeys returns the top n keys of every domain, or of one when domain is
// not empty.
func (h *Handler) topKeys(n int, domain string) topKeysDoc {
	top := h.cfg.Live.TopKeys(n)
	doc := topKeysDoc{Capacity: h.cfg.Live.MaxKeys(), Values: h.values.values.String(), Domains: []topDomainDoc{}}
	now := time.Now()
	for d, keys := range top {
		if domain != "" && d != domain {
			continue
		}
		dd := topDomainDoc{Domain: d, Keys: make([]keyDoc, 0, len(keys))}
		for _, k := range keys {
			kd := keyDoc{
				Truncated: k.Truncated, Rule: k.RuleID, Override: k.Limit.Source == "", Limit: limitOf(k.Limit),
				Used: k.Used, Capacity: k.Capacity, Over: k.Over, Shadow: k.Limit.Shadow, ResetInSeconds: k.ResetIn.Seconds(),
				Count: k.Count, CountError: k.CountError, LastSeenSecondsAgo: max(now.Sub(k.Seen).Seconds(), 0),
				Entries: make([]entryDoc, len(k.Entries)),
			}
			for i, e := range k.Entries {
				kd.Entries[i] = entryDoc{e.Key, h.values.show(e.Value)}
			}
			dd.Keys = append(dd.Keys, kd)
		}
		doc.Domains = append(doc.Domains, dd)
	}
	slices.SortFunc(doc.Domains, func(a, b topDomainDoc) int { return strings.Compare(a.Domain, b.Domain) })
	return doc
}

type latencyDoc struct {
	WindowSeconds float64 `json:"window_seconds"`
	Samples       uint64  `json:"samples"`
	P50Ms         float64 `json:"p50_ms"`
	P90Ms         float64 `json:"p90_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
}

type breakersDoc struct {
	Open       int64  `json:"open"`
	Trips      uint64 `json:"trips"`
	Rejections uint64 `json:"rejections"`
}

type nearCacheDoc struct {
	Entries int `json:"entries"`
}

type storeDoc struct {
	Backend          string        `json:"backend"`
	Healthy          bool          `json:"healthy"`
	Latency          latencyDoc    `json:"latency"`
	ErrorsLastMinute uint64        `json:"errors_last_minute"`
	Breakers         *breakersDoc  `json:"breakers"`
	NearCache        *nearCacheDoc `json:"near_cache"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (h *Handler) store() storeDoc {
	s := h.cfg.Store()
	l, errs := h.cfg.Live.StoreLatency()
	doc := storeDoc{
		Backend: s.Backend, Healthy: s.Healthy, ErrorsLastMinute: errs,
		Latency: latencyDoc{
			WindowSeconds: l.Window.Seconds(), Samples: l.Samples,
			P50Ms: ms(l.P50), P90Ms: ms(l.P90), P99Ms: ms(l.P99), MaxMs: ms(l.Max),
		},
	}
	if b := s.Breakers; b != nil {
		doc.Breakers = &breakersDoc{Open: b.Open, Trips: b.Trips, Rejections: b.Rejections}
	}
	if c := s.NearCache; c != nil {
		doc.NearCache = &nearCacheDoc{Entries: c.Entries}
	}
	return doc
}

type unknownDomainDoc struct {
	Domain             string  `json:"domain"`
	Count              uint64  `json:"count"`
	CountError         uint64  `json:"count_error"`
	LastSeenSecondsAgo float64 `json:"last_seen_seconds_ago"`
}

type unmatchedKeyDoc struct {
	Domain string   `json:"domain"`
	Keys   []string `json:"keys"`
	// Example is the last descriptor of these keys, values shown as
	// Config.Values says.
	Example            []entryDoc `json:"example"`
	Truncated          bool       `json:"truncated"`
	Count              uint64     `json:"count"`
	CountError         uint64     `json:"count_error"`
	LastSeenSecondsAgo float64    `json:"last_seen_seconds_ago"`
}

type unmatchedCapacityDoc struct {
	Domains int `json:"domains"`
	Keys    int `json:"keys"`
}

type unmatchedDoc struct {
	Capacity unmatchedCapacityDoc `json:"capacity"`
	Values   string               `json:"values"`
	Domains  []unknownDomainDoc   `json:"domains"`
	Keys     []unmatchedKeyDoc    `json:"keys"`
}

// unmatched returns the n unknown domains and the n key chains of
// descriptors that matched no rule, the most recent requests first.
func (h *Handler) unmatched(n int) unmatchedDoc {
	doc := unmatchedDoc{
		Capacity: unmatchedCapacityDoc{Domains: live.MaxUnknownDomains, Keys: live.MaxUnmatchedKeys},
		Values:   h.values.values.String(), Domains: []unknownDomainDoc{}, Keys: []unmatchedKeyDoc{},
	}
	now := time.Now()
	ago := func(t time.Time) float64 { return max(now.Sub(t).Seconds(), 0) }
	for _, u := range h.cfg.Live.UnknownDomains(n) {
		doc.Domains = append(doc.Domains, unknownDomainDoc{u.Domain, u.Count, u.CountError, ago(u.Seen)})
	}
	for _, u := range h.cfg.Live.UnmatchedKeys(n) {
		kd := unmatchedKeyDoc{
			Domain: u.Domain, Keys: u.Keys, Example: make([]entryDoc, len(u.Example)), Truncated: u.Truncated,
			Count: u.Count, CountError: u.CountError, LastSeenSecondsAgo: ago(u.Seen),
		}
		for i, e := range u.Example {
			kd.Example[i] = entryDoc{e.Key, h.values.show(e.Value)}
		}
		doc.Keys = append(doc.Keys, kd)
	}
	return doc
}
