package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/poll"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testEnv is a fresh schema with a Store over a pool whose sessions carry their own
// application_name, so that a test can watch them in pg_stat_activity.
type testEnv struct {
	db    *pgtest.DB
	pool  *pgxpool.Pool
	app   string
	store *inbox.Store
}

// setup creates a testEnv with config (its Logger defaults to t.Log) and an effects table in which
// the effects of tests record that they ran.
func setup(tb testing.TB, config inbox.Config) *testEnv {
	tb.Helper()
	db := pgtest.Schema(tb)
	e := &testEnv{db: db}
	e.pool, e.app = e.newPool(tb, 8, nil)
	if config.Logger == nil {
		config.Logger = testlog.New(tb)
	}
	e.store = e.newStore(tb, e.pool, config)
	if _, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY, key text NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	return e
}

// newPool opens a pool on the test schema with at most maxConns sessions, all with the returned
// application_name and the given run-time parameters. It is closed when the test ends.
func (e *testEnv) newPool(tb testing.TB, maxConns int32, params map[string]string) (*pgxpool.Pool, string) {
	tb.Helper()
	config, err := pgxpool.ParseConfig(e.db.URL)
	if err != nil {
		tb.Fatal(err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	app := "inbox_test_" + hex.EncodeToString(suffix)
	config.MaxConns = maxConns
	config.ConnConfig.RuntimeParams["application_name"] = app
	for k, v := range params {
		config.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, app
}

func (e *testEnv) newStore(tb testing.TB, pool *pgxpool.Pool, config inbox.Config) *inbox.Store {
	tb.Helper()
	store, err := inbox.NewStore(pool, config)
	if err != nil {
		tb.Fatal(err)
	}
	return store
}

// message returns a message of handler "h" whose value is "value of <key>".
func message(key string) inbox.Message {
	return inbox.Message{Handler: "h", Key: key, Fingerprint: inbox.Fingerprint([]byte("value of " + key)),
		Topic: "t", Partition: 2, Offset: 40}
}

// record is an effect that writes key into the effects table.
func record(key string) inbox.Effect {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, key)
		return err
	}
}

// effects returns the keys in the effects table, in insertion order.
func (e *testEnv) effects(tb testing.TB) []string {
	tb.Helper()
	return e.strings(tb, `SELECT key FROM effects ORDER BY id`)
}

// keys returns the inbox's idempotency keys, sorted.
func (e *testEnv) keys(tb testing.TB) []string {
	tb.Helper()
	return e.strings(tb, `SELECT idempotency_key FROM inbox ORDER BY idempotency_key`)
}

func (e *testEnv) strings(tb testing.TB, sql string) []string {
	tb.Helper()
	rows, _ := e.db.Pool.Query(context.Background(), sql)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func (e *testEnv) exec(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	if _, err := e.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatal(err)
	}
}

// waitForLockWaiters waits until n sessions of application app are waiting for a lock.
func (e *testEnv) waitForLockWaiters(tb testing.TB, app string, n int) {
	tb.Helper()
	eventually(tb, fmt.Sprintf("%d sessions of %s waiting for a lock", n, app), func() bool {
		var waiting int
		err := e.db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting)
		if err != nil {
			tb.Fatal(err)
		}
		return waiting == n
	})
}

// eventually polls cond until it holds, failing the test if it still does not after 30s: a guard
// against hanging, not a performance limit.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	poll.For(tb, what, cond)
}

var errEffect = errors.New("effect failed")

func TestProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Outcomes", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		msg := message("k1")
		for i, want := range []inbox.Outcome{inbox.Applied, inbox.Duplicate} {
			got, err := e.store.Process(ctx, msg, record("k1"))
			if err != nil || got != want {
				t.Fatalf("delivery %d: got %q, %v; want %q", i+1, got, err, want)
			}
		}
		reused := msg
		reused.Fingerprint = inbox.Fingerprint([]byte("another value"))
		if got, err := e.store.Process(ctx, reused, record("k1 reused")); err != nil || got != inbox.KeyReused {
			t.Fatalf("reused key: got %q, %v; want %q", got, err, inbox.KeyReused)
		}
		other := msg
		other.Handler = "other"
		if got, err := e.store.Process(ctx, other, record("k1 other handler")); err != nil || got != inbox.Applied {
			t.Fatalf("same key, other handler: got %q, %v; want %q", got, err, inbox.Applied)
		}
		if got, want := e.effects(t), []string{"k1", "k1 other handler"}; !slices.Equal(got, want) {
			t.Fatalf("effects = %q, want %q", got, want)
		}
	})

	t.Run("RecordsOrigin", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		msg := inbox.Message{Handler: "payments", Key: "evt-1", Fingerprint: inbox.Fingerprint([]byte("v")),
			Topic: "payments.callbacks", Partition: 3, Offset: 1234567890123}
		if _, err := e.store.Process(ctx, msg, record("evt-1")); err != nil {
			t.Fatal(err)
		}
		var got inbox.Message
		var fingerprint []byte
		err := e.db.Pool.QueryRow(ctx, `
			SELECT handler, idempotency_key, fingerprint, topic, "partition", "offset" FROM inbox`).
			Scan(&got.Handler, &got.Key, &fingerprint, &got.Topic, &got.Partition, &got.Offset)
		if err != nil {
			t.Fatal(err)
		}
		got.Fingerprint = [32]byte(fingerprint)
		if got != msg {
			t.Fatalf("inbox row = %+v, want %+v", got, msg)
		}
	})

	t.Run("EffectError", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		failing := func(ctx context.Context, tx pgx.Tx) error {
			if err := record("failed")(ctx, tx); err != nil {
				return err
			}
			return fmt.Errorf("handler: %w", errEffect)
		}
		if got, err := e.store.Process(ctx, message("k"), failing); !errors.Is(err, errEffect) || got != "" {
			t.Fatalf("got %q, %v; want the effect's error", got, err)
		}
		e.assertNothingRecorded(t)
		e.assertRetryApplies(t, "k")
	})

	t.Run("CommitFails", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// A deferred foreign key: the effect's insert is checked only at COMMIT.
		e.exec(t, `CREATE TABLE parents (id int PRIMARY KEY);
			CREATE TABLE children (parent_id int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)`)
		effect := func(ctx context.Context, tx pgx.Tx) error {
			if err := record("k")(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO children VALUES (1)`)
			return err
		}
		got, err := e.store.Process(ctx, message("k"), effect)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23503" || !strings.Contains(err.Error(), "commit") {
			t.Fatalf("got %q, %v; want a foreign key violation at commit", got, err)
		}
		e.assertNothingRecorded(t)

		e.exec(t, `INSERT INTO parents VALUES (1)`)
		if got, err := e.store.Process(ctx, message("k"), effect); err != nil || got != inbox.Applied {
			t.Fatalf("retry: got %q, %v; want %q", got, err, inbox.Applied)
		}
		if got := e.keys(t); !slices.Equal(got, []string{"k"}) {
			t.Fatalf("inbox keys after retry = %q, want [k]", got)
		}
	})

	t.Run("EffectPanics", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the effect's panic", r)
				}
			}()
			_, _ = e.store.Process(ctx, message("k"), func(ctx context.Context, tx pgx.Tx) error {
				if err := record("panicked")(ctx, tx); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		if n := e.pool.Stat().AcquiredConns(); n != 0 {
			t.Fatalf("%d connections still acquired after the panic: the transaction was left open", n)
		}
		e.assertNothingRecorded(t)
		e.assertRetryApplies(t, "k")
	})

	t.Run("ContextCancelledDuringEffect", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := e.store.Process(cctx, message("k"), func(ctx context.Context, tx pgx.Tx) error {
			if err := record("cancelled")(ctx, tx); err != nil {
				return err
			}
			cancel()
			_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
			return err
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		e.assertNothingRecorded(t)
		e.assertRetryApplies(t, "k")
	})

	t.Run("AlreadyApplied", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		// The effect finds by its own business keys that the work was done, and records that it looked.
		effect := func(ctx context.Context, tx pgx.Tx) error {
			if err := record("looked")(ctx, tx); err != nil {
				return err
			}
			return fmt.Errorf("order paid by the same transaction: %w", inbox.ErrAlreadyApplied)
		}
		if got, err := e.store.Process(ctx, message("k"), effect); err != nil || got != inbox.Duplicate {
			t.Fatalf("got %q, %v; want %q", got, err, inbox.Duplicate)
		}
		if got := e.keys(t); !slices.Equal(got, []string{"k"}) {
			t.Fatalf("inbox keys = %q, want [k]: the key commits", got)
		}
		if got := e.effects(t); !slices.Equal(got, []string{"looked"}) {
			t.Fatalf("effects = %q, want [looked]: the effect's writes commit", got)
		}
		if got, err := e.store.Process(ctx, message("k"), record("redelivered")); err != nil || got != inbox.Duplicate {
			t.Fatalf("redelivery: got %q, %v; want %q", got, err, inbox.Duplicate)
		}
		if got := e.effects(t); !slices.Equal(got, []string{"looked"}) {
			t.Fatalf("effects = %q after a redelivery, want [looked]", got)
		}
	})

	t.Run("RejectsMessageWithoutKey", func(t *testing.T) {
		t.Parallel()
		e := setup(t, inbox.Config{})
		for _, msg := range []inbox.Message{{Handler: "h"}, {Key: "k"}} {
			if got, err := e.store.Process(ctx, msg, record("k")); err == nil {
				t.Fatalf("Process(%+v) = %q, nil; want an error", msg, got)
			}
		}
		e.assertNothingRecorded(t)
	})
}

// assertNothingRecorded checks that neither a key nor an effect was committed.
func (e *testEnv) assertNothingRecorded(tb testing.TB) {
	tb.Helper()
	if keys, effects := e.keys(tb), e.effects(tb); len(keys) != 0 || len(effects) != 0 {
		tb.Fatalf("committed keys %q and effects %q, want none", keys, effects)
	}
}

// assertRetryApplies processes key again and checks that its effect runs and commits normally.
func (e *testEnv) assertRetryApplies(tb testing.TB, key string) {
	tb.Helper()
	got, err := e.store.Process(context.Background(), message(key), record("retry of "+key))
	if err != nil || got != inbox.Applied {
		tb.Fatalf("retry: got %q, %v; want %q", got, err, inbox.Applied)
	}
	if got, want := e.effects(tb), []string{"retry of " + key}; !slices.Equal(got, want) {
		tb.Fatalf("effects after retry = %q, want %q", got, want)
	}
}

func TestProcessRetention(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{
		Retention:        map[string]time.Duration{"payments": 72 * time.Hour, "sms": 24 * time.Hour},
		DefaultRetention: 48 * time.Hour,
	})
	for _, tt := range []struct {
		handler string
		want    time.Duration
	}{
		{"payments", 72 * time.Hour},
		{"sms", 24 * time.Hour},
		{"audit", 48 * time.Hour},
	} {
		msg := message("k")
		msg.Handler = tt.handler
		if _, err := e.store.Process(context.Background(), msg, record(tt.handler)); err != nil {
			t.Fatal(err)
		}
		if got := e.store.Retention(tt.handler); got != tt.want {
			t.Errorf("Retention(%q) = %s, want %s", tt.handler, got, tt.want)
		}
		// processed_at and expires_at are computed from the same transaction timestamp.
		var got time.Duration
		err := e.db.Pool.QueryRow(context.Background(), `
			SELECT (extract(epoch FROM expires_at - processed_at) * 1e6)::bigint FROM inbox WHERE handler = $1`,
			tt.handler).Scan(&got)
		if got *= time.Microsecond; err != nil || got != tt.want {
			t.Errorf("%s: expires_at - processed_at = %s, %v; want %s", tt.handler, got, err, tt.want)
		}
	}
}

func TestNewStoreValidatesConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	if _, err := inbox.NewStore(nil, inbox.Config{}); err == nil {
		t.Error("NewStore(nil pool) succeeded")
	}
	for name, config := range map[string]inbox.Config{
		"NegativeDefaultRetention": {DefaultRetention: -time.Hour},
		"ZeroHandlerRetention":     {Retention: map[string]time.Duration{"sms": 0}},
		"NegativePurgeBatchSize":   {PurgeBatchSize: -1},
	} {
		if _, err := inbox.NewStore(pool, config); err == nil {
			t.Errorf("%s: NewStore(%+v) succeeded", name, config)
		}
	}
}

// TestProcessConcurrentDuplicates delivers one message 50 times at once. The first claim holds the
// key while the claims of every other session in the pool queue behind it; exactly one effect runs.
func TestProcessConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const racers, sessions = 50, 16
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	pool, app := e.newPool(t, sessions, nil)
	store := e.newStore(t, pool, inbox.Config{Logger: testlog.New(t)})

	var runs atomic.Int32
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseEffect := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseEffect()
	effect := func(ctx context.Context, tx pgx.Tx) error {
		runs.Add(1)
		<-release
		return record("k")(ctx, tx)
	}

	start := make(chan struct{})
	outcomes := make(chan inbox.Outcome, racers)
	errs := make(chan error, racers)
	var wg sync.WaitGroup
	for range racers {
		wg.Go(func() {
			<-start
			outcome, err := store.Process(ctx, message("k"), effect)
			if err != nil {
				errs <- err
			}
			outcomes <- outcome
		})
	}
	close(start)
	// Every session but the claimant's is blocked on the claimed key.
	e.waitForLockWaiters(t, app, sessions-1)
	releaseEffect()
	wg.Wait()
	close(outcomes)
	close(errs)

	for err := range errs {
		t.Errorf("Process: %v", err)
	}
	counts := map[inbox.Outcome]int{}
	for o := range outcomes {
		counts[o]++
	}
	if want := map[inbox.Outcome]int{inbox.Applied: 1, inbox.Duplicate: racers - 1}; !maps.Equal(counts, want) {
		t.Errorf("outcomes = %v, want %v", counts, want)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("effect ran %d times, want 1", n)
	}
	if got := e.effects(t); !slices.Equal(got, []string{"k"}) {
		t.Errorf("effects = %q, want [k]", got)
	}
}

// TestProcessRollbackWakesWaitingDuplicate: A claims a key and blocks; B's claim of the same key
// waits for A; A's effect fails and A rolls back; B's claim then succeeds and B's effect applies.
func TestProcessRollbackWakesWaitingDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})

	claimed, failA := make(chan struct{}), make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		_, err := e.store.Process(ctx, message("k"), func(ctx context.Context, tx pgx.Tx) error {
			close(claimed)
			<-failA
			return errEffect
		})
		errA <- err
	}()
	<-claimed

	type result struct {
		outcome inbox.Outcome
		err     error
	}
	resultB := make(chan result, 1)
	go func() {
		outcome, err := e.store.Process(ctx, message("k"), record("B"))
		resultB <- result{outcome, err}
	}()
	e.waitForLockWaiters(t, e.app, 1)
	close(failA)

	if err := <-errA; !errors.Is(err, errEffect) {
		t.Errorf("A: got %v, want the effect's error", err)
	}
	if r := <-resultB; r.err != nil || r.outcome != inbox.Applied {
		t.Errorf("B: got %q, %v; want %q", r.outcome, r.err, inbox.Applied)
	}
	if got := e.effects(t); !slices.Equal(got, []string{"B"}) {
		t.Errorf("effects = %q, want [B]", got)
	}
	if got := e.keys(t); !slices.Equal(got, []string{"k"}) {
		t.Errorf("inbox keys = %q, want [k]", got)
	}
}

// faultKind is the fault kind of err.
func faultKind(err error) fault.Kind {
	kind, _, _ := fault.Classify(err)
	return kind
}
