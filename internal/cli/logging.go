package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/tracelog"
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

// pgxTracer routes pgx's own logs to logger without what they may carry of our data: statement
// arguments (payloads, phone numbers) are dropped, and the password is scrubbed from errors.
// Failed statements are logged at debug only: their callers classify and report them. Connection
// failures are warnings.
func pgxTracer(logger *slog.Logger, password string) *tracelog.TraceLog {
	level := tracelog.LogLevelWarn
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		level = tracelog.LogLevelDebug
	}
	scrub := secretScrubber(password)
	return &tracelog.TraceLog{
		LogLevel: level,
		Logger: tracelog.LoggerFunc(func(ctx context.Context, l tracelog.LogLevel, msg string, data map[string]any) {
			lvl := slog.LevelDebug
			if msg == "Connect" && l <= tracelog.LogLevelWarn {
				lvl = slog.LevelWarn
			}
			attrs := []slog.Attr{slog.String("component", "pgx")}
			for k, v := range data {
				switch k {
				case "args":
					continue
				case "err":
					attrs = append(attrs, slog.String("err", scrub(fmt.Sprint(v))))
				default:
					attrs = append(attrs, slog.Any(k, v))
				}
			}
			logger.LogAttrs(ctx, lvl, "pgx: "+msg, attrs...)
		}),
	}
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

// secretScrubber returns a function that replaces every occurrence of secret in a text.
func secretScrubber(secrets ...string) func(string) string {
	return func(s string) string {
		for _, secret := range secrets {
			if secret != "" {
				s = strings.ReplaceAll(s, secret, mask)
			}
		}
		return s
	}
}
