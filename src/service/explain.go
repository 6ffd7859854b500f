package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// "Why was this (not) limited?": Explain answers it for one request as
// Envoy sends it: the way each descriptor went down the rules, the limits
// that apply, their counters now and the answer the request would get.
// It decides nothing: it matches without statistics, log lines or live
// view, and reads the counters with the stores' read (an op of 0 hits: a
// GET, or the algorithm's script without its write), so no hit is counted
// and no key is made.

// Codes of an Explanation.
const (
	explainOK   = "OK"
	explainOver = "OVER_LIMIT"
)

// Explanation is how the service would answer one request now, and why.
type Explanation struct {
	Domain      string `json:"domain"`
	DomainKnown bool   `json:"domain_known"`
	// Counters says whether the limits' counters were read: "read", or
	// why not.
	Counters string `json:"counters"`
	// OverallCode is the answer the request would get now (OK or
	// OVER_LIMIT); "" when the counters could not be read.
	OverallCode string `json:"overall_code"`
	// Note says what changes the overall code beyond the descriptors':
	// SHADOW_MODE, quota mode.
	Note        string                `json:"note,omitempty"`
	Descriptors []ExplainedDescriptor `json:"descriptors"`
}

// ExplainedDescriptor is one descriptor of an Explanation.
type ExplainedDescriptor struct {
	Entries []ExplainedEntry `json:"entries"`
	// Hits is what the descriptor would count (hits_addend; 0: checked
	// only).
	Hits uint64 `json:"hits"`
	// Steps are the entries that matched a rule, in order, and how.
	Steps []ExplainedStep `json:"steps"`
	// Rule is the statistics key of the rule matched; "" when none.
	Rule   string `json:"rule,omitempty"`
	Source string `json:"source,omitempty"`
	// Why says why no limit applies, or what replaced the rule's.
	Why    string           `json:"why,omitempty"`
	Limits []ExplainedLimit `json:"limits"`
	// Code is the descriptor's status in the answer: OK or OVER_LIMIT;
	// "" when the counters could not be read.
	Code string `json:"code"`
}

// ExplainedEntry is one entry of a descriptor.
type ExplainedEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// ExplainedStep is one entry's match (rules.Step).
type ExplainedStep struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	By     string `json:"by"`
	Rule   string `json:"rule"`
	Source string `json:"source"`
}

// ExplainedLimit is one limit that applies to a descriptor, or that does
// not (Skipped says why).
type ExplainedLimit struct {
	// Rule is the limit's statistics key (with the limit's level for one
	// of a rate_limits list); "override" for a per-request override.
	Rule            string `json:"rule"`
	Name            string `json:"name,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier"`
	Algorithm       string `json:"algorithm"`
	Burst           uint32 `json:"burst,omitempty"`
	Unlimited       bool   `json:"unlimited,omitempty"`
	ShadowMode      bool   `json:"shadow_mode,omitempty"`
	Shadow          bool   `json:"shadow,omitempty"`
	QuotaMode       bool   `json:"quota_mode,omitempty"`
	// CountedAs are the entries the counter is kept under, when they are
	// not the descriptor's (share_threshold: the pattern for the value).
	CountedAs []ExplainedEntry `json:"counted_as,omitempty"`
	// Skipped says why the limit does not apply; "" when it does.
	Skipped string `json:"skipped,omitempty"`
	// Remaining and ResetInSeconds are the counter now, read without
	// counting (nil when not read); OverNow says it is over its limit.
	Remaining      *uint32  `json:"remaining,omitempty"`
	ResetInSeconds *float64 `json:"reset_in_seconds,omitempty"`
	OverNow        bool     `json:"over_now,omitempty"`
	// Would is what the limit would say of the descriptor's hits now:
	// OK or OVER_LIMIT ("" when not read, or skipped).
	Would string `json:"would,omitempty"`
}

// Explain says how req would be answered now, and why. req is checked as
// a request to decide is (an invalid one is an error, as ShouldRateLimit's
// InvalidArgument); ErrNoRules while no rules are loaded. A store that
// cannot be read leaves the counters and the codes out, saying why.
func (s *Service) Explain(ctx context.Context, req *rlsv3.RateLimitRequest) (*Explanation, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	cfg := s.rules.Load()
	if cfg == nil {
		return nil, ErrNoRules
	}
	n, total := len(req.GetDescriptors()), 0
	for _, d := range req.GetDescriptors() {
		total += len(d.GetEntries())
	}
	sc := s.getScratch(n, total)
	defer s.putScratch(sc)
	sc.quiet = true
	s.match(cfg, req, sc)
	if err := slidingLogBudget(sc.descs); err != nil {
		return nil, err
	}

	// The counters, read with no hits.
	peek := make([]limiter.Descriptor, n)
	read := make([]limiter.Status, n)
	for i, d := range sc.descs {
		peek[i] = d
		peek[i].Hits = 0
		if d.Each != nil {
			peek[i].Each = make([]limiter.Status, len(d.Each))
		}
	}
	x := &Explanation{Domain: req.GetDomain(), DomainKnown: cfg.HasDomain(req.GetDomain()), Counters: "read"}
	storeCtx, cancel, err := s.budget(ctx)
	if err == nil {
		err = s.limiter.Check(storeCtx, req.GetDomain(), s.cfg.Now(), peek, read)
		cancel()
	}
	if err != nil {
		x.Counters = "not read: " + status.Convert(s.quietStatus(err)).Message()
		read = nil
	}
	var t explainTally
	for i, d := range req.GetDescriptors() {
		x.Descriptors = append(x.Descriptors, s.explainOne(cfg, req, d.GetLimit() != nil, sc, peek, read, i, &t))
	}
	if read != nil {
		x.OverallCode = explainOK
		if t.limitedOver || (t.quotaRules > 0 && t.quotaOver == t.quotaRules) {
			x.OverallCode = explainOver
		}
		switch {
		case x.OverallCode == explainOver && s.cfg.GlobalShadowMode:
			x.OverallCode, x.Note = explainOK, "SHADOW_MODE: over the limit, answered OK"
		case t.quotaRules > 0:
			x.Note = "quota mode: the request is over the limit only when every quota_mode descriptor is"
		}
	}
	return x, nil
}

// quietStatus is toStatus's code and message for err, without its
// counting and logging: an explanation is no decision.
func (s *Service) quietStatus(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msgDeadline)
	case errors.Is(err, limiter.ErrOverloaded):
		return status.Error(codes.ResourceExhausted, withReason(limiter.ErrOverloaded, err))
	case errors.Is(err, limiter.ErrUnavailable):
		return status.Error(codes.Unavailable, withReason(limiter.ErrUnavailable, err))
	case errors.Is(err, limiter.ErrData):
		return status.Error(codes.Internal, limiter.ErrData.Error())
	}
	return status.Error(codes.Internal, msgInternal)
}

// explainTally gathers the descriptors' codes for the overall code, as
// respond's tally does.
type explainTally struct {
	limitedOver           bool
	quotaRules, quotaOver int
}

// explainOne explains the i-th descriptor of req, matched into sc, its
// counters in peek and read (nil when not read).
func (s *Service) explainOne(cfg *rules.Config, req *rlsv3.RateLimitRequest, override bool, sc *scratch, peek []limiter.Descriptor, read []limiter.Status, i int, t *explainTally) ExplainedDescriptor {
	domain := req.GetDomain()
	var entries []rules.Entry
	for _, e := range req.GetDescriptors()[i].GetEntries() {
		entries = append(entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	d := &sc.descs[i]
	ed := ExplainedDescriptor{Entries: explainedEntries(entries), Hits: d.Hits, Steps: []ExplainedStep{}, Limits: []ExplainedLimit{}}
	rx := cfg.Explain(domain, entries)
	for _, st := range rx.Steps {
		ed.Steps = append(ed.Steps, ExplainedStep{st.Entry.Key, st.Entry.Value, st.By, st.Rule, st.Source})
	}
	if rx.Limit != nil {
		ed.Rule, ed.Source = rx.Limit.FullKey, rx.Limit.Source
	}
	switch {
	case override && d.Limit != nil:
		ed.Why = "a per-request limit override (the route's limit) applies, in place of any rule"
	case override && len(entries) > 0:
		ed.Why = "the per-request limit override is ignored: the domain is not in the rules (as in envoyproxy/ratelimit)"
		if rx.Why != "" {
			ed.Why += "; " + rx.Why
		}
	case rx.Limit == nil:
		ed.Why = rx.Why
	case sc.unlim[i]:
		ed.Why = "the rule is unlimited"
	case d.Limit == nil:
		ed.Why = "replaced: " + replacedBy(rx.Limit, sc, i)
	}
	if d.Limit == nil {
		ed.Code = codeIf(read != nil, false)
		if rx.Limit != nil && !override {
			el := explainedLimit(rx.Limit, d, nil)
			el.Skipped = ed.Why
			ed.Limits = append(ed.Limits, el)
		}
		return ed
	}
	over := false
	if d.Limit.InList() {
		for k, m := range d.Limit.Limits {
			var st *limiter.Status
			skipped := ""
			switch {
			case d.Skip&(1<<k) != 0:
				skipped = "replaced: " + replacedBy(m, sc, i)
			case m.Unlimited:
				skipped = "unlimited"
			case read != nil:
				st = &peek[i].Each[k]
			}
			el := explainedLimit(m, d, st)
			el.Skipped = skipped
			over = over || (el.Would == explainOver && !m.Shadow && !m.ShadowMode)
			ed.Limits = append(ed.Limits, el)
		}
	} else {
		var st *limiter.Status
		if read != nil {
			st = &read[i]
		}
		el := explainedLimit(d.Limit, d, st)
		over = el.Would == explainOver && !d.Limit.ShadowMode
		ed.Limits = append(ed.Limits, el)
	}
	if !override && !slices.Equal(d.Entries, entries) {
		// share_threshold: every value the pattern matches, one counter.
		for k := range ed.Limits {
			ed.Limits[k].CountedAs = explainedEntries(d.Entries)
		}
	}
	ed.Code = codeIf(read != nil, over)
	if d.Limit.QuotaMode || s.cfg.GlobalQuotaMode {
		t.quotaRules++
		if over {
			t.quotaOver++
		}
	} else if over {
		t.limitedOver = true
	}
	return ed
}

// codeIf is OK or OVER_LIMIT, or "" when the counters were not read.
func codeIf(read, over bool) string {
	switch {
	case !read:
		return ""
	case over:
		return explainOver
	}
	return explainOK
}

// replacedBy names the rules of sc whose replaces name l's name.
func replacedBy(l *rules.Limit, sc *scratch, self int) string {
	var by []string
	for j := range sc.descs {
		r := sc.descs[j].Limit
		if j == self || r == nil {
			continue
		}
		for _, m := range append([]*rules.Limit{r}, r.Limits...) {
			for _, name := range m.Replaces {
				if name == l.Name {
					by = append(by, fmt.Sprintf("descriptor %d's rule %s (%s) replaces %q", j+1, m.FullKey, m.Source, name))
				}
			}
		}
	}
	if by == nil {
		return fmt.Sprintf("a rule of another descriptor replaces %q", l.Name)
	}
	return strings.Join(by, "; ")
}

// explainedLimit describes l, a limit of d, with its counter st read
// with no hits (nil when not read), and what d's hits would make of it.
func explainedLimit(l *rules.Limit, d *limiter.Descriptor, st *limiter.Status) ExplainedLimit {
	el := ExplainedLimit{
		Rule: l.FullKey, Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit.String(),
		UnitMultiplier: max(l.UnitMultiplier, 1), Algorithm: l.Algorithm.String(), Unlimited: l.Unlimited,
		ShadowMode: l.ShadowMode, Shadow: l.Shadow, QuotaMode: l.QuotaMode,
	}
	if l.Algorithm.HasBurst() {
		el.Burst = l.Capacity()
	}
	if l.StatLevel != "" {
		el.Rule += "." + l.StatLevel
	}
	if l.Source == "" {
		el.Rule = "override"
	}
	if l.Unlimited || st == nil {
		return el
	}
	remaining, reset := st.Remaining, st.ResetAfter.Seconds()
	el.Remaining, el.ResetInSeconds = &remaining, &reset
	// Read with no hits, a limit is over when its count already is (a
	// shadow_mode rule's read says OK all the same, with nothing left).
	el.OverNow = st.Code == limiter.OverLimit
	el.Would = explainOK
	if el.OverNow || (d.Hits > 0 && d.Hits > uint64(remaining)) {
		el.Would = explainOver
	}
	return el
}

func explainedEntries(es []rules.Entry) []ExplainedEntry {
	out := make([]ExplainedEntry, len(es))
	for i, e := range es {
		out[i] = ExplainedEntry{e.Key, e.Value}
	}
	return out
}

// ExplainHandler serves Explain over HTTP (the debug listener's
// /api/v1/explain): a POST of a RateLimitRequest in protobuf's JSON
// mapping, as /json takes it, of at most maxBody bytes, answered with the
// Explanation as JSON; 400 for a request that is not valid, 503 while no
// rules are loaded or MaxConcurrent decisions are under way.
func (s *Service) ExplainHandler(maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, done := s.readRequest(w, r, maxBody)
		if req == nil {
			return
		}
		defer done()
		x, err := s.Explain(r.Context(), req)
		var re *requestError
		switch {
		case errors.As(err, &re):
			http.Error(w, re.msg, http.StatusBadRequest)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(x)
	})
}

// WriteText writes x for a terminal: per descriptor its entries, how
// each matched, the limits with their counters, and the answer.
func (x *Explanation) WriteText(w io.Writer) error {
	var b strings.Builder
	known := "in the rules"
	if !x.DomainKnown {
		known = "not in the rules"
	}
	fmt.Fprintf(&b, "domain %q: %s\n", x.Domain, known)
	for i, d := range x.Descriptors {
		var es []string
		for _, e := range d.Entries {
			es = append(es, e.Key+"="+e.Value)
		}
		fmt.Fprintf(&b, "descriptor %d: %s (hits %d)\n", i+1, strings.Join(es, ", "), d.Hits)
		for _, st := range d.Steps {
			fmt.Fprintf(&b, "  %s=%s matched %s by %s (%s)\n", st.Key, st.Value, st.Rule, st.By, st.Source)
		}
		if d.Why != "" {
			fmt.Fprintf(&b, "  why: %s\n", d.Why)
		}
		for _, l := range d.Limits {
			unit := l.Unit
			if l.UnitMultiplier > 1 {
				unit = fmt.Sprint(l.UnitMultiplier, " ", l.Unit)
			}
			fmt.Fprintf(&b, "  limit %s: %d / %s, %s", l.Rule, l.RequestsPerUnit, unit, l.Algorithm)
			for _, flag := range []struct {
				on   bool
				name string
			}{{l.Unlimited, "unlimited"}, {l.ShadowMode, "shadow_mode"}, {l.Shadow, "shadow"}, {l.QuotaMode, "quota_mode"}} {
				if flag.on {
					b.WriteString(", " + flag.name)
				}
			}
			switch {
			case l.Skipped != "" && l.Skipped == d.Why:
				b.WriteString("; does not apply (why: above)")
			case l.Skipped != "":
				fmt.Fprintf(&b, "; does not apply: %s", l.Skipped)
			case l.Remaining != nil:
				fmt.Fprintf(&b, "; now %d left, resets in %s: %s", *l.Remaining,
					time.Duration(*l.ResetInSeconds*float64(time.Second)).Round(time.Millisecond), l.Would)
			}
			b.WriteByte('\n')
		}
		if d.Code != "" {
			fmt.Fprintf(&b, "  answer: %s\n", d.Code)
		}
	}
	fmt.Fprintf(&b, "counters: %s\n", x.Counters)
	if x.OverallCode != "" {
		fmt.Fprintf(&b, "overall: %s", x.OverallCode)
		if x.Note != "" {
			fmt.Fprintf(&b, " (%s)", x.Note)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
