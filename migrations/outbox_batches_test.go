package migrations_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// withProvider runs fn with a goose provider of this directory's migrations on pool's schema.
func withProvider(t *testing.T, pool *pgxpool.Pool, fn func(*goose.Provider) error) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."), goose.WithDisableGlobalRegistry(true))
	if err == nil {
		err = fn(p)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// upTo applies the migrations of pool's schema up to version.
func upTo(t *testing.T, pool *pgxpool.Pool, version int64) {
	t.Helper()
	withProvider(t, pool, func(p *goose.Provider) error {
		_, err := p.UpTo(context.Background(), version)
		return err
	})
}

// emitRows writes events a row each to outbox, as the outbox did before 00018: the orders' events
// at the next positions, in order.
func emitRows(t *testing.T, pool *pgxpool.Pool, orders ...string) {
	t.Helper()
	for _, order := range orders {
		if _, err := pool.Exec(context.Background(), `
			INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, topic)
			VALUES (gen_random_uuid(), 'order', $1, 'order.paid', json_build_object('order_no', $1::text), 'payments.events')`,
			order); err != nil {
			t.Fatal(err)
		}
	}
}

// events are the orders of a view's or table's events, in position order.
func events(t *testing.T, pool *pgxpool.Pool, from string) string {
	t.Helper()
	var got []string
	rows, err := pool.Query(context.Background(), `SELECT aggregateid FROM `+from+` ORDER BY position`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var order string
		if err := rows.Scan(&order); err != nil {
			t.Fatal(err)
		}
		got = append(got, order)
	}
	return fmt.Sprint(got)
}

// TestOutboxBatchesMigration: 00018 moves the events the relay had yet to publish to
// outbox_batches, at their positions, so that the relay publishes them after the upgrade, and leaves
// the published ones; in a deployment relayed by Debezium (no lease: the relay never ran) it moves
// nothing. Down moves the waiting events back.
func TestOutboxBatchesMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	relayed := pgtest.EmptySchema(t).Pool
	upTo(t, relayed, 17)
	emitRows(t, relayed, "A-1", "A-2", "A-3")
	if _, err := relayed.Exec(ctx, `
		INSERT INTO outbox_relay_lease (name, holder, epoch, expires_at, published_position)
		VALUES ('relay', 'h', 1, now(), (SELECT min(position) FROM outbox))`); err != nil {
		t.Fatal(err)
	}
	upTo(t, relayed, 18)
	for from, want := range map[string]string{
		"outbox": "[A-1]", "outbox_batches b, unnest(b.aggregateids) AS aggregateid": "[A-2 A-3]",
		"outbox_waiting": "[A-2 A-3]", "outbox_events": "[A-1 A-2 A-3]",
	} {
		if got := events(t, relayed, from); got != want {
			t.Errorf("after 00018, %s holds %s, want %s", from, got, want)
		}
	}
	var samePositions bool
	if err := relayed.QueryRow(ctx, `SELECT array_agg(position ORDER BY position) = ARRAY[2, 3]::bigint[] FROM outbox_batches`).
		Scan(&samePositions); err != nil || !samePositions {
		t.Errorf("the events moved are not at their positions (%v)", err)
	}
	withProvider(t, relayed, func(p *goose.Provider) error {
		_, err := p.Down(ctx)
		return err
	})
	if got, want := events(t, relayed, "outbox_waiting"), "[A-2 A-3]"; got != want {
		t.Errorf("after 00018's down, outbox_waiting holds %s, want %s", got, want)
	}

	debezium := pgtest.EmptySchema(t).Pool
	upTo(t, debezium, 17)
	emitRows(t, debezium, "D-1", "D-2")
	upTo(t, debezium, 18)
	for from, want := range map[string]string{
		"outbox": "[D-1 D-2]", "outbox_waiting": "[]", "outbox_batches b, unnest(b.aggregateids) AS aggregateid": "[]",
	} {
		if got := events(t, debezium, from); got != want {
			t.Errorf("relayed by Debezium, after 00018 %s holds %s, want %s", from, got, want)
		}
	}
}
