package consumer

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestRepeats: a thing is said the first time, then at most once per interval with how many
// times it happened unsaid; another thing is said on its own; a forgotten thing is new again.
func TestRepeats(t *testing.T) {
	t.Parallel()
	r := repeats{interval: time.Minute}
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	steps := []struct {
		what  string
		at    time.Duration
		ok    bool
		since int
	}{
		{"commit", 0, true, 0},
		{"commit", time.Second, false, 0},
		{"commit", 2 * time.Second, false, 0},
		{"fetch", 3 * time.Second, true, 0},
		{"commit", 59 * time.Second, false, 0},
		{"commit", 60 * time.Second, true, 3},
		{"commit", 61 * time.Second, false, 0},
		{"commit", 3 * time.Minute, true, 1},
	}
	for i, s := range steps {
		if ok, since := r.say(s.what, t0.Add(s.at)); ok != s.ok || since != s.since {
			t.Errorf("step %d: say(%q) at %s = %v, %d; want %v, %d", i, s.what, s.at, ok, since, s.ok, s.since)
		}
	}
	r.forget("commit")
	if ok, since := r.say("commit", t0.Add(3*time.Minute+time.Second)); !ok || since != 0 {
		t.Errorf("say after forget = %v, %d; want true, 0", ok, since)
	}
}

// TestKafkaErrorLogger: a rebalance kafka-go reports as a failed sync is no warning; any other of
// its errors is said once, not once per occurrence, its error an attribute out of the message.
func TestKafkaErrorLogger(t *testing.T) {
	t.Parallel()
	logger, logs := testlog.Capture(t)
	l := kafkaErrorLogger(logger)
	for range 3 {
		l.Printf("Failed to sync group %s: %v", "g", kafka.RebalanceInProgress)
		l.Printf("Failed to join group %s: %v", "g", fmt.Errorf("dial tcp 127.0.0.1:%d: connection refused", 9092))
	}
	var warnings, debug []testlog.Record
	for _, r := range logs.All() {
		switch r.Level {
		case slog.LevelWarn:
			warnings = append(warnings, r)
		case slog.LevelDebug:
			debug = append(debug, r)
		}
	}
	if len(warnings) != 1 || len(debug) != 3 {
		t.Fatalf("%d warnings and %d debug lines, want 1 (the failed join, once) and 3 (the rebalance)", len(warnings), len(debug))
	}
	if w := warnings[0]; w.Message != "Failed to join group g" || !strings.Contains(w.Attrs["error"].String(), "connection refused") {
		t.Errorf("warning %q with error %q, want the message without its error, and the error as an attribute",
			w.Message, w.Attrs["error"])
	}
}
