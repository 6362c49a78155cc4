package startup

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/tracelog"

	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/redact"
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

// TestOpenPostgresGivesUpAtOnce checks that an error no wait can fix ends the wait at once, saying
// what it is: a database that does not exist, a role that does not exist, a startup parameter
// Postgres does not know. Such an error comes from a
// Postgres that answered; calling it unreachable after STARTUP_TIMEOUT sends the operator to the
// network. The wait is long: a test that waited would be seen to hang, and it logs "waiting for
// Postgres" after its first failure, which these must not.
func TestOpenPostgresGivesUpAtOnce(t *testing.T) {
	t.Parallel()
	server, err := url.Parse(pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		url  func(u *url.URL)
		want string
	}{
		{"NoSuchDatabase", func(u *url.URL) { u.Path = "/no_such_database" },
			`database "no_such_database" does not exist (SQLSTATE 3D000): waiting will not fix it`},
		{"NoSuchRole", func(u *url.URL) { u.User = url.UserPassword("no_such_role", "db-s3cret") },
			`role "no_such_role" does not exist (SQLSTATE 28000): waiting will not fix it`},
		// A query parameter pgx does not know goes to Postgres as a startup parameter.
		{"UnknownStartupParameter", func(u *url.URL) { u.RawQuery += "&no_such_setting=1" },
			`unrecognized configuration parameter "no_such_setting" (SQLSTATE 42704): waiting will not fix it`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := *server
			tt.url(&u)
			var logs bytes.Buffer
			p := Postgres{URL: u.String(), Timeout: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			pool, err := OpenPostgres(context.Background(), p)
			if err == nil {
				pool.Close()
				t.Fatal("connected")
			}
			want := "DATABASE_URL: Postgres at " + redact.URL(u.String()) + " refused the connection: " + tt.want
			if err.Error() != want {
				t.Errorf("error %q,\nwant %q", err, want)
			}
			if strings.Contains(logs.String(), "waiting for Postgres") || strings.Contains(err.Error()+logs.String(), "s3cret") {
				t.Errorf("logged:\n%s", logs.String())
			}
		})
	}
}

// TestPgxTracerCancelledConnect: a connect its context cancelled — the worker stopping while its pool
// opens a connection — is no warning; it is logged at debug.
func TestPgxTracerCancelledConnect(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg, err := pgx.ParseConfig(pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tracer = pgxTracer(logger, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if conn, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		conn.Close(context.Background())
		t.Fatal("connected with a cancelled context")
	}
	if got := out.String(); got != "" {
		t.Errorf("logged %q at info, want nothing: a cancelled connect is no warning", got)
	}
}
