package main_test

import (
	"context"
	"strings"
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// poolerEnvironment is embeddedEnvironment with the worker behind PgBouncer in transaction mode,
// in query exec mode mode, as a role whose search_path names the test's schema: the schema is the
// role's, not a startup parameter, which PgBouncer refuses. The test checks the effects directly.
func poolerEnvironment(mode string) func(t *testing.T) *environment {
	return func(t *testing.T) *environment {
		env := embeddedEnvironment(t)
		db := pgtest.Schema(t)
		role := db.Role(t)
		bouncer := pgtest.PgBouncer(t, []string{role})
		env.pool = db.Pool
		env.databaseURL = bouncer.URL(role, "postgres", "default_query_exec_mode="+mode)
		return env
	}
}

// directAndPooled runs test as two parallel subtests on a fresh schema each: Direct, with the
// worker's DATABASE_URL to Postgres itself, and PgBouncer, through PgBouncer in transaction mode
// (cache_describe) as a role whose search_path names the schema.
func directAndPooled(t *testing.T, test func(t *testing.T, db *pgtest.DB, databaseURL string)) {
	t.Helper()
	t.Run("Direct", func(t *testing.T) {
		t.Parallel()
		db := pgtest.Schema(t)
		test(t, db, db.URL)
	})
	t.Run("PgBouncer", func(t *testing.T) {
		t.Parallel()
		db := pgtest.Schema(t)
		role := db.Role(t)
		bouncer := pgtest.PgBouncer(t, []string{role})
		test(t, db, bouncer.URL(role, "postgres", "default_query_exec_mode=cache_describe"))
	})
}

// TestBehindPooler starts the worker through PgBouncer in transaction mode set up the ways a team
// gets wrong: each ends start-up at once with one line that says what to change, before a table is
// written; none waits out STARTUP_TIMEOUT.
func TestBehindPooler(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	role := db.Role(t)
	empty := pgtest.EmptySchema(t)
	newcomer := empty.Role(t)
	bouncer := pgtest.PgBouncer(t, []string{"postgres", role, newcomer})
	ignoring := pgtest.PgBouncer(t, []string{"postgres"}, "ignore_startup_parameters = search_path")
	const cacheDescribe = "default_query_exec_mode=cache_describe"
	tests := []struct {
		name string
		url  string
		args []string
		want string // the beginning of the last line
	}{
		{"CacheStatement", bouncer.URL(role, "postgres"), []string{"run"},
			"worker: DATABASE_URL: Postgres is reached through a connection pooler in transaction mode (two connections were answered by one server process), which cannot serve default_query_exec_mode=cache_statement: the statements it prepares on one server connection are run on others; add default_query_exec_mode=cache_describe to DATABASE_URL"},
		{"DescribeExec", bouncer.URL(role, "postgres", "default_query_exec_mode=describe_exec"), []string{"run"},
			"worker: DATABASE_URL: Postgres is reached through a connection pooler in transaction mode (two connections were answered by one server process), which cannot serve default_query_exec_mode=describe_exec: it describes a statement and runs it in two round trips, which may reach two server connections; add default_query_exec_mode=cache_describe to DATABASE_URL"},
		{"SearchPathRefused", bouncer.URL("postgres", "postgres", cacheDescribe, "search_path="+db.Schema), []string{"run"},
			"worker: DATABASE_URL: Postgres at postgres://postgres@" + bouncer.Addr + "/postgres?" + cacheDescribe + "&search_path=" + db.Schema + "&sslmode=disable refused the connection: unsupported startup parameter: search_path (SQLSTATE 08P01); behind a connection pooler, set the schema on the role instead (ALTER ROLE ... SET search_path = ...) and take search_path out of DATABASE_URL: waiting will not fix it"},
		{"SearchPathIgnored", ignoring.URL("postgres", "postgres", cacheDescribe, "search_path="+db.Schema), []string{"run"},
			"worker: DATABASE_URL: search_path=" + db.Schema + ` did not reach Postgres, whose search_path is "$user", public: the worker's tables would be read and written there; a connection pooler drops the startup parameter: set the schema on the role instead (ALTER ROLE ... SET search_path = ` + db.Schema + ") and take search_path out of DATABASE_URL"},
		{"MigrationsPending", bouncer.URL(newcomer, "postgres", cacheDescribe), []string{"migrate"},
			"worker: migrate up: migrations are pending, and DATABASE_URL reaches Postgres through a connection pooler in transaction mode, which cannot hold their lock: run `worker migrate` with a DATABASE_URL to Postgres itself"},
		{"MigrationsPendingAtRun", bouncer.URL(newcomer, "postgres", cacheDescribe), []string{"run"},
			"worker: migrate up: migrations are pending, and DATABASE_URL reaches Postgres through a connection pooler in transaction mode, which cannot hold their lock: run `worker migrate` with a DATABASE_URL to Postgres itself"},
		// A user missing from PgBouncer's auth_file: its own refusal, which no wait changes.
		{"UnknownUser", bouncer.URL("no_such_user", "postgres", cacheDescribe), []string{"run"},
			"worker: DATABASE_URL: Postgres at postgres://no_such_user@" + bouncer.Addr + "/postgres?" + cacheDescribe +
				`&sslmode=disable refused the connection: "trust" authentication failed (SQLSTATE 08P01): waiting will not fix it`},
		{"Demo", bouncer.URL("postgres", "postgres", cacheDescribe), []string{"demo"},
			"worker: DATABASE_URL: Postgres at postgres://postgres@" + bouncer.Addr + "/postgres?" + cacheDescribe + "&sslmode=disable refused the connection: unsupported startup parameter: search_path (SQLSTATE 08P01); behind a connection pooler, set the schema on the role instead"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startWorker(t, []string{"DATABASE_URL=" + tt.url, "STARTUP_TIMEOUT=2m", "KAFKA_BROKERS=127.0.0.1:1",
				"HTTP_ADDR=127.0.0.1:0"}, tt.args...)
			if code := p.wait(); code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			_, lines := p.output()
			if len(lines) == 0 {
				t.Fatal("nothing on stderr")
			}
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, tt.want) {
				t.Errorf("last line %q,\nwant it to begin with %q", last, tt.want)
			}
			for _, l := range lines {
				if strings.Contains(l, "waiting for Postgres") {
					t.Errorf("waited for Postgres: %s", l)
				}
			}
		})
	}
	var tables int
	if err := empty.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("the schema of pending migrations has %d tables (%v), want none", tables, err)
	}
}
