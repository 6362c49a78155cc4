package payment_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// benchBatchSize is the consumer's default batch size.
const benchBatchSize = 256

// benchOrders numbers the orders of BenchmarkHandleBatch across its runs.
var benchOrders atomic.Int64

// BenchmarkHandleBatch applies batches of new SUCCESS callbacks, each paying its own PENDING order,
// as the consumer does: one inbox transaction per batch of benchBatchSize, with the claim and
// HandleBatch's one statement (the provider transaction's binding, the order update and the payments
// row), committed. Compare its msgs/s with inbox's BenchmarkProcessBatch, the claim alone.
// EventsOff emits no order events, EventsOn an order.paid per callback through the outbox, in the
// same transaction; their ratio is what emission costs the batch in Postgres (the relay, which
// reads and marks the events afterwards, is internal/outbox's BenchmarkRelay).
func BenchmarkHandleBatch(b *testing.B) {
	b.Run("EventsOff", func(b *testing.B) { benchmarkHandleBatch(b, "") })
	b.Run("EventsOn", func(b *testing.B) { benchmarkHandleBatch(b, eventsTopic) })
}

func benchmarkHandleBatch(b *testing.B, events string) {
	db := pgtest.Schema(b)
	store, err := inbox.NewStore(db.Pool, inbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	handler, err := payment.NewHandler(payment.Config{EventsTopic: events, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	e := &env{pool: db.Pool, store: store, handler: handler}

	first := benchOrders.Add(int64(b.N*benchBatchSize)) - int64(b.N*benchBatchSize)
	if _, err := db.Pool.Exec(context.Background(), `
		INSERT INTO orders (order_no, user_id, amount, currency)
		SELECT 'ORD-' || i, 'user-1', 99.90, 'CNY' FROM generate_series($1::bigint, $2::bigint) AS i`,
		first, first+int64(b.N*benchBatchSize)-1); err != nil {
		b.Fatal(err)
	}
	batches := make([][]delivery, b.N)
	for n := range batches {
		batches[n] = make([]delivery, benchBatchSize)
		for j := range batches[n] {
			i := first + int64(n*benchBatchSize+j)
			batches[n][j] = delivery{key: fmt.Sprintf("evt-%d", i), value: callbackJSON(b, map[string]any{
				"event_id": fmt.Sprintf("evt-%d", i), "order_no": fmt.Sprintf("ORD-%d", i),
				"provider_txn_id": fmt.Sprintf("T-%d", i)})}
		}
	}

	b.ReportAllocs()
	b.ResetTimer()
	for _, ds := range batches {
		outcomes, err := e.deliverBatch(b, ds, nil)
		if err != nil || outcomes[len(outcomes)-1] != inbox.Applied {
			b.Fatalf("deliverBatch = %v, %v", outcomes, err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatchSize)/b.Elapsed().Seconds(), "msgs/s")
}
