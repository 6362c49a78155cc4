package testlog

import (
	"log/slog"
	"strings"
	"testing"
)

// TestStrict checks the strict decoder on lines a JSON handler writes and on the duplicates it
// must refuse, at the top level and inside groups and arrays.
func TestStrict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line string
		bad  string // the error's text, "" for a line that passes
	}{
		{line: `{"time":"2026-01-01T00:00:00Z","level":"INFO","msg":"m","topic":"t","partition":1}`},
		{line: `{"a":{"b":1},"c":{"b":2},"d":[{"b":1},{"b":1}]}`},
		{line: `{"topic":"t","partition":1,"topic":"t"}`, bad: `$: key "topic" twice`},
		{line: `{"config":{"A":1,"A":2}}`, bad: `$.config: key "A" twice`},
		{line: `{"list":[{"k":1,"k":1}]}`, bad: `$.list[0]: key "k" twice`},
		{line: `{"a":1} {"b":2}`, bad: "more than one JSON value"},
		{line: `{"a":`, bad: "$.a"},
		{line: `not json`, bad: "$"},
	} {
		err := Strict([]byte(tc.line))
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("Strict(%s) = %v, want nil", tc.line, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("Strict(%s) = %v, want an error with %q", tc.line, err, tc.bad)
		}
	}
}

// TestNewChecksKeys checks that a logger of New fails its test for a line with a key twice — the
// same attribute added by With and by the call — and not for one without.
func TestNewChecksKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		log  func(*slog.Logger)
		fail bool
	}{
		{"Distinct", func(l *slog.Logger) { l.With("topic", "t").Info("m", "partition", 1) }, false},
		{"Group", func(l *slog.Logger) { l.WithGroup("g").With("topic", "t").Info("m", "topic", "t") }, true},
		{"WithTwice", func(l *slog.Logger) { l.With("topic", "t").With("topic", "t").Info("m") }, true},
		{"WithAndCall", func(l *slog.Logger) { l.With("partition", 1).Info("m", "partition", 1) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &recordingTB{TB: t}
			tc.log(New(rec))
			if rec.failed != tc.fail {
				t.Errorf("the test failed: %v, want %v (%q)", rec.failed, tc.fail, rec.errors)
			}
		})
	}
}

// recordingTB is a testing.TB whose Errorf is recorded rather than failing the real test.
type recordingTB struct {
	testing.TB
	failed bool
	errors []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.failed = true
	r.errors = append(r.errors, format)
}
