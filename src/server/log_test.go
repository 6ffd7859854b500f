package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// topKeys returns the keys of a JSON object in their order, duplicates
// included (decoding into a map would hide them), and the object.
func topKeys(t *testing.T, line string) ([]string, map[string]any) {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal([]byte(line), &obj); err != nil {
		t.Fatalf("not a JSON object: %q: %v", line, err)
	}
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys, obj
}

// lines splits what a logger wrote into its lines.
func lines(buf *bytes.Buffer) []string {
	return strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
}

// checkTimestamp checks an @timestamp value: RFC 3339 to the nanosecond
// (trailing zeros trimmed), as envoyproxy/ratelimit writes it.
func checkTimestamp(t *testing.T, v any) {
	t.Helper()
	s, _ := v.(string)
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("@timestamp %q: %v", s, err)
	}
	if got := ts.Format(time.RFC3339Nano); got != s {
		t.Errorf("@timestamp %q is not in RFC 3339 nano format (%q)", s, got)
	}
	if d := time.Since(ts); d < 0 || d > time.Hour {
		t.Errorf("@timestamp %q is %v from now", s, d)
	}
}

func TestJSONLogLine(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(newHandler(&buf, "debug", "json"))
	l.With("component", "server").Warn("rules reload failed", "err", errors.New("rules: a.yaml:3: bad"), "domains", []string{"a", "b"})

	keys, obj := topKeys(t, buf.String())
	slices.Sort(keys)
	if want := []string{"@message", "@timestamp", "component", "domains", "err", "level"}; !slices.Equal(keys, want) {
		t.Errorf("keys = %q, want %q", keys, want)
	}
	checkTimestamp(t, obj["@timestamp"])
	if obj["@message"] != "rules reload failed" || obj["level"] != "warning" || obj["err"] != "rules: a.yaml:3: bad" || obj["component"] != "server" {
		t.Errorf("line = %v", obj)
	}
}

func TestJSONLogLevels(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(newHandler(&buf, "DEBUG", "JSON"))
	l.Debug("d")
	l.Info("i")
	l.Warn("w")
	l.Error("e")
	var got []string
	for _, line := range lines(&buf) {
		_, obj := topKeys(t, line)
		got = append(got, obj["level"].(string))
	}
	if want := []string{"debug", "info", "warning", "error"}; !slices.Equal(got, want) {
		t.Errorf("levels = %q, want logrus's names %q", got, want)
	}
}

// TestJSONLogClashes logs attributes named like the line's own keys: each
// key appears once, the attribute renamed fields.<key> as logrus does.
func TestJSONLogClashes(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(newHandler(&buf, "info", "json")).With("level", "w1", "@timestamp", "w2")
	l.Info("m", "msg", "a1", "@message", "a2", slog.Group("", "time", "a3"))
	l.WithGroup("g").Info("m", "level", "nested")

	ls := lines(&buf)
	keys, obj := topKeys(t, ls[0])
	slices.Sort(keys)
	want := []string{"@message", "@timestamp", "fields.@message", "fields.@timestamp", "fields.level", "fields.msg", "fields.time", "level"}
	if !slices.Equal(keys, want) {
		t.Errorf("keys = %q, want %q", keys, want)
	}
	if obj["@message"] != "m" || obj["level"] != "info" || obj["fields.msg"] != "a1" || obj["fields.@message"] != "a2" ||
		obj["fields.time"] != "a3" || obj["fields.level"] != "w1" || obj["fields.@timestamp"] != "w2" {
		t.Errorf("line = %v", obj)
	}
	checkTimestamp(t, obj["@timestamp"])

	keys, obj = topKeys(t, ls[1])
	slices.Sort(keys)
	if want := []string{"@message", "@timestamp", "fields.@timestamp", "fields.level", "g", "level"}; !slices.Equal(keys, want) {
		t.Errorf("grouped line keys = %q, want %q", keys, want)
	}
	if g, _ := obj["g"].(map[string]any); g["level"] != "nested" {
		t.Errorf("grouped line = %v, want g.level nested", obj)
	}
}

// TestGRPCLogLinesAreJSON checks grpc-go's lines, routed through slog, in
// the anchor's format.
func TestGRPCLogLinesAreJSON(t *testing.T) {
	var buf bytes.Buffer
	g := grpcLogger{l: slog.New(newHandler(&buf, "info", "Json")).With("component", "grpc")}
	g.Warningf("transport: %s", "closing")
	g.Info("connectivity") // debug: not printed at info
	g.Errorln("failed")

	ls := lines(&buf)
	if len(ls) != 2 {
		t.Fatalf("lines = %q, want the warning and the error", ls)
	}
	for i, want := range []string{"warning", "error"} {
		keys, obj := topKeys(t, ls[i])
		slices.Sort(keys)
		if wantKeys := []string{"@message", "@timestamp", "component", "level"}; !slices.Equal(keys, wantKeys) {
			t.Errorf("line %d keys = %q, want %q", i, keys, wantKeys)
		}
		if obj["level"] != want || obj["component"] != "grpc" {
			t.Errorf("line %d = %v, want level %s from grpc", i, obj, want)
		}
		checkTimestamp(t, obj["@timestamp"])
	}
}

func TestLogFormatAndLevelAnyCase(t *testing.T) {
	tests := []struct {
		level, format string
		wantJSON      bool
		wantInfo      bool
	}{
		{"info", "json", true, true},
		{"Info", "JSON", true, true},
		{"WARNING", "Json", true, false},
		{"warn", "text", false, false},
		{"Debug", "TEXT", false, true},
		{"trace", "json", true, true},
		{"error", "json", true, false},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		l := slog.New(newHandler(&buf, tt.level, tt.format))
		l.Info("i")
		l.Error("e")
		ls := lines(&buf)
		if got := len(ls) == 2; got != tt.wantInfo {
			t.Errorf("LOG_LEVEL=%s: info printed = %v, want %v", tt.level, got, tt.wantInfo)
		}
		if got := json.Valid([]byte(ls[0])); got != tt.wantJSON {
			t.Errorf("LOG_FORMAT=%s: line %q JSON = %v, want %v", tt.format, ls[0], got, tt.wantJSON)
		}
	}
}
