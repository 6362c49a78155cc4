package payment_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/poll"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// createOnRetry creates an order just before the second attempt at a callback, as an order service
// that committed the order a moment after the provider called back.
type createOnRetry struct {
	handler *payment.Handler
	key     string
	create  func()
}

func (h *createOnRetry) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	if d.Key == h.key && d.Attempt == 2 {
		h.create()
	}
	return h.handler.Handle(ctx, tx, d)
}

func (h *createOnRetry) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	for _, d := range ds {
		if d.Key == h.key && d.Attempt == 2 {
			h.create()
		}
	}
	return h.handler.HandleBatch(ctx, tx, ds)
}

// TestThroughConsumer runs a stream of callbacks with redeliveries (the same message again, and the
// provider's resend under a new key) for every case of the contract through the consumer on a Kafka
// broker, and checks the final state of the orders, the dead-letter topic and the outcomes; with a
// transaction per message, and per batch.
func TestThroughConsumer(t *testing.T) {
	t.Parallel()
	forEachTransactionMode(t, testThroughConsumer)
}

// forEachTransactionMode runs test as a parallel subtest with a transaction per message, and per
// batch.
func forEachTransactionMode(t *testing.T, test func(*testing.T, consumer.Transactions)) {
	for name, mode := range map[string]consumer.Transactions{"PerMessage": consumer.PerMessage, "PerBatch": consumer.PerBatch} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, mode)
		})
	}
}

func testThroughConsumer(t *testing.T, mode consumer.Transactions) {
	const topic, dlqTopic, partitions = "payments.callbacks", "payments.callbacks.dlq", 2
	e := setup(t)
	broker := kafkatest.Start(t, partitions, topic, dlqTopic)
	for _, o := range []struct{ orderNo, status string }{
		{"ORD-PAID", "PENDING"}, {"ORD-FAILED", "PENDING"}, {"ORD-MISMATCH", "PENDING"},
		{"ORD-DUP", "PENDING"}, {"ORD-CANCELLED", "CANCELLED"},
	} {
		createOrder(t, e.pool, o.orderNo, "99.90", "CNY", o.status)
	}

	// The stream. Kafka keys are order numbers, so each order's callbacks stay in order. The
	// idempotency key is event_id, or the Idempotency-Key header when header is set.
	type delivery struct {
		orderNo string
		key     string
		header  bool
		changes map[string]any
	}
	stream := []delivery{
		{"ORD-PAID", "e1", false, map[string]any{"provider_txn_id": "T-PAID"}},
		{"ORD-PAID", "e1", false, map[string]any{"provider_txn_id": "T-PAID"}},
		{"ORD-PAID", "e1-resent", false, map[string]any{"provider_txn_id": "T-PAID"}},
		{"ORD-PAID", "e1-bad", false, map[string]any{"provider_txn_id": "T-BAD", "amount": 99.9}},
		{"ORD-FAILED", "h2", true, map[string]any{"provider_txn_id": "T-FAILED", "result": "FAILED"}},
		{"ORD-FAILED", "h2", true, map[string]any{"provider_txn_id": "T-FAILED", "result": "FAILED"}},
		{"ORD-FAILED", "h2-resent", true, map[string]any{"provider_txn_id": "T-FAILED", "result": "FAILED"}},
		{"ORD-MISMATCH", "e3", false, map[string]any{"provider_txn_id": "T-MISMATCH", "amount": "1.00"}},
		{"ORD-MISMATCH", "e3", false, map[string]any{"provider_txn_id": "T-MISMATCH", "amount": "1.00"}},
		{"ORD-DUP", "e4", false, map[string]any{"provider_txn_id": "T-DUP1"}},
		{"ORD-DUP", "e5", false, map[string]any{"provider_txn_id": "T-DUP2"}},
		{"ORD-DUP", "e4", false, map[string]any{"provider_txn_id": "T-DUP1"}},
		{"ORD-DUP", "e5", false, map[string]any{"provider_txn_id": "T-DUP2"}},
		{"ORD-DUP", "e5-resent", false, map[string]any{"provider_txn_id": "T-DUP2"}},
		{"ORD-CANCELLED", "e6", false, map[string]any{"provider_txn_id": "T-CANCELLED"}},
		{"ORD-CANCELLED", "e6", false, map[string]any{"provider_txn_id": "T-CANCELLED"}},
		{"ORD-LATE", "e7", false, map[string]any{"provider_txn_id": "T-LATE"}},
		{"ORD-LATE", "e7", false, map[string]any{"provider_txn_id": "T-LATE"}},
		{"ORD-UNKNOWN", "e8", false, map[string]any{"provider_txn_id": "T-UNKNOWN"}},
	}
	msgs := make([]kafka.Message, len(stream))
	for i, d := range stream {
		changes := map[string]any{"order_no": d.orderNo, "event_id": d.key}
		if d.header {
			changes["event_id"] = nil
		}
		for k, v := range d.changes {
			changes[k] = v
		}
		msgs[i] = kafka.Message{Key: []byte(d.orderNo), Value: callback(t, changes)}
		if d.header {
			msgs[i].Headers = []kafka.Header{{Key: "Idempotency-Key", Value: []byte(d.key)}}
		}
	}

	metrics := consumer.NewMetrics(prometheus.NewRegistry())
	c, err := consumer.New(consumer.Config{
		Brokers: []string{broker.Addr},
		GroupID: "payments-test",
		Routes: []consumer.Route{{Topic: topic, Name: "payments", Handler: &createOnRetry{
			handler: e.handler,
			key:     "e7",
			// Runs in the consumer's goroutine: reports with t.Errorf, never t.Fatal.
			create: func() {
				if err := insertOrder(e.pool, "ORD-LATE", "99.90", "CNY", "PENDING"); err != nil {
					t.Errorf("create ORD-LATE: %v", err)
				}
			},
		}}},
		Retry: consumer.Retry{
			InitialInterval: time.Millisecond,
			MaxInterval:     20 * time.Millisecond,
			MaxElapsed:      300 * time.Millisecond,
		},
		Transactions:    mode,
		ShutdownTimeout: 5 * time.Second,
		Store:           e.store,
		DeadLetters:     deadletter.NewStore(e.pool),
		Metrics:         metrics,
		Logger:          testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	consumeAll(t, c, broker, topic, partitions, msgs, poll.Timeout)

	paid := " at " + paidAt
	for orderNo, want := range map[string]state{
		"ORD-PAID":   {Order: "PAID by T-PAID" + paid, Payments: []string{"alipay/T-PAID SUCCESS 99.90 CNY key=e1"}},
		"ORD-FAILED": {Order: "PENDING", Payments: []string{"alipay/T-FAILED FAILED 99.90 CNY key=h2"}},
		"ORD-MISMATCH": {Order: "PENDING", Anomalies: []string{
			"alipay/T-MISMATCH amount_mismatch expected=99.90 CNY received=1.00 CNY key=e3"}},
		"ORD-DUP": {Order: "PAID by T-DUP1" + paid, Payments: []string{"alipay/T-DUP1 SUCCESS 99.90 CNY key=e4"},
			Anomalies: []string{"alipay/T-DUP2 duplicate_payment expected=99.90 CNY received=99.90 CNY key=e5 previous=alipay/T-DUP1"}},
		"ORD-CANCELLED": {Order: "CANCELLED", Anomalies: []string{
			"alipay/T-CANCELLED paid_after_cancel expected=99.90 CNY received=99.90 CNY key=e6"}},
		"ORD-LATE": {Order: "PAID by T-LATE" + paid, Payments: []string{"alipay/T-LATE SUCCESS 99.90 CNY key=e7"}},
	} {
		if got := readState(t, e.pool, orderNo); !equalState(got, want) {
			t.Errorf("%s:\n%s\nwant:\n%s", orderNo, got, want)
		}
	}

	dead := map[string]string{} // idempotency key → dlq-reason
	for p := range partitions {
		for _, m := range broker.ReadAll(t, dlqTopic, p) {
			var body struct {
				EventID string `json:"event_id"`
			}
			if err := json.Unmarshal(m.Value, &body); err != nil {
				t.Fatalf("dead letter %s: %v", m.Value, err)
			}
			for _, h := range m.Headers {
				if h.Key == deadletter.HeaderReason {
					dead[body.EventID] = string(h.Value)
				}
			}
		}
	}
	wantDead := map[string]string{"e1-bad": string(inboxtype.InvalidPayload), "e8": string(payment.UnknownOrder)}
	if len(dead) != len(wantDead) || dead["e1-bad"] != wantDead["e1-bad"] || dead["e8"] != wantDead["e8"] {
		t.Errorf("dead letters by key: %v, want %v", dead, wantDead)
	}

	for outcome, want := range map[string]float64{"applied": 7, "duplicate": 10, "dead_lettered": 2} {
		if got := testutil.ToFloat64(metrics.Messages.WithLabelValues(topic, outcome)); got != want {
			t.Errorf("%s messages: %v, want %v", outcome, got, want)
		}
	}
}

// TestOneOrderPerTransactionThroughConsumer: 200 provider transactions, each sent for a cancelled
// order and for an order whose amount differs, keyed by order number so that the two callbacks of a
// transaction mostly land on different partitions, which the consumer applies concurrently. Each
// transaction is flagged once, for one of its orders; its other callback is dead-lettered
// invalid_payload naming provider_txn_id. With a transaction per message, and per batch.
func TestOneOrderPerTransactionThroughConsumer(t *testing.T) {
	t.Parallel()
	forEachTransactionMode(t, testOneOrderPerTransactionThroughConsumer)
}

func testOneOrderPerTransactionThroughConsumer(t *testing.T, mode consumer.Transactions) {
	const topic, dlqTopic, partitions, pairs = "payments.callbacks", "payments.callbacks.dlq", 4, 200
	e := setup(t)
	broker := kafkatest.Start(t, partitions, topic, dlqTopic)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO orders (order_no, user_id, amount, currency, status)
		SELECT prefix || i, 'user-1', 99.90, 'CNY', status
		FROM generate_series(0, $1 - 1) AS i,
		     (VALUES ('CANCELLED-', 'CANCELLED'), ('MISMATCH-', 'PENDING')) AS o(prefix, status)`,
		pairs); err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	for i := range pairs {
		for _, orderNo := range []string{fmt.Sprintf("CANCELLED-%d", i), fmt.Sprintf("MISMATCH-%d", i)} {
			msgs = append(msgs, kafka.Message{Key: []byte(orderNo), Value: callback(t, map[string]any{
				"event_id": "e-" + orderNo, "order_no": orderNo, "provider_txn_id": fmt.Sprintf("T-%d", i), "amount": "99.91"})})
		}
	}

	metrics := consumer.NewMetrics(prometheus.NewRegistry())
	c, err := consumer.New(consumer.Config{
		Brokers:         []string{broker.Addr},
		GroupID:         "payments-test",
		Routes:          []consumer.Route{{Topic: topic, Name: "payments", Handler: e.handler}},
		Retry:           consumer.Retry{InitialInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond, MaxElapsed: 5 * time.Second},
		Transactions:    mode,
		ShutdownTimeout: 5 * time.Second,
		Store:           e.store,
		DeadLetters:     deadletter.NewStore(e.pool),
		Metrics:         metrics,
		Logger:          testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	consumeAll(t, c, broker, topic, partitions, msgs, poll.Timeout)

	flagged := map[string]string{} // provider transaction → the order it was flagged for
	rows, _ := e.pool.Query(ctx, `SELECT provider_txn_id, order_no FROM payment_anomalies`)
	var txn, orderNo string
	if _, err := pgx.ForEachRow(rows, []any{&txn, &orderNo}, func() error {
		if other, ok := flagged[txn]; ok {
			t.Errorf("%s flagged for %s and for %s", txn, other, orderNo)
		}
		flagged[txn] = orderNo
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dead := map[string]bool{} // orders whose callback was dead-lettered
	for p := range partitions {
		for _, m := range broker.ReadAll(t, dlqTopic, p) {
			var reason, detail string
			for _, h := range m.Headers {
				switch h.Key {
				case "dlq-reason":
					reason = string(h.Value)
				case "dlq-error":
					detail = string(h.Value)
				}
			}
			if reason != string(inboxtype.InvalidPayload) || !strings.Contains(detail, "provider_txn_id") {
				t.Errorf("dead letter of %s: %s: %s; want invalid_payload naming provider_txn_id", m.Key, reason, detail)
			}
			dead[string(m.Key)] = true
		}
	}
	for i := range pairs {
		txn := fmt.Sprintf("T-%d", i)
		winner, ok := flagged[txn]
		if !ok {
			t.Errorf("%s: not flagged", txn)
			continue
		}
		loser := strings.Replace(winner, "MISMATCH-", "CANCELLED-", 1)
		if loser == winner {
			loser = strings.Replace(winner, "CANCELLED-", "MISMATCH-", 1)
		}
		if dead[winner] || !dead[loser] {
			t.Errorf("%s: flagged for %s; dead letters for it: %v, for %s: %v; want only %s's", txn, winner,
				dead[winner], loser, dead[loser], loser)
		}
	}
	for outcome, want := range map[string]float64{"applied": pairs, "dead_lettered": pairs} {
		if got := testutil.ToFloat64(metrics.Messages.WithLabelValues(topic, outcome)); got != want {
			t.Errorf("%s messages: %v, want %v", outcome, got, want)
		}
	}
}

// consumeAll runs c, produces msgs to topic and waits until every one's offset is committed in the
// group payments-test (or fails the test after timeout, which only keeps a broken test from
// hanging), then stops c.
func consumeAll(t *testing.T, c *consumer.Consumer, broker *kafkatest.Cluster, topic string, partitions int, msgs []kafka.Message, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	defer func() { cancel(); wg.Wait() }()

	broker.Produce(t, topic, msgs...)
	deadline := time.Now().Add(timeout)
	for {
		var committed int64
		for p := range partitions {
			committed += max(0, broker.CommittedOffset(t, "payments-test", topic, p))
		}
		if committed == int64(len(msgs)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d offsets committed", committed, len(msgs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
