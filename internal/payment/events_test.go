package payment_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/outbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/poll"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

const eventsTopic = "payments.events"

// wantEvents are the order events of each case of contractCases, in order: "type[/kind]
// provider/txn key=callback key".
var wantEvents = map[string][]string{
	"PendingSuccessPays":                     {"order.paid alipay/T1 key=k1"},
	"PendingFailedRecordsPayment":            {"payment.failed alipay/T1 key=k1"},
	"PendingAmountDiffers":                   {"payment.anomaly/amount_mismatch alipay/T1 key=k1"},
	"PendingCurrencyDiffers":                 {"payment.anomaly/amount_mismatch alipay/T1 key=k1"},
	"PaidBySameTransactionSuccess":           {"order.paid alipay/T1 key=k1"},
	"PaidBySameTransactionFailed":            {"order.paid alipay/T1 key=k1"},
	"PaidByOtherTransaction":                 {"order.paid alipay/T1 key=k1", "payment.anomaly/duplicate_payment alipay/T2 key=k2"},
	"PaidBySameTransactionIDOfOtherProvider": {"order.paid alipay/T1 key=k1", "payment.anomaly/duplicate_payment wechat/T1 key=k2"},
	"PaidOutsideTheWorker":                   {"payment.anomaly/duplicate_payment alipay/T1 key=k1"},
	"CancelledSuccess":                       {"payment.anomaly/paid_after_cancel alipay/T1 key=k1"},
	"PaidByOtherTransactionFailed":           {"order.paid alipay/T1 key=k1", "payment.failed alipay/T2 key=k2"},
	"CancelledFailed":                        {"payment.failed alipay/T1 key=k1"},
	"PendingFailedTwiceUnderNewKey":          {"payment.failed alipay/T1 key=k1"},
	"FailedThenSuccessOfSameTransaction":     {"payment.failed alipay/T1 key=k1", "order.paid alipay/T1 key=k2"},
	"FailedThenPaidByOtherThenSuccess": {"payment.failed alipay/T1 key=k1", "order.paid alipay/T2 key=k2",
		"payment.anomaly/duplicate_payment alipay/T1 key=k3"},
	"OneAnomalyPerTransaction": {"payment.anomaly/amount_mismatch alipay/T1 key=k1", "order.paid alipay/T2 key=k2"},
}

// withEvents gives e a handler that emits the order events to eventsTopic.
func (e *env) withEvents(t *testing.T) *env {
	t.Helper()
	h, err := payment.NewHandler(payment.Config{EventsTopic: eventsTopic, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	e.handler = h
	return e
}

// readEvents returns the order events of the outbox for orderNo, in the order they are published,
// as wantEvents writes them, checking each row against its payload.
func readEvents(t *testing.T, q querier, orderNo string) []string {
	t.Helper()
	rows, _ := q.Query(context.Background(), `
		SELECT id::text, topic, aggregatetype, aggregateid, type, payload::text FROM outbox_events
		WHERE aggregateid = $1 ORDER BY position`, orderNo)
	var out []string
	var id, topic, aggregateType, aggregateID, typ, payload string
	_, err := pgx.ForEachRow(rows, []any{&id, &topic, &aggregateType, &aggregateID, &typ, &payload}, func() error {
		var v payment.Event
		if err := json.Unmarshal([]byte(payload), &v); err != nil {
			return err
		}
		if want := outbox.EventID(v.Type, payment.EventCause(v.Provider, v.ProviderTxnID)); id != want || v.EventID != id {
			t.Errorf("event %s: id %s, event_id %s, want both %s", payload, id, v.EventID, want)
		}
		if topic != eventsTopic || aggregateType != "order" || aggregateID != v.OrderNo || typ != v.Type ||
			v.PaidAt.Format(time.RFC3339) != paidAt || v.Amount == "" || v.Currency == "" {
			t.Errorf("event %d %s: topic %s, aggregate %s/%s, type %s", len(out)+1, payload, topic, aggregateType,
				aggregateID, typ)
		}
		line := v.Type
		if v.Kind != "" {
			line += "/" + v.Kind
		}
		out = append(out, fmt.Sprintf("%s %s/%s key=%s", line, v.Provider, v.ProviderTxnID, v.CallbackKey))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEvents: every case of the contract, and of the cases it leaves open, emits its order events,
// one per callback applied and none for a duplicate; delivering every callback again, under its key
// and under a new one, emits nothing more.
func TestEvents(t *testing.T) {
	t.Parallel()
	for _, tc := range contractCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t).withEvents(t)
			createOrder(t, e.pool, "ORD-1", "99.90", "CNY", tc.order)
			for _, s := range tc.steps {
				e.mustDeliver(t, s.key, callback(t, s.changes), s.want)
			}
			if got := readEvents(t, e.pool, "ORD-1"); !slices.Equal(got, wantEvents[tc.name]) {
				t.Fatalf("events %q, want %q", got, wantEvents[tc.name])
			}
			for _, s := range tc.steps {
				e.mustDeliver(t, s.key, callback(t, s.changes), inbox.Duplicate)
				e.mustDeliver(t, "again-"+s.key, callback(t, s.changes), inbox.Duplicate)
			}
			if got := readEvents(t, e.pool, "ORD-1"); !slices.Equal(got, wantEvents[tc.name]) {
				t.Fatalf("events after the redeliveries %q, want %q", got, wantEvents[tc.name])
			}
		})
	}
}

// TestEventsOff: a handler without an events topic emits nothing.
func TestEventsOff(t *testing.T) {
	t.Parallel()
	e := setup(t)
	createOrder(t, e.pool, "ORD-1", "99.90", "CNY", "PENDING")
	createOrder(t, e.pool, "ORD-2", "99.90", "CNY", "PENDING")
	e.mustDeliver(t, "k1", callback(t, nil), inbox.Applied)
	got, err := e.deliverBatch(t, []delivery{{"k2", callback(t, map[string]any{"order_no": "ORD-2", "provider_txn_id": "T2"})}}, nil)
	if err != nil || got[0] != inbox.Applied {
		t.Fatalf("batch: %v, %v", got, err)
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d events (%v) with no events topic, want none", n, err)
	}
}

// TestEventsInOneBatch: every case in one batch (see TestContractInOneBatch) emits the events it
// emits alone, each order's in the same order; the batch redelivered emits nothing more.
func TestEventsInOneBatch(t *testing.T) {
	t.Parallel()
	e := setup(t).withEvents(t)
	var batch []delivery
	for _, tc := range contractCases {
		createOrder(t, e.pool, "ORD-"+tc.name, "99.90", "CNY", tc.order)
		for _, s := range tc.steps {
			changes := map[string]any{"order_no": "ORD-" + tc.name}
			for k, v := range s.changes {
				changes[k] = v
			}
			txn, _ := changes["provider_txn_id"].(string)
			changes["provider_txn_id"] = tc.name + "/" + cmpOr(txn, "T1")
			batch = append(batch, delivery{key: tc.name + "/" + s.key, value: callback(t, changes)})
		}
	}
	check := func(when string) {
		for _, tc := range contractCases {
			got := readEvents(t, e.pool, "ORD-"+tc.name)
			for i := range got {
				got[i] = strings.ReplaceAll(got[i], tc.name+"/", "")
			}
			if !slices.Equal(got, wantEvents[tc.name]) {
				t.Errorf("%s %s: events %q, want %q", tc.name, when, got, wantEvents[tc.name])
			}
		}
	}
	if _, err := e.deliverBatch(t, batch, nil); err != nil {
		t.Fatal(err)
	}
	check("in one batch")
	if _, err := e.deliverBatch(t, batch, nil); err != nil {
		t.Fatal(err)
	}
	check("after the batch's redelivery")
}

// TestEventsOfRetriedBatch: batches rolled back by a bad callback among them, and applied again
// without it, through the consumer with a relay publishing to the events topic: each callback
// applied has its event on the topic once, with the order number as key and the event id as
// Idempotency-Key; the bad callbacks and the duplicates have none.
func TestEventsOfRetriedBatch(t *testing.T) {
	t.Parallel()
	const topic, dlqTopic, partitions, orders = "payments.callbacks", "payments.callbacks.dlq", 2, 120
	e := setup(t).withEvents(t)
	broker := kafkatest.Start(t, partitions, topic, dlqTopic, eventsTopic)
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO orders (order_no, user_id, amount, currency)
		SELECT 'B-' || i, 'user-1', 99.90, 'CNY' FROM generate_series(1, $1) AS i`, orders); err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	want := map[string]string{} // order → the id of its order.paid
	for i := 1; i <= orders; i++ {
		orderNo := fmt.Sprintf("B-%d", i)
		txn := fmt.Sprintf("T-%d", i)
		ok := kafka.Message{Key: []byte(orderNo), Value: callback(t, map[string]any{
			"event_id": "e-" + orderNo, "order_no": orderNo, "provider_txn_id": txn})}
		msgs = append(msgs, ok, ok)
		want[orderNo] = outbox.EventID(payment.EventOrderPaid, payment.EventCause("alipay", txn))
		if i%10 == 0 { // a bad callback in the middle of every batch: it rolls its batch back
			msgs = append(msgs, kafka.Message{Key: []byte(orderNo), Value: []byte(`{"event_id":"bad-` + orderNo + `"}`)})
		}
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: e.pool, Brokers: []string{broker.Addr},
		PollInterval: 10 * time.Millisecond, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(ctx) }()
	defer func() { stop(); <-done }()

	c, err := consumer.New(consumer.Config{
		Brokers: []string{broker.Addr}, GroupID: "payments-test",
		Routes:       []consumer.Route{{Topic: topic, Name: "payments", Handler: e.handler}},
		Transactions: consumer.PerBatch, BatchWait: 20 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second, Store: e.store, DeadLetters: deadletter.NewStore(e.pool),
		Metrics: consumer.NewMetrics(prometheus.NewRegistry()), Logger: testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	consumeAll(t, c, broker, topic, partitions, msgs, 120*time.Second)
	var got []kafka.Message
	deadline := time.Now().Add(poll.Timeout)
	for len(got) < orders && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		got = nil
		for p := range partitions {
			got = append(got, broker.ReadAll(t, eventsTopic, p)...)
		}
	}
	seen := map[string]int{}
	for _, m := range got {
		var v payment.Event
		if err := json.Unmarshal(m.Value, &v); err != nil {
			t.Fatal(err)
		}
		key := kafkatest.Header(m, "Idempotency-Key")
		if string(m.Key) != v.OrderNo || key != want[v.OrderNo] || v.EventID != key || v.Type != payment.EventOrderPaid {
			t.Errorf("event %s with key %s and Idempotency-Key %s, want order.paid keyed %s with id %s", m.Value,
				m.Key, key, v.OrderNo, want[v.OrderNo])
		}
		seen[v.OrderNo]++
	}
	for orderNo := range want {
		if seen[orderNo] != 1 {
			t.Errorf("%s: %d order.paid events, want 1", orderNo, seen[orderNo])
		}
	}
	dead := 0
	for p := range partitions {
		dead += len(broker.ReadAll(t, dlqTopic, p))
	}
	if dead != orders/10 {
		t.Errorf("%d dead letters, want the %d bad callbacks'", dead, orders/10)
	}
}
