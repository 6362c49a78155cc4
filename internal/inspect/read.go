package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/idkey"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/payment"
)

// Report is what the database knows of one idempotency key, route by route.
type Report struct {
	Key    string
	Routes []RouteReport
	// ReadAt is the time of the snapshot, the database's clock.
	ReadAt time.Time
}

// Known reports whether any route knows the key.
func (r Report) Known() bool {
	return slices.ContainsFunc(r.Routes, RouteReport.Known)
}

// RouteReport is what one route's tables hold of the key.
type RouteReport struct {
	Route Route
	// Inbox is the key's inbox row: its effect committed. Nil when there is none (never applied,
	// or purged once expired).
	Inbox *InboxRow
	// Parked are the messages of the key waiting in the park (one, unless it was produced twice
	// under one key at different offsets).
	Parked []ParkedRow
	// DeadLetters are the key's dead letters kept in dead_letters, because their dead-letter topic
	// refused them. Those the topic took are in Kafka only.
	DeadLetters []StoredLetter
	// Lease is the key's call lease (inbox_leases): a call under the key is out, or was made and not
	// recorded.
	Lease *LeaseRow

	// Payments routes: the payments rows and anomalies recorded under the key, the orders they (or
	// the key's parked and dead-lettered callbacks) name, and the provider transactions' bindings.
	Payments     []PaymentRow
	Anomalies    []AnomalyRow
	Orders       []OrderRow
	Transactions []TransactionRow
	// The order events of the outbox (migration 00011) belong here, read by the orders' numbers,
	// and shown after the orders (see paymentSections).

	// SMS routes: the key's notifications row.
	Notification *NotificationRow
}

// Known reports whether the route's tables hold anything of the key.
func (r RouteReport) Known() bool {
	return r.Inbox != nil || len(r.Parked) > 0 || len(r.DeadLetters) > 0 || r.Lease != nil ||
		len(r.Payments) > 0 || len(r.Anomalies) > 0 || r.Notification != nil
}

// InboxRow is the key's row in inbox.
type InboxRow struct {
	Topic       string
	Partition   int32
	Offset      int64
	ProcessedAt time.Time
	ExpiresAt   time.Time
}

// ParkedRow is a parked message of the key, with its retry history.
type ParkedRow struct {
	ID            int64
	Topic         string
	Partition     int32
	Offset        int64
	MessageKey    []byte
	Value         []byte
	Attempts      int
	Reason        string
	FirstError    string
	LastError     string
	FirstFailedAt *time.Time // nil: parked behind its key without having run
	BudgetSpent   time.Duration
	NextAttemptAt time.Time
	ParkedAt      time.Time
	HeldBy        string // the retrier holding it, until HeldUntil
	HeldUntil     *time.Time
	// Ahead counts the messages of its ordering key parked before it.
	Ahead int
}

// StoredLetter is a dead letter kept in dead_letters.
type StoredLetter struct {
	deadletter.Stored
	ReplayedAt *time.Time // nil: not replayed yet
}

// LeaseRow is the key's call lease.
type LeaseRow struct {
	Holder    string
	ExpiresAt time.Time
	Attempts  int
	TakenAt   time.Time
}

// PaymentRow is a payments row recorded under the key.
type PaymentRow struct {
	Provider, ProviderTxnID, OrderNo, Amount, Currency, Result string
	PaidAt                                                     *time.Time
	ReceivedAt                                                 time.Time
	// Source is where it came from: callback, or reconciliation (the provider's answer to the
	// worker's question); VerifiedBy the name of the key that verified its callback, "" when
	// callbacks are not verified.
	Source, VerifiedBy string
}

// AnomalyRow is a payment_anomalies row recorded under the key.
type AnomalyRow struct {
	OrderNo, Provider, ProviderTxnID, Kind string
	// What the order expected and the callback brought.
	ExpectedAmount, ExpectedCurrency, ReceivedAmount, ReceivedCurrency string
	CreatedAt                                                          time.Time
}

// OrderRow is an order the key's callbacks name (its user_id is left out).
type OrderRow struct {
	OrderNo, Status, Amount, Currency string
	ProviderTxnID                     *string
	PaidAt                            *time.Time
	UpdatedAt                         time.Time
}

// TransactionRow is a provider transaction's binding to one order and one amount.
type TransactionRow struct {
	Provider, ProviderTxnID, OrderNo, Amount, Currency string
	RecordedAt                                         time.Time
}

// NotificationRow is the key's notifications row; its recipient is masked when it is read. SentAt
// is nil for an SMS not sent on purpose (EXPIRED, SUPPRESSED).
type NotificationRow struct {
	Recipient, Template, Status string
	ProviderMessageID           *string
	Attempts                    int
	SentAt                      *time.Time
}

// read reads what every route of routes knows of key, in tx.
func read(ctx context.Context, tx pgx.Tx, key string, routes []Route) (Report, error) {
	r := Report{Key: key}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&r.ReadAt); err != nil {
		return Report{}, err
	}
	for _, route := range routes {
		rr := RouteReport{Route: route}
		if err := rr.read(ctx, tx, key); err != nil {
			return Report{}, fmt.Errorf("route %s: %w", route.Name, err)
		}
		r.Routes = append(r.Routes, rr)
	}
	return r, nil
}

// read fills r from the route's tables.
func (r *RouteReport) read(ctx context.Context, tx pgx.Tx, key string) error {
	steps := []func(context.Context, pgx.Tx, string) error{r.readInbox, r.readParked, r.readDeadLetters, r.readLease}
	switch r.Route.Kind {
	case Payments:
		steps = append(steps, r.readPayments, r.readOrders)
	case SMS:
		steps = append(steps, r.readNotification)
	}
	for _, step := range steps {
		if err := step(ctx, tx, key); err != nil {
			return err
		}
	}
	return nil
}

func (r *RouteReport) readInbox(ctx context.Context, tx pgx.Tx, key string) error {
	rows, _ := tx.Query(ctx, `
		SELECT topic, "partition", "offset", processed_at, expires_at
		FROM inbox WHERE handler = $1 AND idempotency_key = $2`, r.Route.Name, key)
	in, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByPos[InboxRow])
	if err != nil {
		return fmt.Errorf("read inbox: %w", err)
	}
	if len(in) > 0 {
		r.Inbox = in[0]
	}
	return nil
}

func (r *RouteReport) readParked(ctx context.Context, tx pgx.Tx, key string) error {
	rows, _ := tx.Query(ctx, `
		SELECT p.id, p.topic, p."partition", p."offset", p.message_key, p.value, p.attempts,
			coalesce(p.reason, ''), coalesce(p.first_error, ''), coalesce(p.last_error, ''), p.first_failed_at,
			(extract(epoch FROM p.budget_spent) * 1000000)::bigint * 1000, p.next_attempt_at, p.parked_at,
			coalesce(p.held_by, ''), p.held_until,
			(SELECT count(*) FROM inbox_parked a WHERE a.topic = p.topic AND a."partition" = p."partition"
				AND a.ordering_key = p.ordering_key AND a."offset" < p."offset")::int
		FROM inbox_parked p
		WHERE p.handler = $1 AND p.idempotency_key = $2
		ORDER BY p.id`, r.Route.Name, key)
	parked, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ParkedRow])
	if err != nil {
		return fmt.Errorf("read inbox_parked: %w", err)
	}
	r.Parked = parked
	return nil
}

// readDeadLetters reads the route's rows of dead_letters whose message has key as its idempotency
// key, by the contract's rule. Rows are first narrowed to those whose value or a header holds the
// key's bytes (the table has no column for the key); a key written with JSON escapes in event_id is
// missed by that, and is rare enough to be left to SQL.
func (r *RouteReport) readDeadLetters(ctx context.Context, tx pgx.Tx, key string) error {
	rows, err := tx.Query(ctx, `
		SELECT id, dlq_topic, original_topic, original_partition, original_offset, message_key, message_value,
			header_names, header_values, reason, error, attempts, failed_at, write_error, stored_at, replayed_at
		FROM dead_letters
		WHERE original_topic = $1 AND (position(convert_to($2, 'UTF8') IN coalesce(message_value, '')) > 0
			OR convert_to($2, 'UTF8') = ANY (header_values))
		ORDER BY id`, r.Route.Topic, key)
	if err != nil {
		return fmt.Errorf("read dead_letters: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var d StoredLetter
		var names, values [][]byte
		var reason string
		err := rows.Scan(&d.ID, &d.DLQTopic, &d.Letter.Topic, &d.Letter.Partition, &d.Letter.Offset,
			&d.Key, &d.Value, &names, &values, &reason, &d.Letter.Error, &d.Letter.Attempts,
			&d.Letter.FailedAt, &d.WriteError, &d.StoredAt, &d.ReplayedAt)
		if err != nil {
			return fmt.Errorf("read dead_letters: %w", err)
		}
		d.Letter.Reason = inboxtype.Reason(reason)
		for i := range min(len(names), len(values)) {
			d.Headers = append(d.Headers, kafka.Header{Key: string(names[i]), Value: values[i]})
		}
		_, original := deadletter.Read(d.Headers)
		k, _, err := idkey.Of(kafka.Message{Key: d.Key, Value: d.Value, Headers: original})
		if err == nil && k == key {
			r.DeadLetters = append(r.DeadLetters, d)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read dead_letters: %w", err)
	}
	return nil
}

func (r *RouteReport) readLease(ctx context.Context, tx pgx.Tx, key string) error {
	rows, _ := tx.Query(ctx, `
		SELECT holder, expires_at, attempts, taken_at
		FROM inbox_leases WHERE handler = $1 AND idempotency_key = $2`, r.Route.Name, key)
	leases, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByPos[LeaseRow])
	if err != nil {
		return fmt.Errorf("read inbox_leases: %w", err)
	}
	if len(leases) > 0 {
		r.Lease = leases[0]
	}
	return nil
}

// readPayments reads the payments rows and anomalies recorded under key. Neither table has an index
// on the key (one would cost every payment's write for a command an operator runs now and then):
// each is scanned.
func (r *RouteReport) readPayments(ctx context.Context, tx pgx.Tx, key string) error {
	rows, _ := tx.Query(ctx, `
		SELECT provider, provider_txn_id, order_no, amount::text, currency, result, paid_at, received_at,
			source, coalesce(verified_by, '')
		FROM payments WHERE idempotency_key = $1 ORDER BY id`, key)
	var err error
	if r.Payments, err = pgx.CollectRows(rows, pgx.RowToStructByPos[PaymentRow]); err != nil {
		return fmt.Errorf("read payments: %w", err)
	}
	rows, _ = tx.Query(ctx, `
		SELECT order_no, provider, provider_txn_id, kind,
			coalesce(detail->>'expected_amount', ''), coalesce(detail->>'expected_currency', ''),
			coalesce(detail->>'received_amount', ''), coalesce(detail->>'received_currency', ''), created_at
		FROM payment_anomalies WHERE detail->>'idempotency_key' = $1 ORDER BY id`, key)
	if r.Anomalies, err = pgx.CollectRows(rows, pgx.RowToStructByPos[AnomalyRow]); err != nil {
		return fmt.Errorf("read payment_anomalies: %w", err)
	}
	return nil
}

// readOrders reads the orders and provider transactions that the key's rows and messages name.
func (r *RouteReport) readOrders(ctx context.Context, tx pgx.Tx, _ string) error {
	orders, providers, txns := r.named()
	if len(orders) == 0 && len(txns) == 0 {
		return nil
	}
	rows, _ := tx.Query(ctx, `
		SELECT order_no, status, amount::text, currency, provider_txn_id, paid_at, updated_at
		FROM orders WHERE order_no = ANY ($1) ORDER BY order_no`, orders)
	var err error
	if r.Orders, err = pgx.CollectRows(rows, pgx.RowToStructByPos[OrderRow]); err != nil {
		return fmt.Errorf("read orders: %w", err)
	}
	rows, _ = tx.Query(ctx, `
		SELECT t.provider, t.provider_txn_id, t.order_no, t.amount::text, t.currency, t.recorded_at
		FROM payment_transactions t JOIN unnest($1::text[], $2::text[]) AS k(provider, provider_txn_id)
			USING (provider, provider_txn_id)
		ORDER BY 1, 2`, providers, txns)
	if r.Transactions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[TransactionRow]); err != nil {
		return fmt.Errorf("read payment_transactions: %w", err)
	}
	return nil
}

// named returns the order numbers and the provider transactions (as two columns) that the key's
// payments, anomalies, parked messages and dead letters name, each once.
func (r *RouteReport) named() (orders, providers, txns []string) {
	type txn struct{ provider, id string }
	seenOrder, seenTxn := map[string]bool{}, map[txn]bool{}
	add := func(orderNo, provider, id string) {
		if orderNo != "" && !seenOrder[orderNo] {
			seenOrder[orderNo] = true
			orders = append(orders, orderNo)
		}
		if t := (txn{provider, id}); provider != "" && id != "" && !seenTxn[t] {
			seenTxn[t] = true
			providers, txns = append(providers, provider), append(txns, id)
		}
	}
	for _, p := range r.Payments {
		add(p.OrderNo, p.Provider, p.ProviderTxnID)
	}
	for _, a := range r.Anomalies {
		add(a.OrderNo, a.Provider, a.ProviderTxnID)
	}
	for _, v := range r.values() {
		cb, _ := callbackOf(v)
		add(cb.OrderNo, cb.Provider, cb.ProviderTxnID)
	}
	return orders, providers, txns
}

// values are the message values the key's parked messages and dead letters hold.
func (r *RouteReport) values() [][]byte {
	var out [][]byte
	for _, p := range r.Parked {
		out = append(out, p.Value)
	}
	for _, d := range r.DeadLetters {
		out = append(out, d.Value)
	}
	return out
}

func (r *RouteReport) readNotification(ctx context.Context, tx pgx.Tx, key string) error {
	rows, _ := tx.Query(ctx, `
		SELECT recipient, template, status, provider_message_id, attempts, sent_at
		FROM notifications WHERE idempotency_key = $1`, key)
	ns, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByPos[NotificationRow])
	if err != nil {
		return fmt.Errorf("read notifications: %w", err)
	}
	if len(ns) > 0 {
		r.Notification = ns[0]
		r.Notification.Recipient = notify.MaskPhone(r.Notification.Recipient)
	}
	return nil
}

// callbackOf decodes a payment callback as the handler does; for one the handler refuses, it
// returns what its order_no, provider and provider_txn_id strings say, if anything, with the
// handler's error: a dead-lettered callback still names its order.
func callbackOf(value []byte) (payment.Callback, error) {
	cb, err := payment.Decode(value)
	if err == nil {
		return cb, nil
	}
	var names struct {
		OrderNo       string `json:"order_no"`
		Provider      string `json:"provider"`
		ProviderTxnID string `json:"provider_txn_id"`
	}
	_ = json.Unmarshal(value, &names) // whatever it could read
	return payment.Callback{OrderNo: names.OrderNo, Provider: names.Provider, ProviderTxnID: names.ProviderTxnID}, err
}
