// Package migrations holds the worker's schema as numbered SQL files and the one API that applies
// them: `worker migrate`, `worker run` and the tests all go through Up.
//
// The files are run by pressly/goose, which records applied versions in goose_db_version in the
// connection's current schema. Concurrent runs (several workers starting at once) are serialised by a
// Postgres advisory lock per schema. Down migrations exist for development; the worker never runs them.
package migrations

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/inboxworker/inboxworker/internal/pooler"
)

//go:embed *.sql
var files embed.FS

// ErrPooled is the error of Up with migrations pending, through a connection pooler in transaction
// mode: their lock is a Postgres session's, which such a pooler does not keep.
var ErrPooled = errors.New("migrations are pending, and DATABASE_URL reaches Postgres through a connection pooler in " +
	"transaction mode, which cannot hold their lock: run `worker migrate` with a DATABASE_URL to Postgres itself")

// Status is one migration and whether it has been applied.
type Status struct {
	Version int64
	Name    string
	Applied bool
}

// Up applies every pending migration and returns the names of those it applied. Running it when
// nothing is pending is a no-op.
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]string, error) {
	var applied []string
	err := withProvider(ctx, pool, func(p *goose.Provider) error {
		// Asked without the lock, which most starts then never take.
		if pending, err := p.HasPending(ctx); err != nil || !pending {
			return err
		}
		if pooled, err := pooler.TransactionMode(ctx, pool); err != nil || pooled {
			return cmp.Or(err, ErrPooled)
		}
		results, err := p.Up(ctx)
		for _, r := range results {
			if r.Error == nil {
				applied = append(applied, r.Source.Path)
				if logger != nil {
					logger.InfoContext(ctx, "migration applied", slog.String("migration", r.Source.Path),
						slog.Duration("took", r.Duration))
				}
			}
		}
		return err
	})
	if err != nil {
		return applied, fmt.Errorf("migrate up: %w", err)
	}
	return applied, nil
}

// List returns every migration in version order with whether it has been applied.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Status, error) {
	var out []Status
	err := withProvider(ctx, pool, func(p *goose.Provider) error {
		statuses, err := p.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range statuses {
			out = append(out, Status{
				Version: s.Source.Version,
				Name:    s.Source.Path,
				Applied: s.State == goose.StateApplied,
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate status: %w", err)
	}
	return out, nil
}

func withProvider(ctx context.Context, pool *pgxpool.Pool, fn func(*goose.Provider) error) (err error) {
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return err
	}
	// One lock per schema, so that isolated test schemas migrate side by side.
	h := fnv.New64a()
	h.Write([]byte("inboxworker/migrations/" + schema))
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(h.Sum64()>>1)),
		lock.WithLockTimeout(1, 120), // wait up to 2 minutes for another instance's migration
	)
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer func() { err = errors.Join(err, db.Close()) }()
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return err
	}
	return fn(p)
}
