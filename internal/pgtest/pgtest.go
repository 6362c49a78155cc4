// Package pgtest gives tests an isolated, migrated Postgres schema on a real server.
//
// The server comes from TEST_DATABASE_URL, defaulting to the local trust-auth server of a fresh
// checkout. Schema creates a fresh schema per test, migrated with the real migrations and dropped
// afterwards, for tests that commit, race or crash; Tx hands out a transaction on a schema shared by
// the test binary and rolls it back afterwards, for the many tests that need neither. It is for tests
// only and mocks nothing.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/inboxworker/inboxworker/migrations"
)

// DefaultURL is used when TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL returns the URL of the test server.
func ServerURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Main runs the tests of a package that uses pgtest, then runs cleanups (what TestMain set up for
// the whole package), drops the shared schema and fails the run if any goroutine is still running
// that is not one of the known background goroutines of LeakOptions: a goroutine a test started and
// never stopped is a leak, whoever started it. Call it from TestMain.
func Main(m *testing.M, cleanups ...func()) {
	code := m.Run()
	for _, cleanup := range cleanups {
		cleanup()
	}
	shared.close()
	admin.close()
	if code == 0 {
		// Find retries for a while: goroutines that were told to stop may take a moment to return.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines still running after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// DB is an isolated schema.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	// URL connects to the schema (search_path set), for a subprocess under test.
	URL string
}

// Schema creates a fresh schema, migrates it and returns a pool whose connections use it. The schema
// and pool go away when the test ends.
func Schema(tb testing.TB) *DB {
	tb.Helper()
	db, drop, err := NewSchema()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(drop)
	return db
}

// EmptySchema is Schema without the migrations: for tests of migrating itself.
func EmptySchema(tb testing.TB) *DB {
	tb.Helper()
	db, err := createSchema(false)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(db.drop)
	return db
}

// NewSchema is Schema for code that has no testing.TB, such as an Example: the caller drops the
// schema and closes its pool by calling drop.
func NewSchema() (db *DB, drop func(), err error) {
	db, err = createSchema(true)
	if err != nil {
		return nil, nil, fmt.Errorf("pgtest: %w", err)
	}
	return db, db.drop, nil
}

// Pool is Schema(tb).Pool.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return Schema(tb).Pool
}

// Tx begins a transaction on a migrated schema shared by the test binary and rolls it back when the
// test ends. Nothing it writes is seen by other tests.
func Tx(tb testing.TB) pgx.Tx {
	tb.Helper()
	db, err := shared.get()
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		tb.Fatalf("pgtest: begin: %v", err)
	}
	tb.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	return tx
}

var shared sharedSchema

type sharedSchema struct {
	once sync.Once
	db   *DB
	err  error
}

func (s *sharedSchema) get() (*DB, error) {
	s.once.Do(func() { s.db, s.err = createSchema(true) })
	return s.db, s.err
}

func (s *sharedSchema) close() {
	if s.db != nil {
		s.db.drop()
	}
}

// createSchema creates a schema with a random name and a pool whose connections use it, and
// migrates it if asked to.
func createSchema(migrate bool) (*DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	schema := randomName("test_")

	adminPool, err := admin.get()
	if err != nil {
		return nil, err
	}
	if _, err := adminPool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, err
	}

	u, err := url.Parse(ServerURL())
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()

	db := &DB{Schema: schema, URL: u.String()}
	db.Pool, err = pgxpool.New(ctx, db.URL)
	if err == nil && migrate {
		_, err = migrations.Up(ctx, db.Pool, nil)
	}
	if err != nil {
		db.drop()
		return nil, err
	}
	return db, nil
}

// randomName is prefix and 12 random hex digits: a name no other test's schema or role has.
func randomName(prefix string) string {
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	return prefix + hex.EncodeToString(suffix)
}

func (db *DB) drop() {
	if db.Pool != nil {
		db.Pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adminPool, err := admin.get()
	if err != nil {
		return
	}
	_, _ = adminPool.Exec(ctx, "DROP SCHEMA IF EXISTS "+db.Schema+" CASCADE")
}

// admin is the test binary's pool of connections to the server, outside any test schema, that
// creates and drops the schemas: a connection's start costs the server more than the statements.
var admin adminPool

type adminPool struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

func (a *adminPool) get() (*pgxpool.Pool, error) {
	a.once.Do(func() {
		config, err := pgxpool.ParseConfig(ServerURL())
		if err != nil {
			a.err = err
			return
		}
		config.MaxConns = 4
		a.pool, a.err = pgxpool.NewWithConfig(context.Background(), config)
	})
	return a.pool, a.err
}

func (a *adminPool) close() {
	if a.pool != nil {
		a.pool.Close()
	}
}
