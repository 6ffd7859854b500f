package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/rules"
)

// syncBuffer is a buffer safe for the writer and a reader.
type syncBuffer struct{ harness.Log }

func (s *syncBuffer) bytes() []byte { return []byte(s.String()) }

func request(domain, user string, at time.Time) *Request {
	return &Request{Time: at, Domain: domain, Descriptors: []Descriptor{{Entries: []rules.Entry{{Key: "user", Value: user}}}}, Codes: []bool{false}}
}

// started waits until r runs a capture: Run stores it before it waits.
func started(t *testing.T, r *Recorder) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, "the capture started", r.Active)
}

// readAll reads a capture whole.
func readAll(t *testing.T, b []byte) (Header, []Request, *Summary) {
	t.Helper()
	rd, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var reqs []Request
	for {
		var req Request
		err := rd.Next(&req)
		if err == io.EOF {
			return rd.Header(), reqs, rd.Summary()
		}
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, req)
	}
}

// TestRunRecordsUntilItsBound: nothing is recorded outside a capture; a
// capture records the requests of its domain, concurrent ones included,
// until it has as many as asked, then stops recording; a second capture
// while one runs is refused.
func TestRunRecordsUntilItsBound(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	if r.Active() {
		t.Fatal("active before any capture")
	}
	r.Record(request("web", "before", time.Unix(1, 0)))

	var out syncBuffer
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := r.Run(t.Context(), Options{Seconds: MaxSeconds, Requests: 400, Domain: "web"}, &out, nil)
		done <- result{sum, err}
	}()
	started(t, r)
	if _, err := r.Run(t.Context(), Options{Seconds: 1, Requests: 1}, io.Discard, nil); !errors.Is(err, ErrBusy) {
		t.Errorf("a second capture: %v, want ErrBusy", err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				r.Record(request("web", "u"+strconv.Itoa(g)+"-"+strconv.Itoa(i), time.Unix(2, 0)))
				r.Record(request("other", "x", time.Unix(2, 0)))
			}
		})
	}
	wg.Wait()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.sum.Requests != 400 || res.sum.Reason != "requests" || res.sum.Dropped != 0 {
		t.Errorf("summary %+v, want 400 requests, ended by its bound", res.sum)
	}
	if r.Active() {
		t.Error("still active after the capture")
	}
	h, reqs, sum := readAll(t, out.bytes())
	if h.Domain != "web" || h.Requests != 400 || len(reqs) != 400 || sum == nil || sum.Requests != 400 {
		t.Fatalf("capture: header %+v, %d requests, summary %+v", h, len(reqs), sum)
	}
	seen := map[string]bool{}
	for _, q := range reqs {
		if q.Domain != "web" || q.Descriptors[0].Entries[0].Value == "before" {
			t.Fatalf("recorded %+v: another domain's, or from before the capture", q)
		}
		seen[q.Descriptors[0].Entries[0].Value] = true
	}
	if len(seen) != 400 {
		t.Errorf("%d distinct requests of 400", len(seen))
	}
}

// TestRunEndsAtItsBytes: a capture stops at Config.MaxBytes.
func TestRunEndsAtItsBytes(t *testing.T) {
	t.Parallel()
	line := AppendRequest(nil, request("web", "alice", time.Unix(1, 0)), nil)
	r := New(Config{MaxBytes: int64(10*len(line) + len(line)/2)})
	var out syncBuffer
	done := make(chan Summary, 1)
	go func() {
		sum, _ := r.Run(t.Context(), Options{Seconds: MaxSeconds, Requests: MaxRequests}, &out, nil)
		done <- sum
	}()
	started(t, r)
	for range 20 {
		r.Record(request("web", "alice", time.Unix(1, 0)))
	}
	if sum := <-done; sum.Requests != 10 || sum.Reason != "bytes" || sum.Bytes != int64(10*len(line)) {
		t.Errorf("summary %+v, want 10 requests, ended by its bytes", sum)
	}
}

// blockingWriter blocks every write after the first until released.
type blockingWriter struct {
	syncBuffer
	writes  int
	release chan struct{}
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	b.writes++
	if b.writes > 1 {
		<-b.release
	}
	return b.syncBuffer.Write(p)
}

// TestSlowReaderDropsRequests: a reader that does not keep up costs the
// recording no memory past its buffer: requests beyond it are dropped and
// counted, never waited for.
func TestSlowReaderDropsRequests(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	w := &blockingWriter{release: make(chan struct{})}
	done := make(chan Summary, 1)
	go func() {
		sum, _ := r.Run(t.Context(), Options{Seconds: MaxSeconds, Requests: MaxRequests}, w, nil)
		done <- sum
	}()
	started(t, r)
	big := request("web", strings.Repeat("v", 4000), time.Unix(1, 0))
	n := 2*bufferBytes/4000 + 100
	for range n {
		r.Record(big)
	}
	r.Close()
	close(w.release)
	sum := <-done
	if sum.Dropped == 0 || sum.Requests+sum.Dropped != int64(n) || sum.Reason != "shutdown" {
		t.Errorf("summary %+v, want %d requests recorded or dropped, some dropped, ended by the shutdown", sum, n)
	}
	if sum.Bytes > 2*bufferBytes {
		t.Errorf("%d bytes recorded behind a blocked reader, more than two buffers of %d", sum.Bytes, bufferBytes)
	}
	if _, reqs, s := readAll(t, w.bytes()); int64(len(reqs)) != sum.Requests || s == nil || s.Dropped != sum.Dropped {
		t.Errorf("the capture holds %d requests and summary %+v, want %+v", len(reqs), s, sum)
	}
}

// TestValuesHook: Config.Values writes the values, and the header names
// how.
func TestValuesHook(t *testing.T) {
	t.Parallel()
	r := New(Config{Values: func(v string) string { return "#" + strconv.Itoa(len(v)) }, ValuesMode: "hashed"})
	var out syncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Run(t.Context(), Options{Seconds: MaxSeconds, Requests: 1}, &out, nil)
	}()
	started(t, r)
	r.Record(request("web", "alice", time.Unix(1, 0)))
	<-done
	h, reqs, _ := readAll(t, out.bytes())
	if h.Values != "hashed" || len(reqs) != 1 || reqs[0].Descriptors[0].Entries[0] != (rules.Entry{Key: "user", Value: "#5"}) {
		t.Errorf("header %+v, requests %+v; want the values as the hook writes them", h, reqs)
	}
}

// TestHandler: the endpoint streams a capture as NDJSON, refuses bad
// parameters and methods, and a second capture while one runs.
func TestHandler(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(r.Close)
	for _, tt := range []struct {
		query string
		code  int
	}{
		{"seconds=0", http.StatusBadRequest},
		{"seconds=3601", http.StatusBadRequest},
		{"requests=abc", http.StatusBadRequest},
		{"requests=10000001", http.StatusBadRequest},
		{"domain=", http.StatusBadRequest},
		{"format=csv", http.StatusBadRequest},
		{"seconds=1&seconds=2", http.StatusBadRequest},
	} {
		resp, err := http.Get(srv.URL + "/?" + tt.query)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || body.Error == "" {
			t.Errorf("GET ?%s: %d %+v, want %d with the reason", tt.query, resp.StatusCode, body, tt.code)
		}
	}
	resp, err := http.Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/?requests=2&seconds=60", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/x-ndjson" {
		t.Fatalf("capture: %d %s", resp.StatusCode, ct)
	}
	started(t, r)
	busy, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	busy.Body.Close()
	if busy.StatusCode != http.StatusConflict {
		t.Errorf("a second capture: %d, want 409", busy.StatusCode)
	}
	r.Record(request("web", "a", time.Unix(1, 0)))
	r.Record(request("web", "b", time.Unix(2, 0)))
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if _, reqs, sum := readAll(t, body); len(reqs) != 2 || sum == nil || sum.Reason != "requests" {
		t.Errorf("capture of %d requests, summary %+v; want 2, ended by its bound", len(reqs), sum)
	}
}

// typical is the request of the benchmarks: three descriptors, plain
// values.
func typical() *Request {
	return &Request{Time: time.Unix(1_764_246_000, 0), Domain: "web", Descriptors: []Descriptor{
		{Entries: []rules.Entry{{Key: "remote_address", Value: "10.1.2.3"}}},
		{Entries: []rules.Entry{{Key: "path", Value: "/api/v1/users"}, {Key: "method", Value: "GET"}}},
		{Entries: []rules.Entry{{Key: "user", Value: "alice"}}},
	}, Codes: []bool{false, false, false}}
}

// BenchmarkRecord is the cost of Record on the service's hot path: one
// atomic load while no capture runs; the encoding and an append under a
// lock while one does.
func BenchmarkRecord(b *testing.B) {
	req := typical()
	b.Run("idle", func(b *testing.B) {
		r := New(Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if r.Active() {
					r.Record(req)
				}
			}
		})
	})
	b.Run("capturing", func(b *testing.B) {
		// No byte bound: at the default one (256 MiB, some 1.3 million of
		// these lines) the capture would end within the benchmark, and
		// the rest of it would time an idle recorder.
		r := New(Config{MaxBytes: 1 << 50})
		done := make(chan Summary, 1)
		go func() {
			sum, _ := r.Run(b.Context(), Options{Seconds: MaxSeconds, Requests: MaxRequests}, io.Discard, nil)
			done <- sum
		}()
		harness.WaitFor(b, 10*time.Second, "the capture started", r.Active)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r.Record(req)
			}
		})
		b.StopTimer()
		r.Close()
		if sum := <-done; sum.Requests+sum.Dropped+sum.TooLarge != int64(b.N) {
			b.Fatalf("%d of %d requests recorded or counted (the capture ended: %s); -benchtime at most %dx", sum.Requests+sum.Dropped+sum.TooLarge, b.N, sum.Reason, MaxRequests)
		}
	})
}
