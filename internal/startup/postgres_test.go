package startup

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/tracelog"
)

// TestPgxTracerKeepsSecretsOut checks that what pgx logs reaches our logs without statement
// arguments (payloads, phone numbers) and without the database password.
func TestPgxTracerKeepsSecretsOut(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		level slog.Level
		pgx   tracelog.LogLevel
		msg   string
		want  string // in the output; "" for nothing logged
	}{
		{"FailedConnectIsAWarning", slog.LevelInfo, tracelog.LogLevelError, "Connect", `level=WARN msg="pgx: Connect"`},
		{"FailedQueryIsDebug", slog.LevelDebug, tracelog.LogLevelError, "Query", `level=DEBUG msg="pgx: Query"`},
		{"FailedQueryHiddenAtInfo", slog.LevelInfo, tracelog.LogLevelError, "Query", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: tt.level}))
			tracer := pgxTracer(logger, "db-s3cret")
			tracer.Logger.Log(context.Background(), tt.pgx, tt.msg, map[string]any{
				"sql":  "INSERT INTO notifications VALUES ($1)",
				"args": []any{"+8613800138000"},
				"err":  errors.New("password authentication failed: db-s3cret"),
			})
			got := out.String()
			if tt.want == "" {
				if got != "" {
					t.Errorf("logged %q, want nothing", got)
				}
				return
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("logged %q, want %q", got, tt.want)
			}
			if strings.Contains(got, "db-s3cret") || strings.Contains(got, "13800138000") {
				t.Errorf("a secret or a phone number leaked: %q", got)
			}
			if !strings.Contains(got, "password authentication failed: xxxxx") {
				t.Errorf("the error was not kept, scrubbed: %q", got)
			}
		})
	}
}
