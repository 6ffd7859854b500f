package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimit/harness"
	"github.com/ratelimitd/ratelimit/src/limiter"
	"github.com/ratelimitd/ratelimit/src/live"
	"github.com/ratelimitd/ratelimit/src/rules"
)

var epoch = time.Unix(1_699_999_980, 0)

const testRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /login
    descriptors:
      - key: ip
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 8}
`

// fixture is a Handler over a recorder with testRules, on a real server.
type fixture struct {
	rec *live.Recorder
	h   *Handler
	srv *httptest.Server
	cfg *rules.Config
	// clock is the recorder's, read by the handler's goroutines too.
	clock atomic.Int64
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	f := &fixture{}
	f.clock.Store(epoch.UnixNano())
	f.rec = live.New(live.Config{Now: f.now})
	c, err := rules.Parse([]rules.File{{Name: "t.yaml", Data: []byte(testRules)}}, rules.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = c
	f.rec.SetRules(c)
	cfg.Live = f.rec
	if cfg.Source == nil {
		cfg.Source = func() Source {
			return Source{Kind: "files", Location: "/etc/rl", Version: "sha256:0123", LoadedAt: epoch,
				LastError: "rules: t.yaml:3: bad", LastErrorAt: epoch.Add(time.Second)}
		}
	}
	if cfg.Store == nil {
		cfg.Store = func() Store {
			return Store{Backend: "redis", Healthy: true, Breakers: &Breakers{Open: 1, Trips: 2, Rejections: 3}}
		}
	}
	f.h = New(cfg)
	f.srv = httptest.NewServer(f.h)
	t.Cleanup(f.srv.Close)
	t.Cleanup(f.h.Close)
	return f
}

func (f *fixture) now() time.Time { return time.Unix(0, f.clock.Load()) }

func (f *fixture) limit(key string) *rules.Limit {
	for _, l := range f.cfg.Limits() {
		if l.FullKey == key {
			return l
		}
	}
	panic(key)
}

// over records a decision over the limit that crossed it (never sampled
// out) for user=value.
func (f *fixture) over(value string) {
	st := limiter.Status{Code: limiter.OverLimit, ResetAfter: 20 * time.Second, Counts: limiter.Counts{TotalHits: 1, OverLimit: 1, NearLimit: 1}}
	f.rec.Observe("api", []rules.Entry{{Key: "user", Value: value}}, f.limit("api.user"), &st, f.now())
}

func (f *fixture) tick() {
	f.clock.Add(int64(time.Second))
	f.rec.Tick(f.now())
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, b := get(t, url)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %s %s: %s", url, resp.Status, resp.Header.Get("Content-Type"), b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

func TestRulesDocument(t *testing.T) {
	f := newFixture(t, Config{})
	var doc rulesDoc
	getJSON(t, f.srv.URL+"/api/v1/rules", &doc)
	if doc.Version != 1 || doc.Source == nil || doc.Source.Location != "/etc/rl" || doc.LastError == nil || doc.LastError.Error != "rules: t.yaml:3: bad" {
		t.Fatalf("rules document header: %+v %+v %+v", doc, doc.Source, doc.LastError)
	}
	if len(doc.Domains) != 1 || doc.Domains[0].Domain != "api" || len(doc.Domains[0].Rules) != 2 {
		t.Fatalf("domains: %+v", doc.Domains)
	}
	got := doc.Domains[0].Rules[0]
	want := ruleDoc{
		ID: "api.path_/login.ip", Chain: []string{"path_/login", "ip"}, Source: "t.yaml:9",
		limitDoc:   limitDoc{RequestsPerUnit: 5, Unit: "SECOND", UnitMultiplier: 1, WindowSeconds: 1, Algorithm: "token_bucket", Burst: 8},
		ShadowMode: true, Tracked: true,
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("rule\n%+v\nwant\n%+v", got, want)
	}
}

func TestTrafficAndTopKeys(t *testing.T) {
	f := newFixture(t, Config{})
	f.rec.Tick(f.now())
	f.over("<script>alert(1)</script>")
	f.over("bob")
	f.tick()

	var tr trafficDoc
	getJSON(t, f.srv.URL+"/api/v1/traffic?seconds=3", &tr)
	if tr.End != f.now().Unix() || tr.Seconds != 3 || fmt.Sprint(tr.Rules["api.user"].Decisions) != "[0 0 2]" ||
		fmt.Sprint(tr.Totals.OverLimit) != "[0 0 2]" || tr.Store.Backend != "redis" || tr.Store.Breakers == nil || tr.Store.Breakers.Open != 1 {
		t.Fatalf("traffic: %+v", tr)
	}

	resp, b := get(t, f.srv.URL+"/api/v1/topkeys?n=1&domain=api")
	if strings.Contains(string(b), "<script>") {
		t.Fatalf("a request value left unescaped in JSON: %s", b)
	}
	var top topKeysDoc
	if err := json.Unmarshal(b, &top); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("topkeys: %v %s", err, b)
	}
	if top.Capacity != live.DefaultMaxKeys || len(top.Domains) != 1 || len(top.Domains[0].Keys) != 1 {
		t.Fatalf("topkeys: %+v", top)
	}
	k := top.Domains[0].Keys[0]
	if k.Rule != "api.user" || !k.Over || k.Used != 10 || k.Capacity != 10 || k.Limit.Unit != "MINUTE" || k.Entries[0].Key != "user" {
		t.Fatalf("top key: %+v", k)
	}
	getJSON(t, f.srv.URL+"/api/v1/topkeys?domain=other", &top)
	if len(top.Domains) != 0 {
		t.Fatalf("another domain's keys: %+v", top)
	}
}

// TestUnmatchedDocument: /api/v1/unmatched lists the unknown domains and
// the key chains that matched no rule, with an example whose values are
// shown as LIVE_VIEW_VALUES says, and the stream's events carry it.
func TestUnmatchedDocument(t *testing.T) {
	f := newFixture(t, Config{Values: HashedValues})
	for range 3 {
		f.rec.UnknownDomain("<b>wbe</b>")
	}
	f.rec.NoRule("api", []rules.Entry{{Key: "usr", Value: "alice"}})
	resp, b := get(t, f.srv.URL+"/api/v1/unmatched?n=5")
	if resp.StatusCode != http.StatusOK || strings.Contains(string(b), "<b>") || strings.Contains(string(b), "alice") {
		t.Fatalf("unmatched: %s: %s (markup unescaped, or a value shown with LIVE_VIEW_VALUES=hashed)", resp.Status, b)
	}
	var doc unmatchedDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Capacity.Domains != live.MaxUnknownDomains || doc.Capacity.Keys != live.MaxUnmatchedKeys || doc.Values != "hashed" ||
		len(doc.Domains) != 1 || doc.Domains[0].Domain != "<b>wbe</b>" || doc.Domains[0].Count != 3 {
		t.Fatalf("unmatched document: %+v", doc)
	}
	if len(doc.Keys) != 1 || fmt.Sprint(doc.Keys[0].Keys) != "[usr]" || doc.Keys[0].Example[0].Key != "usr" ||
		!strings.HasPrefix(doc.Keys[0].Example[0].Value, "#") {
		t.Fatalf("unmatched keys: %+v", doc.Keys)
	}
	_, next := stream(t, t.Context(), f.srv.URL)
	var ev streamDoc
	if err := json.Unmarshal([]byte(next()), &ev); err != nil || len(ev.Unmatched.Domains) != 1 || len(ev.Unmatched.Keys) != 1 {
		t.Fatalf("stream event's unmatched: %+v, %v", ev.Unmatched, err)
	}
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t, Config{})
	for _, tt := range []struct {
		path string
		want int
	}{
		{"/api/v1/topkeys?n=0", http.StatusBadRequest},
		{"/api/v1/topkeys?n=101", http.StatusBadRequest},
		{"/api/v1/topkeys?n=x", http.StatusBadRequest},
		{"/api/v1/traffic?seconds=301", http.StatusBadRequest},
		{"/api/v1/unmatched?n=0", http.StatusBadRequest},
		{"/api/v1/unmatched?n=101", http.StatusBadRequest},
		{"/api/v1/nope", http.StatusNotFound},
		{"/api/v2/rules", http.StatusNotFound},
		{"/ui/nope.js", http.StatusNotFound},
	} {
		resp, b := get(t, f.srv.URL+tt.path)
		if resp.StatusCode != tt.want {
			t.Errorf("GET %s = %s, want %d: %s", tt.path, resp.Status, tt.want, b)
		}
	}
	resp, err := http.Post(f.srv.URL+"/api/v1/rules", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /api/v1/rules = %s, want 405", resp.Status)
	}
}

func TestPageIsSelfContained(t *testing.T) {
	f := newFixture(t, Config{})
	resp, b := get(t, f.srv.URL+"/ui/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/ui/: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
	// Nothing from elsewhere: every file the page names is its own.
	total := len(b)
	for _, name := range []string{"app.js", "app.css"} {
		if !strings.Contains(string(b), `"`+name+`"`) {
			t.Fatalf("index.html does not load %s", name)
		}
		r, body := get(t, f.srv.URL+"/ui/"+name)
		if r.StatusCode != http.StatusOK {
			t.Fatalf("/ui/%s: %s", name, r.Status)
		}
		total += len(body)
		b = append(b, body...)
	}
	for _, bad := range []string{"http://", "https://", "//cdn", "@import", "innerHTML", "eval("} {
		if strings.Contains(string(b), bad) {
			t.Errorf("the page holds %q", bad)
		}
	}
	if total > 64<<10 {
		t.Errorf("the page weighs %d bytes; keep it small", total)
	}
	r, _ := get(t, f.srv.URL+"/ui")
	if r.Request.URL.Path != "/ui/" {
		t.Errorf("/ui led to %s", r.Request.URL.Path)
	}
}

// stream opens /api/v1/stream and returns its status and a reader of its
// events' data lines.
func stream(t *testing.T, ctx context.Context, url string) (*http.Response, func() string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	r := bufio.NewReader(resp.Body)
	return resp, func() string {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return ""
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				return data
			}
		}
	}
}

func TestStreamSendsEachSecond(t *testing.T) {
	f := newFixture(t, Config{})
	resp, next := stream(t, t.Context(), f.srv.URL)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	var ev streamDoc
	if err := json.Unmarshal([]byte(next()), &ev); err != nil || ev.End != 0 || ev.RulesVersion != 1 || ev.LoadErrorAt != "2023-11-14T22:13:01Z" {
		t.Fatalf("first event: %+v, %v", ev, err)
	}
	f.rec.Tick(f.now())
	f.over("alice")
	f.tick()
	for ev.End != f.now().Unix() {
		if err := json.Unmarshal([]byte(next()), &ev); err != nil {
			t.Fatal(err)
		}
	}
	if ev.Rules["api.user"] != [3]uint32{1, 1, 0} || ev.Totals != [5]uint32{1, 1, 0, 0, 0} || len(ev.TopKeys.Domains) != 1 || ev.Store.Backend != "redis" {
		t.Fatalf("event: %+v", ev)
	}
	if _, ok := ev.Rules["api.path_/login.ip"]; ok {
		t.Fatal("a rule without decisions in the event")
	}
}

func TestStreamClientsAreBounded(t *testing.T) {
	f := newFixture(t, Config{MaxStreams: 2})
	ctx, cancel := context.WithCancel(t.Context())
	for range 2 {
		resp, next := stream(t, ctx, f.srv.URL)
		if resp.StatusCode != http.StatusOK || next() == "" {
			t.Fatalf("stream: %s", resp.Status)
		}
	}
	resp, b := get(t, f.srv.URL+"/api/v1/stream")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a third stream: %s %s", resp.Status, b)
	}
	// A client gone frees its place.
	cancel()
	harness.WaitFor(t, 5*time.Second, "the places of closed streams freed", func() bool {
		resp, next := stream(t, t.Context(), f.srv.URL)
		return resp.StatusCode == http.StatusOK && next() != ""
	})
}

// TestSlowStreamReaderIsDropped: a client that never reads fills its
// connection's buffers; its writes then time out and it is dropped, while
// another client keeps getting every second.
func TestSlowStreamReaderIsDropped(t *testing.T) {
	f := newFixture(t, Config{MaxStreams: 2, WriteTimeout: 200 * time.Millisecond})
	// Large events: ten keys of 256 bytes.
	f.rec.Tick(f.now())
	for i := range 10 {
		f.over(fmt.Sprint(i, strings.Repeat("x", 300)))
	}
	conn, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	fmt.Fprintf(conn, "GET /api/v1/stream HTTP/1.1\r\nHost: x\r\n\r\n") // and never reads
	_, next := stream(t, t.Context(), f.srv.URL)
	next()

	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		f.over(fmt.Sprint(i%10, strings.Repeat("x", 300)))
		f.tick()
		// The reading client gets this second's event.
		var ev streamDoc
		for ev.End != f.now().Unix() {
			data := next()
			if data == "" {
				t.Fatal("the reading client's stream ended")
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
		}
		// Once the slow client is dropped, its place is free again.
		if len(f.h.streams) < 2 {
			t.Logf("the client that does not read was dropped after %d events", i+1)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client that does not read still holds its place after %d events", i)
		}
	}
}

func TestCloseEndsStreams(t *testing.T) {
	f := newFixture(t, Config{})
	_, next := stream(t, t.Context(), f.srv.URL)
	if next() == "" {
		t.Fatal("no first event")
	}
	f.h.Close()
	if data := next(); data != "" {
		t.Fatalf("an event after Close: %s", data)
	}
}

func TestQuotaDocument(t *testing.T) {
	off := newFixture(t, Config{})
	var doc map[string]any
	getJSON(t, off.srv.URL+"/api/v1/quota", &doc)
	if doc["enabled"] != false {
		t.Errorf("/api/v1/quota with no quota service = %v, want enabled false", doc)
	}
	on := newFixture(t, Config{Quota: func() any {
		return map[string]any{"enabled": true, "rules": []map[string]any{{"domain": "web", "rule": "per-tenant"}}}
	}})
	getJSON(t, on.srv.URL+"/api/v1/quota", &doc)
	if doc["enabled"] != true || len(doc["rules"].([]any)) != 1 {
		t.Errorf("/api/v1/quota = %v, want the service's document", doc)
	}
}
