package redis

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

var setLoggerOnce sync.Once

// slogLogger routes go-redis's own log lines to slog at debug level. They
// report failures (a dial refused during an outage, once per attempt) that
// Do already returns, wrapped in limiter.ErrUnavailable, to the service,
// which logs and counts them; at the default level they would print one
// line per failed request. go-redis's logger is process-wide, so New sets it
// once.
type slogLogger struct{}

func (slogLogger) Printf(ctx context.Context, format string, v ...any) {
	if slog.Default().Enabled(ctx, slog.LevelDebug) {
		slog.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
	}
}

func useSlog() { setLoggerOnce.Do(func() { goredis.SetLogger(slogLogger{}) }) }
