package startup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/tracelog"

	"github.com/inboxworker/inboxworker/internal/pooler"
	"github.com/inboxworker/inboxworker/internal/redact"
)

// Postgres is where and how long to wait for the database.
type Postgres struct {
	// URL is DATABASE_URL. Required.
	URL string
	// Schema, when set, is the search_path of every connection.
	Schema string
	// Timeout is how long to wait for Postgres to answer (STARTUP_TIMEOUT). Required.
	Timeout time.Duration
	// Logger receives the wait and pgx's own logs. Required.
	Logger *slog.Logger
}

// OpenPostgres connects to p.URL and waits up to p.Timeout for Postgres to answer; a refusal no wait
// can fix (see hopeless) ends it at once.
func OpenPostgres(ctx context.Context, p Postgres) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(p.URL)
	if err != nil { // checked with the configuration: only a race with the environment gets here
		return nil, fmt.Errorf("DATABASE_URL: invalid URL %q: %s", redact.URL(p.URL), redact.PgxConfigError(err, p.URL))
	}
	if p.Schema != "" {
		pcfg.ConnConfig.RuntimeParams["search_path"] = p.Schema
	}
	pcfg.ConnConfig.Tracer = pgxTracer(p.Logger, pcfg.ConnConfig.Password)
	pcfg.ConnConfig.OnPgError = dropReadOnly(pcfg.ConnConfig.OnPgError)
	connectTimeout := pcfg.ConnConfig.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = 5 * time.Second
	}
	pcfg.ConnConfig.ConnectTimeout = min(connectTimeout, p.Timeout)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	var refused string
	err = waitFor(ctx, p.Timeout, p.Logger, "Postgres", func(ctx context.Context) error {
		err := pool.Ping(ctx)
		if why, ok := hopeless(err); ok {
			refused = why
			return giveUp{err}
		}
		return err
	})
	if refused != "" {
		pool.Close()
		return nil, fmt.Errorf("DATABASE_URL: Postgres at %s refused the connection: %s: waiting will not fix it",
			redact.URL(p.URL), redact.Scrubber(pcfg.ConnConfig.Password)(refused))
	}
	if err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("DATABASE_URL: Postgres at %s unreachable after %s: %s",
			redact.URL(p.URL), p.Timeout, redact.Scrubber(pcfg.ConnConfig.Password)(err.Error()))
	}
	if err := checkSession(ctx, pool, pcfg.ConnConfig); err != nil {
		pool.Close()
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return pool, nil
}

// checkSession refuses what would fail later, or worse, work in the wrong place: a query exec mode
// that a connection pooler in transaction mode cannot serve, and a search_path that did not reach
// Postgres (a pooler that ignores the startup parameter would have the worker write its tables
// to the role's default schema).
func checkSession(ctx context.Context, pool *pgxpool.Pool, cfg *pgx.ConnConfig) error {
	if mode := cfg.DefaultQueryExecMode; mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeDescribeExec {
		pooled, err := pooler.TransactionMode(ctx, pool)
		if err != nil {
			return err
		}
		if pooled {
			return fmt.Errorf("Postgres is reached through a connection pooler in transaction mode (two connections "+
				"were answered by one server process), which cannot serve default_query_exec_mode=%s: %s; "+
				"add default_query_exec_mode=cache_describe to DATABASE_URL", execModeName(mode), execModeWhy[mode])
		}
	}
	want := cfg.RuntimeParams["search_path"]
	if want == "" {
		return nil
	}
	var got string
	if err := pool.QueryRow(ctx, "SELECT current_setting('search_path')", pgx.QueryExecModeSimpleProtocol).Scan(&got); err != nil {
		return fmt.Errorf("read search_path: %w", err)
	}
	if !sameSearchPath(got, want) {
		return fmt.Errorf("search_path=%s did not reach Postgres, whose search_path is %s: the worker's tables would "+
			"be read and written there; a connection pooler drops the startup parameter: set the schema on "+
			"the role instead (ALTER ROLE ... SET search_path = %s) and take search_path out of DATABASE_URL", want, got, want)
	}
	return nil
}

// execModeWhy says why a pooler in transaction mode cannot serve a query exec mode.
var execModeWhy = map[pgx.QueryExecMode]string{
	pgx.QueryExecModeCacheStatement: "the statements it prepares on one server connection are run on others",
	pgx.QueryExecModeDescribeExec:   "it describes a statement and runs it in two round trips, which may reach two server connections",
}

// execModeName is mode as default_query_exec_mode spells it.
func execModeName(mode pgx.QueryExecMode) string { return strings.ReplaceAll(mode.String(), " ", "_") }

// sameSearchPath reports whether two search_path settings name the same schemas in the same order.
func sameSearchPath(a, b string) bool {
	split := func(s string) []string {
		var out []string
		for part := range strings.SplitSeq(s, ",") {
			out = append(out, strings.TrimSpace(part))
		}
		return out
	}
	return slices.Equal(split(a), split(b))
}

// dropReadOnly closes a connection whose server answers that it refuses writes (SQLSTATE 25006:
// a standby, a primary demoted in a failover, default_transaction_read_only), rather than give it
// back to the pool: a new connection may reach the primary, or a server made writable again,
// where this one never would. Every other error goes to next, pgx's own handler, which closes the
// connection on a FATAL.
func dropReadOnly(next pgconn.PgErrorHandler) pgconn.PgErrorHandler {
	return func(conn *pgconn.PgConn, err *pgconn.PgError) bool {
		if err.Code == sqlstateReadOnly {
			return false
		}
		return next == nil || next(conn, err)
	}
}

// sqlstateReadOnly is read_only_sql_transaction.
const sqlstateReadOnly = "25006"

// hopeless says why err, an error connecting, is a refusal that waiting does not change: the
// database or the role does not exist, the password is wrong, the role may not connect, a startup
// parameter is refused, or the server will not speak TLS to a URL that requires it. Such a refusal
// ends the wait at once; an operator has to fix DATABASE_URL or the server.
func hopeless(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		why := fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
		switch {
		case pgErr.Code == sqlstateProtocolViolation && pgErr.Message == "unsupported startup parameter: search_path":
			return why + "; behind a connection pooler, set the schema on the role instead " +
				"(ALTER ROLE ... SET search_path = ...) and take search_path out of DATABASE_URL", true
		case hopelessCodes[pgErr.Code], pgErr.Code == sqlstateProtocolViolation && poolerRefusal(pgErr.Message):
			return why, true
		}
		return "", false
	}
	// pgconn's own error, not the server's: there is no code to tell it by.
	if strings.Contains(err.Error(), "server refused TLS connection") {
		return "the server does not accept TLS, which sslmode requires", true
	}
	return "", false
}

// hopelessCodes are the SQLSTATEs of a connection Postgres refused for a reason waiting does not
// change.
var hopelessCodes = map[string]bool{
	"3D000": true, // invalid_catalog_name: no such database
	"28000": true, // invalid_authorization_specification: no such role, or no pg_hba.conf entry (SSL required)
	"28P01": true, // invalid_password
	"42501": true, // insufficient_privilege: no CONNECT on the database
	"42704": true, // undefined_object: a startup parameter Postgres does not know
}

// sqlstateProtocolViolation is the code PgBouncer answers its own refusals with, the lasting ones
// (below) and the passing ones ("pgbouncer cannot connect to server") alike.
const sqlstateProtocolViolation = "08P01"

// poolerRefusal reports whether msg, a PgBouncer error, is one that waiting does not change: a
// startup parameter it refuses, a database or a user it does not know, an authentication that
// failed (`"trust" authentication failed` for a user missing from its auth_file, `password
// authentication failed`).
func poolerRefusal(msg string) bool {
	for _, lasting := range []string{"unsupported startup parameter", "no such database", "no such user",
		"authentication failed"} {
		if strings.Contains(msg, lasting) {
			return true
		}
	}
	return false
}

// pgxTracer routes pgx's own logs to logger without what they may carry of our data: statement
// arguments (payloads, phone numbers) are dropped, and the password is scrubbed from errors.
// Failed statements are logged at debug only: their callers classify and report them. Connection
// failures are warnings, but for a connect cancelled (the worker stops).
func pgxTracer(logger *slog.Logger, password string) *tracelog.TraceLog {
	level := tracelog.LogLevelWarn
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		level = tracelog.LogLevelDebug
	}
	scrub := redact.Scrubber(password)
	return &tracelog.TraceLog{
		LogLevel: level,
		Logger: tracelog.LoggerFunc(func(ctx context.Context, l tracelog.LogLevel, msg string, data map[string]any) {
			lvl := slog.LevelDebug
			if err, _ := data["err"].(error); msg == "Connect" && l <= tracelog.LogLevelWarn && !errors.Is(err, context.Canceled) {
				lvl = slog.LevelWarn // a connect cancelled is the worker stopping, no warning
			}
			attrs := []slog.Attr{slog.String("component", "pgx")}
			for k, v := range data {
				switch k {
				case "args":
					continue
				case "err":
					attrs = append(attrs, slog.String("err", scrub(fmt.Sprint(v))))
				case "time":
					// How long the operation took: "time" is the record's own key.
					attrs = append(attrs, slog.Any("duration", v))
				default:
					attrs = append(attrs, slog.Any(k, v))
				}
			}
			logger.LogAttrs(ctx, lvl, "pgx: "+msg, attrs...)
		}),
	}
}
