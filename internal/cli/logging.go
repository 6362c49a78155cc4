package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kfake"
)

// newLogger returns the process's logger: JSON lines by default, text for people.
func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// kfakeLogger routes the embedded broker's logs to logger at debug and below.
type kfakeLogger struct{ logger *slog.Logger }

func (l kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	lvl := slog.LevelDebug
	if level == kfake.LogLevelError {
		lvl = slog.LevelWarn
	}
	ctx := context.Background()
	if !l.logger.Enabled(ctx, lvl) {
		return
	}
	l.logger.LogAttrs(ctx, lvl, "broker: "+fmt.Sprintf(format, args...), slog.String("component", "kfake"))
}
