// Package demo is the scenario of `worker demo`: a generated stream of payment callbacks and SMS
// events with redeliveries, retries and bad messages, played against a running worker, then a
// summary read from the database and the dead-letter topics, checked against the consumer's metrics.
//
// It seeds orders and reads the business tables of its own schema (orders, payments, notifications;
// the anomalies through payment.CountAnomalies, which the metrics share) directly: it is a fixture
// and a report, like a test, not business logic, and its queries (a callback applied is a row of
// payments or payment_anomalies under its key) state what the demo shows, not what the worker does.
// It does not start the broker or the worker: package cli wires those.
package demo

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/redact"
)

// Schema holds the demo's tables and orders. It is dropped and recreated on every run.
const Schema = "inboxworker_demo"

// Timeout bounds the whole demo: it finishes in seconds, so a minute means something is wrong.
const Timeout = time.Minute

// lateOrder is the order the demo creates only once the worker has retried its callback.
const lateOrder = "DEMO-1005"

// chainOrder is the order of the end-to-end chain: its callback (chainKey), delivered four times, pays it once,
// emits one order.paid, and sends one payment-received SMS to receiptPhone.
const (
	chainOrder   = "DEMO-1001"
	chainKey     = "pay-1001-a"
	receiptPhone = "+8613700137001"
)

// Config is what the scenario plays against.
type Config struct {
	// Broker is the embedded broker's address. Required.
	Broker string
	// Partitions is how many partitions each topic has. Required.
	Partitions int
	// GroupID is the worker's consumer group. Required.
	GroupID string
	// TopicPayments, TopicSMS and DLQSuffix are the worker's topics. Required.
	TopicPayments string
	TopicSMS      string
	DLQSuffix     string
	// TopicPaymentEvents is where the order events go, and the payment-received SMS come from;
	// empty when they are off.
	TopicPaymentEvents string
	// EventsInbox is the inbox name of the order events' route.
	EventsInbox string
	// PaymentsInbox is the inbox name of the payment callbacks' route. Required.
	PaymentsInbox string
	// Pool is a pool on Schema, migrated. Required.
	Pool *pgxpool.Pool
	// DatabaseURL is where Pool connects, for the hint at the end (its password masked).
	DatabaseURL string
	// Metrics is the worker's registry: the scenario waits for its retries and checks its counts.
	Metrics prometheus.Gatherer
	// Out receives what a person reads. Required.
	Out io.Writer
}

// Outcomes are the consumer's message counts, by "topic/outcome".
type Outcomes map[string]float64

// Play produces the stream, creates the late order once the worker has retried its callback, and
// waits until the consumer group has committed every message. It returns the consumer's counts.
func Play(ctx context.Context, cfg Config) (Outcomes, error) {
	client, closeClient := localClient(cfg.Broker)
	defer closeClient()
	stream := generate(cfg)
	out, pool, reg := cfg.Out, cfg.Pool, cfg.Metrics

	fmt.Fprintf(out, "Producing %d messages: payment callbacks and SMS events, with redeliveries and bad messages.\n", len(stream))
	if err := produce(ctx, cfg.Broker, stream); err != nil {
		return nil, err
	}

	// The callback for the late order is retried until its order exists: create it once a retry
	// has been seen, as an order service that commits a moment after its payment starts would.
	if err := poll(ctx, func() (bool, error) { return counterSum(reg, "inboxworker_retries_total") > 0, nil }); err != nil {
		return nil, fmt.Errorf("waiting for the worker to retry the callback of %s: %w", lateOrder, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ($1, 'u-5', 88.00, 'CNY', 'PENDING')`, lateOrder); err != nil {
		return nil, fmt.Errorf("create order %s: %w", lateOrder, err)
	}
	fmt.Fprintf(out, "Order %s created after its callback arrived; the worker's retry applies it.\n", lateOrder)

	if err := poll(ctx, func() (bool, error) {
		var status string
		err := pool.QueryRow(ctx, `SELECT status FROM orders WHERE order_no = $1`, lostOrder).Scan(&status)
		return status == "PAID", err
	}); err != nil {
		return nil, fmt.Errorf("waiting for reconciliation to find the payment of %s: %w", lostOrder, err)
	}
	fmt.Fprintf(out, "Order %s's callback never came; reconciliation asked the provider, which says it was paid.\n", lostOrder)

	if err := poll(ctx, func() (bool, error) { return settled(ctx, client, cfg) }); err != nil {
		return nil, fmt.Errorf("waiting for the worker to commit every message: %w", err)
	}
	return counterByLabels(reg, "inboxworker_messages_total", "topic", "outcome"), nil
}

// Report reads the summary from the database and the dead-letter topics and prints it, with
// whether outcomes, the consumer's own counts, agree with it.
func Report(ctx context.Context, cfg Config, outcomes Outcomes) error {
	sum, err := readSummary(ctx, cfg)
	if err != nil {
		return err
	}
	sum.outcomes = outcomes
	sum.print(cfg)
	return nil
}

// topics are the topics the demo reads: the consumed ones, the order events' among them.
func (cfg Config) topics() []string {
	if cfg.TopicPaymentEvents == "" {
		return []string{cfg.TopicPayments, cfg.TopicSMS}
	}
	return []string{cfg.TopicPayments, cfg.TopicPaymentEvents, cfg.TopicSMS}
}

// settled reports whether the chain of the stream has come to its end: the outbox has nothing
// waiting, the group has committed every message of every topic, and the outbox has nothing waiting
// still, with no event emitted between the two looks (a message consumed between them may emit one,
// which the relay then publishes).
func settled(ctx context.Context, client *kafka.Client, cfg Config) (bool, error) {
	before, waiting, err := outboxCounts(ctx, cfg.Pool)
	if err != nil || waiting > 0 {
		return false, err
	}
	if done, err := caughtUp(ctx, client, cfg.GroupID, cfg.Partitions, cfg.topics()); err != nil || !done {
		return false, err
	}
	after, waiting, err := outboxCounts(ctx, cfg.Pool)
	return err == nil && waiting == 0 && after == before, err
}

// outboxCounts returns how many events the outbox holds, and how many of them wait.
func outboxCounts(ctx context.Context, pool *pgxpool.Pool) (total, waiting int, err error) {
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events), (SELECT count(*) FROM outbox_waiting)`).
		Scan(&total, &waiting)
	return total, waiting, err
}

// localClient is a kafka-go client of the embedded broker. Call the returned function when done.
func localClient(addr string) (*kafka.Client, func()) {
	transport := &kafka.Transport{ClientID: "inboxworker-demo"}
	return &kafka.Client{Addr: kafka.TCP(addr), Transport: transport, Timeout: 10 * time.Second},
		transport.CloseIdleConnections
}

// A demoMessage is one message of the generated stream, with what should become of it.
type demoMessage struct {
	topic   string
	key     string // Kafka message key: the order number or the phone number
	idemKey string // Idempotency-Key header, when set
	value   string
}

// generate is the generated stream: every row of the contract's payment table, redeliveries, a
// provider resend, bad messages; SMS with redeliveries and a bad number.
func generate(cfg Config) []demoMessage {
	pay := func(orderNo, key, txn, amount, result string) demoMessage {
		v, _ := json.Marshal(map[string]string{
			"event_id": key, "order_no": orderNo, "provider": "alipay", "provider_txn_id": txn,
			"amount": amount, "currency": "CNY", "result": result, "paid_at": "2025-06-01T12:00:00Z",
		})
		return demoMessage{topic: cfg.TopicPayments, key: orderNo, idemKey: key, value: string(v)}
	}
	sms := func(key, phone, template string, params map[string]string) demoMessage {
		v, _ := json.Marshal(map[string]any{"event_id": key, "phone": phone, "template": template, "params": params})
		// The key travels in the body's event_id only: the worker falls back to it.
		return demoMessage{topic: cfg.TopicSMS, key: phone, value: string(v)}
	}
	paid := pay(chainOrder, chainKey, "T-1001", "99.90", "SUCCESS")
	resendOf1002 := pay("DEMO-1002", "pay-1002-b", "T-1002", "45.00", "SUCCESS")
	reused := pay("DEMO-1002", "pay-1002-a", "T-1002", "54.00", "SUCCESS")
	code := sms("sms-1", "+8613800138000", "verify_code", map[string]string{"code": "123456"})
	shipped := sms("sms-2", "+8613900139000", "order_shipped", map[string]string{"order_no": "DEMO-1001"})
	return []demoMessage{
		paid, paid, paid, paid, // applied once, then three redeliveries: one PAID, one event, one SMS
		pay("DEMO-1002", "pay-1002-a", "T-1002", "45.00", "SUCCESS"),
		resendOf1002, // the provider resends T-1002 under a new key: duplicate
		reused,       // a known key with another payload: dead-lettered
		pay("DEMO-1003", "pay-1003-a", "T-1003", "20.00", "SUCCESS"),   // a cancelled order: paid_after_cancel
		pay("DEMO-1004", "pay-1004-a", "T-1004", "100.00", "SUCCESS"),  // expected 10.00: amount_mismatch
		pay(lateOrder, "pay-1005-a", "T-1005", "88.00", "SUCCESS"),     // the order does not exist yet
		pay("DEMO-1006", "pay-1006-a", "T-1006", "15.50", "FAILED"),    // a failed payment is recorded
		pay("DEMO-1001", "pay-1001-b", "T-1001-X", "99.90", "SUCCESS"), // paid twice: duplicate_payment
		{topic: cfg.TopicPayments, key: "DEMO-1007", idemKey: "pay-1007-a", value: `{"event_id":"pay-1007-a","order_no":`},
		{topic: cfg.TopicPayments, key: "DEMO-1008", value: `{"order_no":"DEMO-1008","result":"SUCCESS"}`},
		code, code, code,
		shipped, shipped,
		sms("sms-3", "13800138000", "verify_code", map[string]string{"code": "654321"}), // not E.164
		sms("sms-4", "+14155550123", "verify_code", map[string]string{"code": "111222"}),
	}
}

// ResetSchema drops Schema and creates it empty, for the migrations to fill.
func ResetSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+Schema+" CASCADE; CREATE SCHEMA "+Schema)
	if err != nil {
		return fmt.Errorf("demo: recreate schema %s: %w", Schema, err)
	}
	return nil
}

// CreateOrders creates the orders the stream pays, but the late one, in the migrated Schema.
func CreateOrders(ctx context.Context, pool *pgxpool.Pool) error {
	// DEMO-1001's customer gets a payment-received SMS once it is paid; the other orders have no
	// phone, and get none.
	_, err := pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status, phone) VALUES
		('DEMO-1001', 'u-1', 99.90, 'CNY', 'PENDING', '`+receiptPhone+`'),
		('DEMO-1002', 'u-2', 45.00, 'CNY', 'PENDING', NULL),
		('DEMO-1003', 'u-3', 20.00, 'CNY', 'CANCELLED', NULL),
		('DEMO-1004', 'u-4', 10.00, 'CNY', 'PENDING', NULL),
		('DEMO-1006', 'u-6', 15.50, 'CNY', 'PENDING', NULL)`)
	if err != nil {
		return fmt.Errorf("demo: create orders: %w", err)
	}
	// The lost order, paid an hour ago: its callback never comes.
	if _, err := pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, created_at)
		VALUES ($1, 'u-7', 30.00, 'CNY', now() - interval '1 hour')`, lostOrder); err != nil {
		return fmt.Errorf("demo: create orders: %w", err)
	}
	return nil
}

func produce(ctx context.Context, addr string, stream []demoMessage) error {
	transport := &kafka.Transport{ClientID: "inboxworker-demo"}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(addr),
		Transport:    transport,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    len(stream),
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	msgs := make([]kafka.Message, len(stream))
	for i, m := range stream {
		msgs[i] = kafka.Message{Topic: m.topic, Key: []byte(m.key), Value: []byte(m.value)}
		if m.idemKey != "" {
			msgs[i].Headers = []kafka.Header{{Key: "Idempotency-Key", Value: []byte(m.idemKey)}}
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	return nil
}

// poll calls done every 50ms until it reports true, fails or ctx ends.
func poll(ctx context.Context, done func() (bool, error)) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
}

// counterSum returns the sum of every series of the named counter in reg.
func counterSum(reg prometheus.Gatherer, name string) float64 {
	families, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// counterByLabels returns the named counter's values keyed by the given labels' values, joined by "/".
func counterByLabels(reg prometheus.Gatherer, name string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	families, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var key []string
			for _, l := range labels {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == l {
						key = append(key, lp.GetValue())
					}
				}
			}
			out[strings.Join(key, "/")] += m.GetCounter().GetValue()
		}
	}
	return out
}

// endOffsets returns the end offset of every partition of topics.
func endOffsets(ctx context.Context, client *kafka.Client, partitions int, topics []string) (map[string]map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range topics {
		for p := range partitions {
			req.Topics[t] = append(req.Topics[t], kafka.LastOffsetOf(p))
		}
	}
	resp, err := client.ListOffsets(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]map[int]int64{}
	for t, parts := range resp.Topics {
		out[t] = map[int]int64{}
		for _, p := range parts {
			if p.Error != nil {
				return nil, p.Error
			}
			out[t][p.Partition] = p.LastOffset
		}
	}
	return out, nil
}

// caughtUp reports whether group has committed the end offset of every partition of topics.
func caughtUp(ctx context.Context, client *kafka.Client, group string, partitions int, topics []string) (bool, error) {
	ends, err := endOffsets(ctx, client, partitions, topics)
	if err != nil {
		return false, err
	}
	req := &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{}}
	for _, t := range topics {
		req.Topics[t] = slices.Collect(maps.Keys(ends[t]))
	}
	resp, err := client.OffsetFetch(ctx, req)
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		return false, err
	}
	for _, t := range topics {
		committed := map[int]int64{}
		for _, p := range resp.Topics[t] {
			committed[p.Partition] = p.CommittedOffset
		}
		for p, end := range ends[t] {
			if end > 0 && committed[p] < end {
				return false, nil
			}
		}
	}
	return true, nil
}

// deadLetterReasons reads every message of the dead-letter topic, and the dead letters it refused,
// which the worker kept in the table dead_letters, and counts them by their reason.
func deadLetterReasons(ctx context.Context, client *kafka.Client, pool *pgxpool.Pool, partitions int,
	topic string) (map[string]int, error) {
	ends, err := endOffsets(ctx, client, partitions, []string{topic})
	if err != nil {
		return nil, err
	}
	reasons := map[string]int{}
	err = deadletter.NewStore(pool).Pending(ctx, topic, func(d deadletter.Stored) (bool, error) {
		reasons[string(d.Letter.Reason)]++
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	err = records(ctx, client, ends[topic], topic, func(r kafka.Record) {
		letter, _ := deadletter.Read(r.Headers)
		reasons[cmp.Or(string(letter.Reason), "(no "+deadletter.HeaderReason+")")]++
	})
	if err != nil {
		return nil, err
	}
	return reasons, nil
}

// records calls fn with every record of topic's partitions, up to their end offsets ends.
func records(ctx context.Context, client *kafka.Client, ends map[int]int64, topic string, fn func(kafka.Record)) error {
	for p, end := range ends {
		for offset := int64(0); offset < end; {
			resp, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: p, Offset: offset,
				MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
			if err == nil {
				err = resp.Error
			}
			if err != nil {
				return fmt.Errorf("read %s/%d: %w", topic, p, err)
			}
			for {
				r, err := resp.Records.ReadRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return fmt.Errorf("read %s/%d: %w", topic, p, err)
				}
				fn(*r)
				offset = r.Offset + 1
			}
		}
	}
	return nil
}

// chain is what became of the chain order's callback, end to end.
type chain struct {
	deliveries int    // of its callback, on the payments topic
	status     string // of the order
	events     int    // order.paid events of the order on the events topic
	sms        int    // payment-received SMS sent to its customer
}

// readChain reads the chain order's story from the topics and the database.
func readChain(ctx context.Context, client *kafka.Client, cfg Config) (chain, error) {
	var c chain
	ends, err := endOffsets(ctx, client, cfg.Partitions, []string{cfg.TopicPayments, cfg.TopicPaymentEvents})
	if err != nil {
		return c, err
	}
	err = records(ctx, client, ends[cfg.TopicPayments], cfg.TopicPayments, func(r kafka.Record) {
		for _, h := range r.Headers {
			if h.Key == "Idempotency-Key" && string(h.Value) == chainKey {
				c.deliveries++
			}
		}
	})
	if err != nil {
		return c, err
	}
	err = records(ctx, client, ends[cfg.TopicPaymentEvents], cfg.TopicPaymentEvents, func(r kafka.Record) {
		var e payment.Event
		if json.Unmarshal(readBytes(r.Value), &e) == nil && e.OrderNo == chainOrder && e.Type == payment.EventOrderPaid {
			c.events++
		}
	})
	if err != nil {
		return c, err
	}
	err = cfg.Pool.QueryRow(ctx, `SELECT (SELECT status FROM orders WHERE order_no = $1),
		(SELECT count(*) FROM notifications WHERE recipient = $2 AND template = 'payment_received' AND status = 'SENT')`,
		chainOrder, receiptPhone).Scan(&c.status, &c.sms)
	return c, err
}

// readBytes reads a record's key or value; nil reads as empty.
func readBytes(b kafka.Bytes) []byte {
	if b == nil {
		return nil
	}
	defer b.Close()
	out, _ := io.ReadAll(b)
	return out
}

// summary is what the demo reports, read from the database and the dead-letter topics.
type summary struct {
	received     map[string]int // by topic
	applied      map[string]int
	deadLettered map[string]map[string]int // by topic, then reason
	anomalies    map[string]int            // by kind
	smsSent      int
	orders       [][2]string // order number, status
	chain        chain
	reconciled   []string // orders paid from the provider's answer, their callbacks lost
	// outcomes are the consumer's own counts, by "topic/outcome", to check the summary against.
	outcomes Outcomes
}

func (s *summary) total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// readSummary reads what the demo reports: what each topic received and dead-lettered from the
// broker, and what was applied, the anomalies and the orders from the database.
func readSummary(ctx context.Context, cfg Config) (*summary, error) {
	client, closeClient := localClient(cfg.Broker)
	defer closeClient()
	s := &summary{received: map[string]int{}, applied: map[string]int{}, deadLettered: map[string]map[string]int{},
		anomalies: map[string]int{}}
	if err := s.readTopics(ctx, client, cfg); err != nil {
		return nil, err
	}
	if err := s.readApplied(ctx, client, cfg); err != nil {
		return nil, err
	}
	if err := s.readAnomalies(ctx, cfg.Pool); err != nil {
		return nil, err
	}
	if err := s.readOrders(ctx, cfg.Pool); err != nil {
		return nil, err
	}
	if err := s.readReconciled(ctx, cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// readTopics counts the records each topic received (the sum of its partitions' end offsets) and
// those its dead-letter topic holds, by reason.
func (s *summary) readTopics(ctx context.Context, client *kafka.Client, cfg Config) error {
	ends, err := endOffsets(ctx, client, cfg.Partitions, cfg.topics())
	if err != nil {
		return err
	}
	for t, parts := range ends {
		for _, end := range parts {
			s.received[t] += int(end)
		}
	}
	for _, t := range cfg.topics() {
		if s.deadLettered[t], err = deadLetterReasons(ctx, client, cfg.Pool, cfg.Partitions, t+cfg.DLQSuffix); err != nil {
			return err
		}
	}
	return nil
}

// readApplied counts the messages each topic had applied, each by the rows its handler leaves,
// and reads the chain of an order's events when the demo has them.
func (s *summary) readApplied(ctx context.Context, client *kafka.Client, cfg Config) error {
	pool := cfg.Pool
	if cfg.TopicPaymentEvents != "" {
		// An order event applied is an inbox row of the route that reads them.
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE handler = $1`, cfg.EventsInbox).Scan(&n); err != nil {
			return err
		}
		s.applied[cfg.TopicPaymentEvents] = n
		chain, err := readChain(ctx, client, cfg)
		if err != nil {
			return err
		}
		s.chain = chain
	}

	// An applied callback leaves exactly one row: a payment (the order paid, or a failed payment
	// recorded) or an anomaly, each naming the idempotency key it was applied under.
	var payments int
	err := pool.QueryRow(ctx, `
		SELECT count(*) FROM inbox WHERE handler = $1 AND idempotency_key IN (
			SELECT idempotency_key FROM payments
			UNION SELECT detail->>'idempotency_key' FROM payment_anomalies)`, cfg.PaymentsInbox).Scan(&payments)
	if err != nil {
		return err
	}
	s.applied[cfg.TopicPayments] = payments
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE status = 'SENT'`).Scan(&s.smsSent); err != nil {
		return err
	}
	s.applied[cfg.TopicSMS] = s.smsSent
	return nil
}

// readAnomalies counts the anomalies recorded, by kind, leaving out the kinds with none.
func (s *summary) readAnomalies(ctx context.Context, pool *pgxpool.Pool) error {
	anomalies, err := payment.CountAnomalies(ctx, pool)
	if err != nil {
		return err
	}
	for kind, n := range anomalies {
		if n.Rows > 0 {
			s.anomalies[kind] = int(n.Rows)
		}
	}
	return nil
}

// readOrders reads every order's number and status, in order-number order.
func (s *summary) readOrders(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT order_no, status FROM orders ORDER BY order_no`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var o [2]string
		if err := rows.Scan(&o[0], &o[1]); err != nil {
			return err
		}
		s.orders = append(s.orders, o)
	}
	return rows.Err()
}

func (s *summary) print(cfg Config) {
	w := cfg.Out
	fmt.Fprintf(w, "\nSummary (from the database and the dead-letter topics):\n\n")
	header := []string{"topic", "received", "applied", "duplicates skipped", "anomalies", "dead-lettered", "SMS sent"}
	rows := [][]string{header}
	for _, t := range cfg.topics() {
		dead := s.total(s.deadLettered[t])
		anomalies, sent := "-", "-"
		switch t {
		case cfg.TopicPayments:
			anomalies = fmt.Sprint(s.total(s.anomalies))
		case cfg.TopicSMS:
			sent = fmt.Sprint(s.smsSent)
		}
		rows = append(rows, []string{t, fmt.Sprint(s.received[t]), fmt.Sprint(s.applied[t]),
			fmt.Sprint(s.received[t] - s.applied[t] - dead), anomalies, fmt.Sprint(dead), sent})
	}
	printTable(w, rows)
	fmt.Fprintln(w, "\nApplied counts the anomalies: a callback on a cancelled or already paid order is applied by")
	fmt.Fprintln(w, "recording its anomaly (a refund to review), never by changing the order.")
	fmt.Fprintf(w, "Anomalies (refunds to review): %s\n", countList(s.anomalies))
	for _, t := range cfg.topics() {
		fmt.Fprintf(w, "Dead letters in %s: %s\n", t+cfg.DLQSuffix, countList(s.deadLettered[t]))
	}
	if cfg.TopicPaymentEvents != "" {
		c := s.chain
		fmt.Fprintf(w, "End to end: %s's callback delivered %d times -> order %s, %d order.paid event on %s, "+
			"%d payment_received SMS sent\n", chainOrder, c.deliveries, c.status, c.events, cfg.TopicPaymentEvents, c.sms)
	}
	fmt.Fprintf(w, "Found by reconciliation, their callbacks lost: %s\n", cmp.Or(strings.Join(s.reconciled, ", "), "none"))
	var differ []string
	for _, t := range cfg.topics() {
		dead := s.total(s.deadLettered[t])
		want := map[string]int{"applied": s.applied[t], "duplicate": s.received[t] - s.applied[t] - dead,
			"dead_lettered": dead}
		for _, outcome := range []string{"applied", "duplicate", "dead_lettered"} {
			if got := int(s.outcomes[t+"/"+outcome]); got != want[outcome] {
				differ = append(differ, fmt.Sprintf("%s %s %d", t, outcome, got))
			}
		}
	}
	if len(differ) == 0 {
		fmt.Fprintln(w, "The consumer's metrics (inboxworker_messages_total) agree with these counts.")
	} else {
		fmt.Fprintf(w, "The consumer's metrics differ from these counts: %s\n", strings.Join(differ, ", "))
	}
	var orders []string
	for _, o := range s.orders {
		orders = append(orders, o[0]+" "+o[1])
	}
	fmt.Fprintf(w, "Orders: %s\n", strings.Join(orders, ", "))
	fmt.Fprintf(w, "\nThe tables are kept in schema %s until the next run, e.g.:\n"+
		"  psql '%s' -c 'SET search_path = %s' -c 'SELECT * FROM payment_anomalies'\n", Schema, redact.URL(cfg.DatabaseURL), Schema)
}

// printTable prints rows in columns: the first left-aligned, the others right-aligned.
func printTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, cell := range r {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, r := range rows {
		line := fmt.Sprintf("  %-*s", widths[0], r[0])
		for i, cell := range r[1:] {
			line += fmt.Sprintf("  %*s", widths[i+1], cell)
		}
		fmt.Fprintln(w, line)
	}
}

func countList(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
