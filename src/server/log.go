package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/grpclog"
)

// The keys and formats of a JSON line are envoyproxy/ratelimit's: it logs
// with logrus's JSON formatter, renaming time and msg to @timestamp and
// @message, with RFC 3339 timestamps to the nanosecond and logrus's level
// names. Log pipelines built for it key on them.
const (
	jsonTimeKey    = "@timestamp"
	jsonMessageKey = "@message"
	jsonLevelKey   = "level"
)

// NewLogger returns the process logger for LOG_LEVEL and LOG_FORMAT
// ("json" or "text", in any case). It also routes grpc-go's own log lines
// through it, so that with LOG_FORMAT=json every line the process prints
// is JSON.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	l := slog.New(newHandler(w, level, format))
	grpclog.SetLoggerV2(grpcLogger{l: l.With("component", "grpc")})
	return l
}

// newHandler is the handler behind NewLogger.
func newHandler(w io.Writer, level, format string) slog.Handler {
	opts := &slog.HandlerOptions{Level: parseLevel(level)}
	if !strings.EqualFold(format, "json") {
		return slog.NewTextHandler(w, opts)
	}
	opts.ReplaceAttr = anchorBuiltins
	return anchorHandler{h: slog.NewJSONHandler(w, opts)}
}

// parseLevel reads LOG_LEVEL, in any case, as logrus's ParseLevel does.
// There are no trace lines, so TRACE is DEBUG; FATAL and PANIC are ERROR.
func parseLevel(level string) slog.Level {
	switch strings.ToUpper(level) {
	case "TRACE", "DEBUG":
		return slog.LevelDebug
	case "INFO":
		return slog.LevelInfo
	case "WARN", "WARNING":
		return slog.LevelWarn
	default: // ERROR, FATAL, PANIC
		return slog.LevelError
	}
}

// levelName is logrus's name of a level ("warning", not "WARN").
func levelName(l slog.Level) string {
	switch {
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warning"
	default:
		return "error"
	}
}

// anchorBuiltins renames slog's built-in time, level and msg attributes
// and formats their values as envoyproxy/ratelimit does. It can tell them
// by their keys alone because anchorHandler renames the line's own
// attributes that carry those keys.
func anchorBuiltins(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		if a.Value.Kind() == slog.KindTime {
			return slog.String(jsonTimeKey, a.Value.Time().Format(time.RFC3339Nano))
		}
	case slog.LevelKey:
		if l, ok := a.Value.Any().(slog.Level); ok {
			return slog.String(jsonLevelKey, levelName(l))
		}
	case slog.MessageKey:
		a.Key = jsonMessageKey
	}
	return a
}

// anchorHandler wraps the JSON handler so that no line has a key twice:
// an attribute whose key is one of the line's own (the names before and
// after anchorBuiltins) becomes fields.<key>, as logrus renames a field
// that clashes with its own keys.
type anchorHandler struct {
	h slog.Handler
	// grouped says a group is open: attributes nest in it and cannot clash.
	grouped bool
}

func (a anchorHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return a.h.Enabled(ctx, l)
}

func (a anchorHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if !a.grouped {
		renamed := make([]slog.Attr, len(attrs))
		for i, at := range attrs {
			renamed[i] = renameClash(at)
		}
		attrs = renamed
	}
	return anchorHandler{h: a.h.WithAttrs(attrs), grouped: a.grouped}
}

func (a anchorHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return a
	}
	return anchorHandler{h: a.h.WithGroup(name), grouped: true}
}

func (a anchorHandler) Handle(ctx context.Context, r slog.Record) error {
	if a.grouped || !recordClashes(r) {
		return a.h.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(at slog.Attr) bool {
		out.AddAttrs(renameClash(at))
		return true
	})
	return a.h.Handle(ctx, out)
}

// clashes reports whether a top-level key is one of a line's own.
func clashes(key string) bool {
	switch key {
	case slog.TimeKey, slog.LevelKey, slog.MessageKey, jsonTimeKey, jsonMessageKey:
		return true
	}
	return false
}

// recordClashes reports whether any attribute of r needs renaming, so
// that the usual line is passed on without a copy.
func recordClashes(r slog.Record) bool {
	found := false
	r.Attrs(func(at slog.Attr) bool {
		found = attrClashes(at)
		return !found
	})
	return found
}

func attrClashes(at slog.Attr) bool {
	if at.Key != "" {
		return clashes(at.Key)
	}
	// A group without a key is inlined: its members are top-level.
	v := at.Value.Resolve()
	return v.Kind() == slog.KindGroup && slices.ContainsFunc(v.Group(), attrClashes)
}

func renameClash(at slog.Attr) slog.Attr {
	if at.Key != "" {
		if clashes(at.Key) {
			at.Key = "fields." + at.Key
		}
		return at
	}
	v := at.Value.Resolve()
	if v.Kind() != slog.KindGroup {
		return at
	}
	members := v.Group()
	renamed := make([]slog.Attr, len(members))
	for i, m := range members {
		renamed[i] = renameClash(m)
	}
	return slog.Attr{Value: slog.GroupValue(renamed...)}
}

// grpcLogger adapts slog to grpclog.LoggerV2. grpc-go's info lines are
// chatty connection-state messages, so they go out at debug level.
type grpcLogger struct{ l *slog.Logger }

func (g grpcLogger) Info(args ...any)                    { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any)                  { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infof(format string, args ...any)    { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Warning(args ...any)                 { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)               { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) { g.l.Warn(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Error(args ...any)                   { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorf(format string, args ...any)   { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Fatal(args ...any)                   { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any)   { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) V(l int) bool                        { return l <= 0 }
