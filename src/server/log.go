package server

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"google.golang.org/grpc/grpclog"
)

// NewLogger returns the process logger for LOG_LEVEL and LOG_FORMAT
// ("json" or "text"). It also routes grpc-go's own log lines through it, so
// that with LOG_FORMAT=json every line the process prints is JSON.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	switch strings.ToUpper(level) {
	case "TRACE", "DEBUG":
		lv = slog.LevelDebug
	case "INFO":
		lv = slog.LevelInfo
	case "WARN", "WARNING":
		lv = slog.LevelWarn
	default: // ERROR, FATAL, PANIC
		lv = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	if strings.EqualFold(format, "json") {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	l := slog.New(h)
	grpclog.SetLoggerV2(grpcLogger{l: l.With("component", "grpc")})
	return l
}

// grpcLogger adapts slog to grpclog.LoggerV2. grpc-go's info lines are
// chatty connection-state messages, so they go out at debug level.
type grpcLogger struct{ l *slog.Logger }

func (g grpcLogger) Info(args ...any)                 { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any)               { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infof(format string, args ...any) { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Warning(args ...any)              { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)            { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.l.Warn(fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)               { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Fatal(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)               { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) V(l int) bool                      { return l <= 0 }
