package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestClassify produces each error from the real server, mostly through Process, and checks the
// classification that the consumer acts on.
func TestClassify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, inbox.Config{})
	e.exec(t, `CREATE TABLE rows (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
		INSERT INTO rows (id) VALUES (1), (2)`)

	for _, tt := range []struct {
		name    string
		produce func(t *testing.T) error
		code    string // the SQLSTATE expected in the chain, if any
		want    fault.Kind
	}{
		{"SerializationFailure", e.serializationFailure, "40001", fault.KindRetryable},
		{"Deadlock", e.deadlock, "40P01", fault.KindRetryable},
		{"LockTimeout", e.lockTimeout, "55P03", fault.KindRetryable},
		{"LockTimeoutOnClaim", e.lockTimeoutOnClaim, "55P03", fault.KindRetryable},
		{"StatementTimeout", func(t *testing.T) error {
			return inbox.WithTx(ctx, e.pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '10ms'; SELECT pg_sleep(10)`)
				return inbox.Classify(err)
			})
		}, "57014", fault.KindRetryable},
		{"ConnectionRefused", func(t *testing.T) error {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			_ = ln.Close()
			return processWithServer(t, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
		}, "", fault.KindUnavailable},
		{"ServerRefusesConnection", func(t *testing.T) error {
			u, err := url.Parse(e.db.URL)
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/inboxworker_no_such_database"
			return processWithServer(t, u.String())
		}, "3D000", fault.KindUnavailable},
		{"ConnectionTerminatedDuringEffect", func(t *testing.T) error {
			_, err := e.store.Process(ctx, message("terminated"), func(ctx context.Context, tx pgx.Tx) error {
				e.terminate(t, tx)
				_, err := tx.Exec(ctx, `SELECT 1`)
				return err
			})
			return err
		}, "", fault.KindUnavailable},
		{"ConnectionTerminatedBeforeCommit", func(t *testing.T) error {
			_, err := e.store.Process(ctx, message("terminated before commit"), func(ctx context.Context, tx pgx.Tx) error {
				e.terminate(t, tx)
				return nil
			})
			return err
		}, "", fault.KindUnavailable},
		{"ConnectionDroppedDuringEffect", func(t *testing.T) error {
			proxy := pgtest.StartProxy(t, e.db.URL)
			dropped, err := pgxpool.New(ctx, proxy.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer dropped.Close()
			store := e.newStore(t, dropped, inbox.Config{})
			_, err = store.Process(ctx, message("dropped"), func(ctx context.Context, tx pgx.Tx) error {
				proxy.Cut()
				_, err := tx.Exec(ctx, `SELECT 1`)
				return err
			})
			return err
		}, "", fault.KindUnavailable},
		{"UniqueViolationInEffect", func(t *testing.T) error {
			_, err := e.store.Process(ctx, message("unique"), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO rows (id) VALUES (1)`)
				return err
			})
			return err
		}, "23505", fault.KindPermanent},
		{"InvalidKeyAtClaim", func(t *testing.T) error {
			// A key Postgres refuses: a claim error that is the message's own fault.
			msg := message("nul\x00byte")
			_, err := e.store.Process(ctx, msg, record("nul"))
			return err
		}, "22021", fault.KindPermanent},
		{"InvalidKeyAtClaimInSimpleProtocol", func(t *testing.T) error {
			// Sent inside the statement's text, the NUL cuts the message short: Postgres refuses it
			// with an ERROR of class 08 and the connection goes on. Still the message's own fault.
			simple, err := pgxpool.New(ctx, e.db.URL+"&default_query_exec_mode=simple_protocol")
			if err != nil {
				t.Fatal(err)
			}
			defer simple.Close()
			_, err = e.newStore(t, simple, inbox.Config{}).Process(ctx, message("nul\x00byte"), record("nul"))
			return err
		}, "08P01", fault.KindPermanent},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.produce(t)
			if err == nil {
				t.Fatal("produced no error")
			}
			t.Logf("produced: %v", err)
			if got := faultKind(err); got != tt.want {
				t.Errorf("%v: classified %s, want %s", err, got, tt.want)
			}
			var pgErr *pgconn.PgError
			if tt.code != "" && (!errors.As(err, &pgErr) || pgErr.Code != tt.code) {
				t.Errorf("%v: want SQLSTATE %s in the chain", err, tt.code)
			}
		})
	}
	if keys := e.keys(t); len(keys) != 0 {
		t.Errorf("failed messages left keys %q", keys)
	}
}

// TestClassifyKeeps checks the errors Classify leaves alone.
func TestClassifyKeeps(t *testing.T) {
	t.Parallel()
	classified := fault.Permanent(inboxtype.InvalidPayload, &pgconn.PgError{Code: "40001"})
	plain := errors.New("no order")
	for _, err := range []error{nil, classified, plain, fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "23505"})} {
		if got := inbox.Classify(err); got != err {
			t.Errorf("Classify(%v) = %v, want it unchanged", err, got)
		}
	}
}

// serializationFailure updates a row that changed after the repeatable-read transaction's snapshot.
func (e *testEnv) serializationFailure(t *testing.T) error {
	ctx := context.Background()
	return inbox.WithTx(ctx, e.pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT n FROM rows`); err != nil {
			t.Fatal(err)
		}
		e.exec(t, `UPDATE rows SET n = n + 1 WHERE id = 1`)
		_, err := tx.Exec(ctx, `UPDATE rows SET n = 0 WHERE id = 1`)
		return inbox.Classify(err)
	})
}

// deadlock has A lock row 1 then wait for row 2, and B lock row 2 then ask for row 1. B's short
// deadlock_timeout makes B the one that detects the deadlock and fails.
func (e *testEnv) deadlock(t *testing.T) error {
	ctx := context.Background()
	txA, txB := e.begin(t), e.begin(t)
	if _, err := txA.Exec(ctx, `SET LOCAL deadlock_timeout = '1min'; UPDATE rows SET n = n + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := txB.Exec(ctx, `SET LOCAL deadlock_timeout = '10ms'; UPDATE rows SET n = n + 1 WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	errA := make(chan error, 1)
	go func() {
		_, err := txA.Exec(ctx, `UPDATE rows SET n = n + 1 WHERE id = 2`)
		errA <- err
	}()
	e.waitForBackendWaiting(t, txA.Conn().PgConn().PID())
	_, errB := txB.Exec(ctx, `UPDATE rows SET n = n + 1 WHERE id = 1`)
	_ = txB.Rollback(ctx)
	if err := <-errA; err != nil {
		t.Errorf("A, the survivor: %v", err)
	}
	return inbox.Classify(errB)
}

// lockTimeout asks for a row lock that another transaction holds.
func (e *testEnv) lockTimeout(t *testing.T) error {
	ctx := context.Background()
	holder := e.begin(t)
	if _, err := holder.Exec(ctx, `SELECT * FROM rows WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return inbox.WithTx(ctx, e.pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10ms'; SELECT * FROM rows WHERE id = 1 FOR UPDATE`)
		return inbox.Classify(err)
	})
}

// lockTimeoutOnClaim claims a key that an open transaction has claimed, through a pool whose
// sessions give up waiting for a lock after 20ms.
func (e *testEnv) lockTimeoutOnClaim(t *testing.T) error {
	ctx := context.Background()
	msg := message("held")
	holder := e.begin(t)
	if _, err := holder.Exec(ctx, `
		INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
		VALUES ($1, $2, $3, 't', 0, 0, now() + interval '1 hour')`, msg.Handler, msg.Key, msg.Fingerprint[:]); err != nil {
		t.Fatal(err)
	}
	pool, _ := e.newPool(t, 1, map[string]string{"lock_timeout": "20ms"})
	store := e.newStore(t, pool, inbox.Config{})
	_, err := store.Process(ctx, msg, record("held"))
	return err
}

// processWithServer processes a message with a store on the server at url.
func processWithServer(t *testing.T, serverURL string) error {
	pool, err := pgxpool.New(context.Background(), serverURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := inbox.NewStore(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Process(context.Background(), message("k"), record("k"))
	return err
}

// terminate ends tx's session from another session, as an administrator or a failover would, and
// waits until it is gone.
func (e *testEnv) terminate(t *testing.T, tx pgx.Tx) {
	var terminated bool
	err := e.db.Pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1, 10000)`,
		tx.Conn().PgConn().PID()).Scan(&terminated)
	if err != nil || !terminated {
		t.Errorf("pg_terminate_backend: %t, %v", terminated, err)
	}
}

// begin opens a transaction on the test pool that is rolled back when the test ends.
func (e *testEnv) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// waitForBackendWaiting waits until the session with process id pid waits for a lock.
func (e *testEnv) waitForBackendWaiting(t *testing.T, pid uint32) {
	t.Helper()
	eventually(t, fmt.Sprintf("session %d waiting for a lock", pid), func() bool {
		var waiting bool
		err := e.db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`,
			int64(pid)).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	})
}
