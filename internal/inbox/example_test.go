package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// A payment callback arrives twice. The first delivery marks the order paid and records its key in
// the same transaction; the redelivery finds the key and does nothing.
func ExampleStore_Process() {
	ctx := context.Background()
	db, drop, err := pgtest.NewSchema() // a fresh, migrated schema on the test server
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency)
		VALUES ('A-1001', 'u-7', 99.90, 'CNY')`); err != nil {
		log.Fatal(err)
	}

	store, err := inbox.NewStore(db.Pool, inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	value := []byte(`{"event_id":"evt-1","order_no":"A-1001","result":"SUCCESS"}`)
	msg := inbox.Message{Handler: "payments", Key: "evt-1", Fingerprint: inbox.Fingerprint(value),
		Topic: "payments.callbacks", Partition: 0, Offset: 42}
	markPaid := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'PAID', paid_at = now() WHERE order_no = 'A-1001'`)
		return err
	}

	for range 2 { // Kafka delivers at least once
		outcome, err := store.Process(ctx, msg, markPaid)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	// Output:
	// applied
	// duplicate
}
