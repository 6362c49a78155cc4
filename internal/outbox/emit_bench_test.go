package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// BenchmarkEmitBatch emits batches of 256 events, each of an aggregate of its own, one committed
// transaction per batch, as the payment route emits a batch's order events.
func BenchmarkEmitBatch(b *testing.B) {
	db := pgtest.Schema(b)
	const size = 256
	batches := make([][]outbox.Event, b.N)
	for n := range batches {
		for i := range size {
			orderNo := fmt.Sprintf("ORD-%08d", n*size+i)
			batches[n] = append(batches[n], outbox.Event{Topic: "payments.events", AggregateType: "order",
				AggregateID: orderNo, Type: "order.paid", Cause: "alipay\x00T-" + orderNo,
				Payload: map[string]string{"order_no": orderNo, "provider": "alipay", "provider_txn_id": "T-" + orderNo,
					"amount": "99.90", "currency": "CNY", "paid_at": "2026-11-30T12:00:00Z"}})
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, events := range batches {
		if err := inbox.WithTx(context.Background(), db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.EmitBatch(ctx, tx, events)
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRelay publishes a backlog of 256 events per op (emitted before the clock starts, each of
// an aggregate of its own, in batches of 256) to the in-process broker: the relay's capacity, to set
// against the rate at which the emitters commit.
func BenchmarkRelay(b *testing.B) {
	e := &env{db: pgtest.Schema(b), cluster: kafkatest.Start(b, partitions, topic)}
	const size = 256
	for n := range b.N {
		var events []outbox.Event
		for i := range size {
			orderNo := fmt.Sprintf("ORD-%08d", n*size+i)
			events = append(events, outbox.Event{Topic: topic, AggregateType: "order", AggregateID: orderNo,
				Type: "order.paid", Cause: "alipay\x00T-" + orderNo, Payload: map[string]string{"order_no": orderNo,
					"provider": "alipay", "provider_txn_id": "T-" + orderNo, "amount": "99.90", "currency": "CNY",
					"paid_at": "2026-11-30T12:00:00Z"}})
		}
		if err := inbox.WithTx(context.Background(), e.db.Pool, func(ctx context.Context, tx pgx.Tx) error {
			return outbox.EmitBatch(ctx, tx, events)
		}); err != nil {
			b.Fatal(err)
		}
	}
	config := outbox.RelayConfig{Pool: e.db.Pool, Brokers: []string{e.cluster.Addr}, Logger: slog.New(slog.DiscardHandler)}
	b.ResetTimer()
	r, err := outbox.NewRelay(config)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	for {
		stats, err := r.ReadStats(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if stats.Waiting == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
}
