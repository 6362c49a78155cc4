package cli

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/settings"
)

// TestLoggerDurations checks that the JSON logs give durations as Go's duration strings ("1.75s"),
// not as bare nanoseconds, at the top level, in a group and from With; and that the text format is
// left as it is.
func TestLoggerDurations(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := newLogger(&Config{Config: &settings.Config{LogFormat: "json", LogLevel: slog.LevelInfo}}, &buf)
	logger.With("timeout", 30*time.Second).Info("m", "delay", 1750*time.Millisecond,
		slog.Group("g", slog.Duration("took", 2*time.Millisecond)), "n", 7)
	var entry map[string]any
	if err := json.Unmarshal(buf.Bytes(), &entry); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	g, _ := entry["g"].(map[string]any)
	for key, got := range map[string]any{"timeout": entry["timeout"], "delay": entry["delay"], "g.took": g["took"]} {
		want := map[string]string{"timeout": "30s", "delay": "1.75s", "g.took": "2ms"}[key]
		if got != want {
			t.Errorf("%s = %#v, want %q: %s", key, got, want, buf.Bytes())
		}
	}
	if entry["n"] != 7.0 {
		t.Errorf("n = %#v, want the number 7", entry["n"])
	}

	buf.Reset()
	newLogger(&Config{Config: &settings.Config{LogFormat: "text", LogLevel: slog.LevelInfo}}, &buf).Info("m", "delay", 1750*time.Millisecond)
	if !strings.Contains(buf.String(), "delay=1.75s") {
		t.Errorf("text line %q has no delay=1.75s", buf.String())
	}
}
