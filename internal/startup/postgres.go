package startup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/tracelog"

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
	connectTimeout := pcfg.ConnConfig.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = 5 * time.Second
	}
	pcfg.ConnConfig.ConnectTimeout = min(connectTimeout, p.Timeout)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	var refused *pgconn.PgError
	err = waitFor(ctx, p.Timeout, p.Logger, "Postgres", func(ctx context.Context) error {
		err := pool.Ping(ctx)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && hopeless[pgErr.Code] {
			refused = pgErr
			return giveUp{err}
		}
		return err
	})
	if refused != nil {
		pool.Close()
		return nil, fmt.Errorf("DATABASE_URL: Postgres at %s refused the connection: %s (SQLSTATE %s): waiting will not fix it",
			redact.URL(p.URL), redact.Scrubber(pcfg.ConnConfig.Password)(refused.Message), refused.Code)
	}
	if err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("DATABASE_URL: Postgres at %s unreachable after %s: %s",
			redact.URL(p.URL), p.Timeout, redact.Scrubber(pcfg.ConnConfig.Password)(err.Error()))
	}
	return pool, nil
}

// hopeless are the SQLSTATEs of a connection Postgres refused for a reason that waiting does not
// change: the database or the role does not exist, the password is wrong, or the role may not
// connect. They end the wait at once; an operator has to fix DATABASE_URL or the server.
var hopeless = map[string]bool{
	"3D000": true, // invalid_catalog_name: no such database
	"28000": true, // invalid_authorization_specification: no such role, or no pg_hba.conf entry
	"28P01": true, // invalid_password
	"42501": true, // insufficient_privilege: no CONNECT on the database
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
	scrub := redact.Scrubber(password)
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
