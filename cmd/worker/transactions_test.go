package main_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestTransactionsThroughKill: an upstream producer writes each order's callback and its SMS in one
// transaction, and aborts every third transaction, while the worker consuming them is killed
// (SIGKILL) halfway and another takes over. Every committed callback pays its order once and every
// committed SMS is recorded and delivered once; an aborted one pays nothing and texts no one; nothing is dead-lettered;
// the committed offsets reach the partitions' ends, markers included. It runs with the worker
// connected to Postgres directly and through PgBouncer in transaction mode.
func TestTransactionsThroughKill(t *testing.T) {
	t.Parallel()
	directAndPooled(t, testTransactionsThroughKill)
}

// testTransactionsThroughKill is TestTransactionsThroughKill with the worker reaching db at
// databaseURL.
func testTransactionsThroughKill(t *testing.T, db *pgtest.DB, databaseURL string) {
	const n = 60
	cluster := startBroker(t, partitions, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	provider := notifytest.NewProvider(t)
	ctx := context.Background()
	for i := range n {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
			VALUES ($1, 'u-1', 10.00, 'CNY', 'PENDING')`, fmt.Sprintf("TX-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=transactions",
		"KAFKA_SESSION_TIMEOUT=500ms", // the dead worker's partitions are handed on quickly
		"DATABASE_URL=" + databaseURL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"SHUTDOWN_TIMEOUT=10s",
	}
	worker := startWorker(t, env, "run")
	waitReady(t, worker.httpAddr(), 200)

	upstream := cluster.TransactionalProducer(t, "payments-edge")
	committed := func(i int) bool { return i%3 != 2 }
	for i := range n {
		if i == n/2 {
			worker.signal(syscall.SIGKILL)
			worker.wait()
			worker = startWorker(t, env, "run")
		}
		order, key := fmt.Sprintf("TX-%d", i), fmt.Sprintf("tx-%d", i)
		upstream.Begin()
		upstream.Produce(topicPayments, payment(key, order, "T-"+order, "10.00", "SUCCESS"))
		upstream.Produce(topicSMS, sms("sms-"+key, phoneOfPartition(i%partitions, partitions)))
		if committed(i) {
			upstream.Commit()
		} else {
			upstream.Abort()
		}
	}

	eventually(t, func() string {
		var paid int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'PAID'`).Scan(&paid); err != nil {
			return err.Error()
		}
		if want := 2 * n / 3; paid != want || len(provider.Delivered()) != want {
			return fmt.Sprintf("%d orders paid and %d SMS delivered, want %d of each", paid, len(provider.Delivered()), want)
		}
		return ""
	})
	delivered := map[string]int{}
	for _, r := range provider.Delivered() {
		delivered[r.Key]++
	}
	for i := range n {
		key := fmt.Sprintf("tx-%d", i)
		var payments int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE order_no = $1`, fmt.Sprintf("TX-%d", i)).Scan(&payments); err != nil {
			t.Fatal(err)
		}
		sent := countNotifications(t, db.Pool, "sms-"+key)
		if committed(i) {
			// An SMS whose send the kill cut short is sent again with its key, which the provider
			// honours: delivered once.
			if payments != 1 || sent != 1 || delivered["sms-"+key] != 1 {
				t.Errorf("%s, committed: %d payments, %d notifications, delivered %d times; want 1 of each",
					key, payments, sent, delivered["sms-"+key])
			}
		} else if payments != 0 || sent != 0 || provider.Calls("sms-"+key) != 0 {
			t.Errorf("%s, aborted: %d payments, %d notifications, %d calls to the provider; want none",
				key, payments, sent, provider.Calls("sms-"+key))
		}
	}
	for _, topic := range []string{topicPayments, topicSMS} {
		end := endOffsets(t, cluster.Addr, topic)
		eventually(t, func() string {
			if got := committedTotal(t, cluster.Addr, "transactions", topic); got != end {
				return fmt.Sprintf("%s: committed %d, want the partitions' ends, %d", topic, got, end)
			}
			return ""
		})
		if dl := deadLetters(t, cluster.Addr, topic+".dlq"); len(dl) != 0 {
			t.Errorf("%s: %d dead letters, want none: %+v", topic, len(dl), dl[0])
		}
	}
}

// endOffsets returns the sum of the end offsets of topic's partitions.
func endOffsets(t *testing.T, brokers, topic string) int64 {
	t.Helper()
	var reqs []kafka.OffsetRequest
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
	}
	resp, err := kafkaClient(t, brokers).ListOffsets(context.Background(), &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	var total int64
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("end offset of %s/%d: %v", topic, p.Partition, p.Error)
		}
		total += p.LastOffset
	}
	return total
}
