package migrations_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sqlFiles returns the migration files in this directory, in version order.
func sqlFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migration files: %v", err)
	}
	slices.Sort(files)
	return files
}

// assertAllApplied checks that List reports every migration file, in order, as applied.
func assertAllApplied(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	statuses, err := migrations.List(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i, s := range statuses {
		names = append(names, s.Name)
		if !s.Applied {
			t.Errorf("%s is not applied", s.Name)
		}
		if i > 0 && s.Version <= statuses[i-1].Version {
			t.Errorf("%s (version %d) listed after version %d", s.Name, s.Version, statuses[i-1].Version)
		}
	}
	if want := sqlFiles(t); !slices.Equal(names, want) {
		t.Errorf("List names %q, want %q", names, want)
	}
}

func TestUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.EmptySchema(t).Pool
	logs := &bytes.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))

	applied, err := migrations.Up(ctx, pool, logger)
	if err != nil {
		t.Fatal(err)
	}
	if want := sqlFiles(t); !slices.Equal(applied, want) {
		t.Fatalf("first Up applied %q, want %q", applied, want)
	}
	for _, name := range applied {
		if !strings.Contains(logs.String(), "migration="+name) {
			t.Errorf("Up did not log applying %s; logged:\n%s", name, logs)
		}
	}
	assertAllApplied(t, pool)

	// Running it again is a no-op.
	logs.Reset()
	applied, err = migrations.Up(ctx, pool, logger)
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Up applied %q, %v; want nothing", applied, err)
	}
	if logs.Len() != 0 {
		t.Errorf("second Up logged:\n%s", logs)
	}
	assertAllApplied(t, pool)
}

// TestUpConcurrent starts several workers' migrations on one schema at once: each migration is
// applied once, and every run succeeds.
func TestUpConcurrent(t *testing.T) {
	t.Parallel()
	const workers = 3
	pool := pgtest.EmptySchema(t).Pool
	var (
		mu      sync.Mutex
		applied []string
		wg      sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			names, err := migrations.Up(context.Background(), pool, nil)
			if err != nil {
				t.Errorf("Up: %v", err)
			}
			mu.Lock()
			applied = append(applied, names...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(applied)
	if want := sqlFiles(t); !slices.Equal(applied, want) {
		t.Errorf("%d concurrent runs applied %q together, want each of %q once", workers, applied, want)
	}
	assertAllApplied(t, pool)
}

// TestUpOnMigratedSchema runs Up on a schema that pgtest has already migrated, as `worker run` does
// on every start.
func TestUpOnMigratedSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.Schema(t)
	applied, err := migrations.Up(context.Background(), db.Pool, nil)
	if err != nil || len(applied) != 0 {
		t.Fatalf("Up applied %q, %v; want nothing", applied, err)
	}
	assertAllApplied(t, db.Pool)
}

// TestInboxTable checks the inbox table's shape: keyed by (handler, idempotency_key), with the
// columns the inbox and its operators rely on, and an index for the purge.
func TestInboxTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx := pgtest.Tx(t)

	rows, _ := tx.Query(ctx, `
		SELECT column_name || ' ' || data_type || CASE is_nullable WHEN 'NO' THEN ' not null' ELSE '' END
		FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'inbox'
		ORDER BY ordinal_position`)
	columns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"handler text not null",
		"idempotency_key text not null",
		"fingerprint bytea not null",
		"topic text not null",
		"partition integer not null",
		"offset bigint not null",
		"processed_at timestamp with time zone not null",
		"expires_at timestamp with time zone not null",
	}
	if !slices.Equal(columns, want) {
		t.Errorf("inbox columns:\n%s\nwant:\n%s", strings.Join(columns, "\n"), strings.Join(want, "\n"))
	}

	// The primary key, then the other indexes, each as its columns.
	rows, _ = tx.Query(ctx, `
		SELECT string_agg(a.attname, ',' ORDER BY k.ord)
		FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = 'inbox'::regclass
		GROUP BY i.indexrelid, i.indisprimary
		ORDER BY i.indisprimary DESC, 1`)
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"handler,idempotency_key", "expires_at"}; !slices.Equal(indexes, want) {
		t.Errorf("inbox indexes %q, want %q (primary key first)", indexes, want)
	}
}
