package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// WriteText writes a human-readable report of r.
func (r *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "target       %s  c=%d conns=%d domain=%q\n", r.Addr, r.Concurrency, r.Conns, r.Domain)
	for _, d := range r.Descriptors {
		fmt.Fprintf(&b, "descriptor   %s\n", d)
	}
	fmt.Fprintf(&b, "key space    %d\n", r.KeySpace)
	if r.Window > 0 {
		fmt.Fprintf(&b, "requests     %d, %d of them done within %.3fs = %.0f req/s\n", r.Requests, r.InWindow, r.Window.Seconds(), r.RPS())
	} else {
		fmt.Fprintf(&b, "requests     %d in %.3fs = %.0f req/s\n", r.Requests, r.Elapsed.Seconds(), r.RPS())
	}
	l := r.Latency
	fmt.Fprintf(&b, "latency      p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (min %s, mean %s)\n",
		FormatDuration(l.P50), FormatDuration(l.P90), FormatDuration(l.P99), FormatDuration(l.P999),
		FormatDuration(l.Max), FormatDuration(l.Min), FormatDuration(l.Mean))
	fmt.Fprintf(&b, "responses    OK %d  OVER_LIMIT %d  UNKNOWN %d\n", r.OK, r.OverLimit, r.Unknown)
	fmt.Fprintf(&b, "errors       %d", r.ErrorCount())
	if len(r.Errors) > 0 {
		var parts []string
		for _, c := range sortedCodes(r.Errors) {
			parts = append(parts, fmt.Sprintf("%s %d", c, r.Errors[c]))
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

func sortedCodes(m map[codes.Code]uint64) []codes.Code {
	cs := make([]codes.Code, 0, len(m))
	for c := range m {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	return cs
}

// FormatDuration prints a latency with three significant figures in µs, ms
// or s.
func FormatDuration(d time.Duration) string {
	us := float64(d) / 1e3
	switch {
	case us < 10:
		return fmt.Sprintf("%.2fµs", us)
	case us < 100:
		return fmt.Sprintf("%.1fµs", us)
	case us < 1000:
		return fmt.Sprintf("%.0fµs", us)
	case us < 10e3:
		return fmt.Sprintf("%.2fms", us/1e3)
	case us < 100e3:
		return fmt.Sprintf("%.1fms", us/1e3)
	case us < 1e6:
		return fmt.Sprintf("%.0fms", us/1e3)
	}
	return fmt.Sprintf("%.2fs", us/1e6)
}

// jsonResult is the machine-readable form of a Result; times are in
// microseconds.
type jsonResult struct {
	Addr              string            `json:"addr"`
	Domain            string            `json:"domain"`
	Descriptors       []string          `json:"descriptors"`
	KeySpace          int64             `json:"key_space"`
	Concurrency       int               `json:"concurrency"`
	Conns             int               `json:"conns"`
	Requests          uint64            `json:"requests"`
	ElapsedSeconds    float64           `json:"elapsed_seconds"`
	WindowSeconds     float64           `json:"window_seconds,omitempty"`
	InWindow          uint64            `json:"in_window,omitempty"`
	RequestsPerSecond float64           `json:"requests_per_second"`
	LatencyUS         jsonLatency       `json:"latency_us"`
	OK                uint64            `json:"ok"`
	OverLimit         uint64            `json:"over_limit"`
	Unknown           uint64            `json:"unknown"`
	Errors            map[string]uint64 `json:"errors"`
}

type jsonLatency struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

// MarshalJSON encodes r with snake_case names, latencies in microseconds and
// errors keyed by gRPC code name (such as "Unavailable").
func (r *Result) MarshalJSON() ([]byte, error) {
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	j := jsonResult{
		Addr:              r.Addr,
		Domain:            r.Domain,
		Descriptors:       r.Descriptors,
		KeySpace:          r.KeySpace,
		Concurrency:       r.Concurrency,
		Conns:             r.Conns,
		Requests:          r.Requests,
		ElapsedSeconds:    r.Elapsed.Seconds(),
		WindowSeconds:     r.Window.Seconds(),
		InWindow:          r.InWindow,
		RequestsPerSecond: r.RPS(),
		LatencyUS: jsonLatency{
			Min: us(r.Latency.Min), Mean: us(r.Latency.Mean), P50: us(r.Latency.P50), P90: us(r.Latency.P90),
			P99: us(r.Latency.P99), P999: us(r.Latency.P999), Max: us(r.Latency.Max),
		},
		OK:        r.OK,
		OverLimit: r.OverLimit,
		Unknown:   r.Unknown,
		Errors:    map[string]uint64{},
	}
	for c, n := range r.Errors {
		j.Errors[c.String()] = n
	}
	return json.Marshal(j)
}
