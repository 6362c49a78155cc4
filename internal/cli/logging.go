package cli

import (
	"io"
	"log/slog"
)

// newLogger returns the process's logger: JSON lines by default, text for people. In JSON, a
// duration is its Go string ("1.75s"), as in the text format, rather than slog's bare count of
// nanoseconds, which a reader of the line has no unit for.
func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	opts.ReplaceAttr = durationString
	return slog.New(slog.NewJSONHandler(w, opts))
}

// durationString is a ReplaceAttr that writes durations as strings.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
