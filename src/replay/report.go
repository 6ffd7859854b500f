package replay

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratelimitd/ratelimit/src/capture"
)

// Report is what a replay found.
type Report struct {
	// New and Old name the rule sets; Against is "rules" when New was
	// compared with Old, "capture" when with the answers in the capture.
	New     string `json:"new"`
	Old     string `json:"old,omitempty"`
	Against string `json:"against"`
	// Header and Summary are the capture's (Summary nil when it was cut
	// short).
	Header  capture.Header   `json:"capture"`
	Summary *capture.Summary `json:"capture_summary"`
	// Requests is the number replayed, decided From first To last.
	Requests int64     `json:"requests"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	// RefusedByNewOnly counts the requests New refused and the other
	// admitted; RefusedByOtherOnly the reverse.
	RefusedByNewOnly   int64 `json:"refused_by_new_only"`
	RefusedByOtherOnly int64 `json:"refused_by_other_only"`
	// DescriptorsDiffer counts the descriptors answered differently,
	// over all the requests.
	DescriptorsDiffer int64 `json:"descriptors_differ"`
	// Degraded counts the requests the capture says were decided from
	// local counts (STORE_FAILURE_MODE=local): their answers there were
	// not the shared store's.
	Degraded int64 `json:"degraded"`
	// Evicted counts the keys the replay's memory stores evicted under
	// their limit (Config.MemoryMaxBytes): decisions of such keys may
	// differ from a store that kept them.
	Evicted uint64 `json:"evicted"`
	// TooLong counts the lines longer than capture.MaxLine, skipped;
	// TooLongAt are the numbers of the first maxTooLongAt of them.
	TooLong   int64 `json:"lines_too_long"`
	TooLongAt []int `json:"lines_too_long_at,omitempty"`
	// Rules and OldRules are, for New and Old, the rules that decided a
	// descriptor or counted a hit, most refusals first. Besides the
	// rules, "DOMAIN (limit override)" stands for the descriptors that
	// carried their own limit, and "DOMAIN (no limit)" for those a set
	// admitted without a limit while the other refused them.
	Rules    []RuleReport `json:"rules"`
	OldRules []RuleReport `json:"old_rules,omitempty"`
	// Took is how long the replay took.
	Took time.Duration `json:"took_ns"`
}

// RuleReport is one rule's figures in one rule set.
type RuleReport struct {
	// ID names the rule as its statistics and the live view do.
	ID     string `json:"id"`
	Source string `json:"source,omitempty"`
	// Shadow marks a shadow limit: its figures are what it would have
	// done, none of which it did.
	Shadow bool `json:"shadow"`
	// Requests counts the descriptors it applied to (every limit of a
	// list applies to each of the list's descriptors), Refused those it
	// was over (a shadow limit: would have refused; of a list's limits,
	// each that was over counts the refusal).
	Requests int64 `json:"requests"`
	Refused  int64 `json:"refused"`
	// RefusedOtherAdmitted counts those it refused that the other rule
	// set (or the capture) admitted; AdmittedOtherRefused the reverse.
	RefusedOtherAdmitted int64 `json:"refused_other_admitted"`
	AdmittedOtherRefused int64 `json:"admitted_other_refused"`
	// Keys are the keys it refused most, each with the time of its first
	// refusal; RefusedUntracked counts refusals of keys past
	// Config.MaxKeys, which are not listed.
	Keys             []KeyReport `json:"keys"`
	RefusedUntracked int64       `json:"refused_untracked"`
}

// KeyReport is one key a rule refused: its entries as the rule counted
// them (key="value" pairs), how often, and when first.
type KeyReport struct {
	Key     string    `json:"key"`
	Refused int64     `json:"refused"`
	First   time.Time `json:"first"`
}

// maxTooLongAt bounds Report.TooLongAt.
const maxTooLongAt = 10

// tooLong counts a line too long to read, line.
func (r *Report) tooLong(line int) {
	r.TooLong++
	if len(r.TooLongAt) < maxTooLongAt {
		r.TooLongAt = append(r.TooLongAt, line)
	}
}

// ruleStats is a rule's figures while the replay runs.
type ruleStats struct {
	report RuleReport
	keys   map[string]*KeyReport
}

// rules returns the side's rules that saw a decision, most refused first,
// each with its top keys.
func (s *side) rules(top int) []RuleReport {
	out := make([]RuleReport, 0, len(s.order))
	for _, st := range s.order {
		r := st.report
		// Pointers: a copy of every key tracked would take a third of
		// what they take.
		keys := make([]*KeyReport, 0, len(st.keys))
		for _, k := range st.keys {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b *KeyReport) int {
			return cmp.Or(cmp.Compare(b.Refused, a.Refused), a.First.Compare(b.First), strings.Compare(a.Key, b.Key))
		})
		r.Keys = make([]KeyReport, min(top, len(keys)))
		for i, k := range keys[:len(r.Keys)] {
			r.Keys[i] = *k
			r.Keys[i].Key = formatKey(k.Key)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b RuleReport) int {
		return cmp.Or(cmp.Compare(b.Refused, a.Refused), cmp.Compare(b.Requests, a.Requests), strings.Compare(a.ID, b.ID))
	})
	return out
}

// Differs reports whether the rule sets (or New and the capture) answered
// a request differently.
func (r *Report) Differs() bool { return r.DescriptorsDiffer > 0 }

// other names what New is compared with.
func (r *Report) other() string {
	if r.Against == "capture" {
		return "the capture"
	}
	return r.Old
}

// WriteText writes the report for a reader: a summary, then a table of
// each rule set's rules with their most refused keys.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "replayed %d requests", r.Requests)
	if r.Requests > 0 {
		fmt.Fprintf(&b, " decided from %s to %s (%s)", stamp(r.From), stamp(r.To), r.To.Sub(r.From).Round(time.Millisecond))
	}
	fmt.Fprintf(&b, " in %s\n", r.Took.Round(time.Millisecond))
	for _, warn := range r.warnings() {
		fmt.Fprintf(&b, "warning: %s\n", warn)
	}
	fmt.Fprintf(&b, "%s compared with %s: ", r.New, r.other())
	if !r.Differs() {
		b.WriteString("the same answer to every request and descriptor\n")
	} else {
		fmt.Fprintf(&b, "%d descriptors answered differently; %d requests refused by %s only, %d by %s only\n",
			r.DescriptorsDiffer, r.RefusedByNewOnly, r.New, r.RefusedByOtherOnly, r.other())
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if err := writeRules(w, r.New, r.other(), r.Rules); err != nil {
		return err
	}
	if r.Against == "rules" {
		return writeRules(w, r.Old, r.New, r.OldRules)
	}
	return nil
}

// warnings says what makes the replay less than the whole traffic.
func (r *Report) warnings() []string {
	var out []string
	switch s := r.Summary; {
	case s == nil:
		out = append(out, "the capture has no last line: it was cut short, and may end in the middle of the traffic")
	case s.Dropped > 0 || s.TooLarge > 0:
		out = append(out, fmt.Sprintf("the capture misses %d requests (%d its reader did not take in time, %d too large): the counts of their keys are short", s.Dropped+s.TooLarge, s.Dropped, s.TooLarge))
	}
	if v := r.Header.Values; v != "" && v != "plain" {
		out = append(out, fmt.Sprintf("the capture's values are %s: rules that name values do not match them", v))
	}
	if r.Degraded > 0 && r.Against == "capture" {
		out = append(out, fmt.Sprintf("%d answers in the capture came from an instance's local counts (STORE_FAILURE_MODE=local), not the shared store", r.Degraded))
	}
	if r.TooLong > 0 {
		at := "line "
		if r.TooLong > 1 {
			at = "lines "
		}
		at += strings.Trim(strings.ReplaceAll(fmt.Sprint(r.TooLongAt), " ", ", "), "[]")
		if more := r.TooLong - int64(len(r.TooLongAt)); more > 0 {
			at += fmt.Sprintf(" and %d more", more)
		}
		out = append(out, fmt.Sprintf("lines longer than %d bytes, skipped (their requests are not replayed): %d, at %s", capture.MaxLine, r.TooLong, at))
	}
	if r.Evicted > 0 {
		out = append(out, fmt.Sprintf("the replay's memory stores evicted %d keys under their limit: raise -memory_max_bytes", r.Evicted))
	}
	return out
}

func writeRules(w io.Writer, name, other string, rs []RuleReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\n%s\trequests\trefused\trefused, admitted by %s\tadmitted, refused by %s\n", name, other, other)
	for _, r := range rs {
		id := r.ID
		if r.Shadow {
			id += " (shadow: would refuse)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", id, r.Requests, r.Refused, r.RefusedOtherAdmitted, r.AdmittedOtherRefused)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, r := range rs {
		if len(r.Keys) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s: keys most refused, with their first refusal\n", r.ID)
		for _, k := range r.Keys {
			fmt.Fprintf(&b, "  %8d  %s  %s\n", k.Refused, stamp(k.First), k.Key)
		}
		if r.RefusedUntracked > 0 {
			fmt.Fprintf(&b, "  %8d  refusals of keys past -max_keys, not listed\n", r.RefusedUntracked)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// stamp writes a time in UTC to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
