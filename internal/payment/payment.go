// Package payment applies payment callbacks to orders: the order state machine of the contract.
//
// Handler.Handle decodes a callback strictly (see Decode) and applies it through the inbox
// transaction it is given, so the inbox row, the order update, the payments row and any anomaly
// commit together or not at all. An order only ever moves PENDING → PAID, by one conditional UPDATE
// (never read-then-write); a callback that cannot pay the order is recorded for a person as a
// payment_anomalies row (amount_mismatch, duplicate_payment, paid_after_cancel) and the order is left
// as it is. A provider transaction already recorded, under whatever idempotency key, is reported as
// inbox.ErrAlreadyApplied, with nothing written.
//
// The rules, where the contract's table is silent:
//   - A FAILED callback never changes an order. On any existing order it is recorded as a payments
//     row with result FAILED, unless that provider transaction already has a row (or paid the order):
//     then it is a duplicate.
//   - A SUCCESS for a provider transaction first recorded as FAILED on the same order (a provider
//     retrying one payment intent) pays the order if it is still PENDING and matches, and its payments
//     row becomes SUCCESS: one row per provider transaction, holding its final result.
//   - One anomaly per provider transaction: a transaction already flagged (of any kind) is not flagged
//     again, so one received payment is never refunded twice.
//   - "Paid by the same provider_txn_id" means the order's provider_txn_id matches and the payments
//     row that paid it, if any, is the same provider's.
//   - A provider transaction already recorded for another order cannot pay this one: the callback is
//     refused (invalid_payload, naming provider_txn_id) for a person to look at.
//   - An unknown order is retryable with reason unknown_order, whatever the result.
//
// Handler.HandleBatch applies a batch of callbacks in one transaction with the same results: the
// common case, a SUCCESS that pays a PENDING order, for the whole batch in one statement, and every
// other callback as Handle does, in order.
//
// payment does not retry, dead-letter, count or know Kafka: it returns nil (applied),
// inbox.ErrAlreadyApplied (duplicate) or an error classified with package fault, and its caller does
// the rest. It does not create, cancel or refund orders; it does not check currencies against the
// ISO 4217 list, only their shape.
package payment

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// Config configures a Handler.
type Config struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Handler applies payment callbacks. It is safe for concurrent use.
type Handler struct {
	logger *slog.Logger
}

// NewHandler returns a Handler.
func NewHandler(config Config) (*Handler, error) {
	return &Handler{logger: cmp.Or(config.Logger, slog.Default())}, nil
}

// Anomaly kinds, as stored in payment_anomalies.kind.
const (
	AmountMismatch   = "amount_mismatch"
	DuplicatePayment = "duplicate_payment"
	PaidAfterCancel  = "paid_after_cancel"
)

// Order statuses, as stored in orders.status.
const (
	statusPending   = "PENDING"
	statusPaid      = "PAID"
	statusCancelled = "CANCELLED"
)

// Handle applies the callback in d.Value through tx, the inbox transaction of d.Key. It returns nil
// when the callback was applied (the order paid, a FAILED payment recorded or an anomaly recorded),
// inbox.ErrAlreadyApplied when its provider transaction had already been applied, having written
// nothing, or a classified error: invalid_payload (permanent), unknown_order (retryable), or a
// Postgres error classified by inbox.Classify.
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	cb, err := Decode(d.Value)
	if err != nil {
		return err
	}
	return h.apply(ctx, tx, d.Key, cb)
}

// apply applies the decoded callback cb, whose idempotency key is key, through tx.
func (h *Handler) apply(ctx context.Context, tx pgx.Tx, key string, cb Callback) error {
	a := &application{tx: tx, cb: cb, key: key}
	var effect string
	var err error
	if cb.Result == Success {
		effect, err = a.success(ctx)
	} else {
		effect, err = a.failed(ctx)
	}

	attrs := []slog.Attr{
		slog.String("order_no", cb.OrderNo), slog.String("provider", cb.Provider),
		slog.String("provider_txn_id", cb.ProviderTxnID), slog.String("result", string(cb.Result)),
		slog.String("idempotency_key", key),
	}
	switch {
	case errors.Is(err, inbox.ErrAlreadyApplied):
		h.logger.LogAttrs(ctx, slog.LevelDebug, "payment callback already applied", attrs...)
	case err != nil:
		return err
	case effect == AmountMismatch || effect == DuplicatePayment || effect == PaidAfterCancel:
		h.logger.LogAttrs(ctx, slog.LevelWarn, "payment anomaly recorded",
			append(attrs, slog.String("anomaly", effect))...)
	default:
		h.logger.LogAttrs(ctx, slog.LevelDebug, "payment callback applied",
			append(attrs, slog.String("effect", effect))...)
	}
	return err
}

// application is one callback being applied in one transaction.
type application struct {
	tx  pgx.Tx
	cb  Callback
	key string
}

// Effects that are not anomalies, for the log.
const (
	effectPaid           = "order_paid"
	effectFailedRecorded = "failed_payment_recorded"
)

const markPaidSQL = `
UPDATE orders
SET status = 'PAID', paid_at = $4, provider_txn_id = $5, updated_at = now()
WHERE order_no = $1 AND status = 'PENDING' AND amount = $2::numeric AND currency = $3`

// success applies a SUCCESS callback. The conditional UPDATE is the state change; it takes the
// order's row lock, so concurrent callbacks for one order queue behind each other, and a loser's
// UPDATE re-checks the winner's committed row and touches nothing. Only then, and in new statements
// (which in READ COMMITTED see what the winner committed), does it find out why.
func (a *application) success(ctx context.Context) (string, error) {
	if paid, err := a.markPaid(ctx); err != nil || paid {
		return effectPaid, err
	}

	order, err := a.lockOrder(ctx, "FOR UPDATE")
	if err != nil {
		return "", err
	}
	switch order.status {
	case statusPending:
		if !order.matches {
			return a.anomaly(ctx, AmountMismatch, order)
		}
		// The order was committed after the UPDATE's snapshot was taken: with the row locked now,
		// the same UPDATE cannot miss it again.
		if paid, err := a.markPaid(ctx); err != nil || paid {
			return effectPaid, err
		}
		return "", fmt.Errorf("payment: order %s: locked PENDING order not updated", a.cb.OrderNo)
	case statusPaid:
		same, err := a.paidBySameTransaction(ctx, order)
		if err != nil || same {
			return "", cmp.Or(err, inbox.ErrAlreadyApplied)
		}
		return a.anomaly(ctx, DuplicatePayment, order)
	case statusCancelled:
		return a.anomaly(ctx, PaidAfterCancel, order)
	default:
		return "", fmt.Errorf("payment: order %s has unknown status %q", a.cb.OrderNo, order.status)
	}
}

// upsertSuccessSQL records a successful payment. A row of the same provider transaction is upgraded
// only from FAILED and only on the same order (a provider retrying one payment intent).
const upsertSuccessSQL = `
INSERT INTO payments AS p (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key)
VALUES ($1, $2, $3, $4::numeric, $5, 'SUCCESS', $6, $7)
ON CONFLICT (provider, provider_txn_id) DO UPDATE
SET result = 'SUCCESS', amount = excluded.amount, currency = excluded.currency, paid_at = excluded.paid_at,
    idempotency_key = excluded.idempotency_key, received_at = now()
WHERE p.result = 'FAILED' AND p.order_no = excluded.order_no`

// markPaid moves the order PENDING → PAID if it is PENDING with the callback's amount and currency,
// and records the payment. It reports whether it did.
func (a *application) markPaid(ctx context.Context) (bool, error) {
	cb := a.cb
	tag, err := a.tx.Exec(ctx, markPaidSQL, cb.OrderNo, cb.Amount, cb.Currency, cb.PaidAt, cb.ProviderTxnID)
	if err != nil {
		return false, inbox.Classify(fmt.Errorf("payment: mark order %s paid: %w", cb.OrderNo, err))
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	tag, err = a.tx.Exec(ctx, upsertSuccessSQL, cb.Provider, cb.ProviderTxnID, cb.OrderNo, cb.Amount,
		cb.Currency, cb.PaidAt, a.key)
	if err != nil {
		return false, inbox.Classify(fmt.Errorf("payment: record payment: %w", err))
	}
	if tag.RowsAffected() == 0 {
		// The transaction is recorded against another order (or already succeeded there). The
		// error rolls back the order update too.
		var other string
		err := a.tx.QueryRow(ctx, `SELECT order_no FROM payments WHERE provider = $1 AND provider_txn_id = $2`,
			cb.Provider, cb.ProviderTxnID).Scan(&other)
		if err != nil {
			return false, inbox.Classify(fmt.Errorf("payment: read recorded payment: %w", err))
		}
		return false, invalid("provider_txn_id", "provider %s transaction %s is already recorded for order %s",
			quote(cb.Provider), quote(cb.ProviderTxnID), quote(other))
	}
	return true, nil
}

// failed applies a FAILED callback: it never changes the order, and records the failed payment
// unless its provider transaction is already recorded or paid the order.
func (a *application) failed(ctx context.Context) (string, error) {
	// FOR SHARE waits for a SUCCESS in flight on this order, so that its outcome is seen below.
	order, err := a.lockOrder(ctx, "FOR SHARE")
	if err != nil {
		return "", err
	}
	if order.status == statusPaid {
		if same, err := a.paidBySameTransaction(ctx, order); err != nil || same {
			return "", cmp.Or(err, inbox.ErrAlreadyApplied)
		}
	}
	cb := a.cb
	tag, err := a.tx.Exec(ctx, `
		INSERT INTO payments (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key)
		VALUES ($1, $2, $3, $4::numeric, $5, 'FAILED', $6, $7)
		ON CONFLICT (provider, provider_txn_id) DO NOTHING`,
		cb.Provider, cb.ProviderTxnID, cb.OrderNo, cb.Amount, cb.Currency, cb.PaidAt, a.key)
	if err != nil {
		return "", inbox.Classify(fmt.Errorf("payment: record failed payment: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return "", inbox.ErrAlreadyApplied
	}
	return effectFailedRecorded, nil
}

// order is the locked state of an order.
type order struct {
	status   string
	txnID    *string // the transaction that paid it
	amount   string
	currency string
	matches  bool // amount and currency equal the callback's
}

// lockOrder reads and locks the order. A missing order is retryable: the callback may have overtaken
// the order's creation.
func (a *application) lockOrder(ctx context.Context, lock string) (order, error) {
	var o order
	err := a.tx.QueryRow(ctx, `
		SELECT status, provider_txn_id, amount::text, currency, amount = $2::numeric AND currency = $3
		FROM orders WHERE order_no = $1 `+lock,
		a.cb.OrderNo, a.cb.Amount, a.cb.Currency).Scan(&o.status, &o.txnID, &o.amount, &o.currency, &o.matches)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, fault.RetryableUntil(fault.UnknownOrder,
			fmt.Errorf("payment: order %s not found", quote(a.cb.OrderNo)))
	}
	if err != nil {
		return o, inbox.Classify(fmt.Errorf("payment: lock order %s: %w", a.cb.OrderNo, err))
	}
	return o, nil
}

// paidBySameTransaction reports whether the PAID order was paid by this callback's provider
// transaction: the order carries its provider_txn_id and no payment of another provider claims it.
// It runs after lockOrder as a statement of its own, so it sees the payment committed with the
// order's current state.
func (a *application) paidBySameTransaction(ctx context.Context, o order) (bool, error) {
	if o.txnID == nil || *o.txnID != a.cb.ProviderTxnID {
		return false, nil
	}
	providers, err := a.payingProviders(ctx, o)
	if err != nil {
		return false, err
	}
	return len(providers) == 0 || slices.Contains(providers, a.cb.Provider), nil
}

// payingProviders returns the providers of the successful payments of the order's provider_txn_id.
func (a *application) payingProviders(ctx context.Context, o order) ([]string, error) {
	if o.txnID == nil {
		return nil, nil
	}
	rows, _ := a.tx.Query(ctx, `
		SELECT provider FROM payments
		WHERE order_no = $1 AND provider_txn_id = $2 AND result = 'SUCCESS'
		ORDER BY provider`, a.cb.OrderNo, *o.txnID)
	providers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, inbox.Classify(fmt.Errorf("payment: read payments of order %s: %w", a.cb.OrderNo, err))
	}
	return providers, nil
}

// anomalyDetail is payment_anomalies.detail: what a person needs to settle the anomaly.
type anomalyDetail struct {
	OrderStatus      string    `json:"order_status"`
	ExpectedAmount   string    `json:"expected_amount"`
	ExpectedCurrency string    `json:"expected_currency"`
	ReceivedAmount   string    `json:"received_amount"`
	ReceivedCurrency string    `json:"received_currency"`
	PaidAt           time.Time `json:"paid_at"`
	IdempotencyKey   string    `json:"idempotency_key"`
	// The payment that paid the order first (duplicate_payment).
	PreviousProviderTxnID string `json:"previous_provider_txn_id,omitempty"`
	PreviousProvider      string `json:"previous_provider,omitempty"`
}

// anomaly records the callback as an anomaly of kind, unless its provider transaction is already
// flagged (of any kind; the order's row lock serialises the check): then it is a duplicate.
func (a *application) anomaly(ctx context.Context, kind string, o order) (string, error) {
	cb := a.cb
	detail := anomalyDetail{
		OrderStatus:      o.status,
		ExpectedAmount:   o.amount,
		ExpectedCurrency: o.currency,
		ReceivedAmount:   cb.Amount,
		ReceivedCurrency: cb.Currency,
		PaidAt:           cb.PaidAt,
		IdempotencyKey:   a.key,
	}
	if kind == DuplicatePayment && o.txnID != nil {
		detail.PreviousProviderTxnID = *o.txnID
		providers, err := a.payingProviders(ctx, o)
		if err != nil {
			return "", err
		}
		if len(providers) > 0 {
			detail.PreviousProvider = providers[0]
		}
	}
	detailJSON, err := json.Marshal(detail)
	if err != nil {
		return "", fmt.Errorf("payment: encode anomaly detail: %w", err)
	}
	tag, err := a.tx.Exec(ctx, `
		INSERT INTO payment_anomalies (order_no, provider, provider_txn_id, kind, detail)
		SELECT $1, $2, $3, $4, $5::jsonb
		WHERE NOT EXISTS (SELECT FROM payment_anomalies WHERE provider = $2 AND provider_txn_id = $3)
		ON CONFLICT (provider, provider_txn_id, kind) DO NOTHING`,
		cb.OrderNo, cb.Provider, cb.ProviderTxnID, kind, string(detailJSON))
	if err != nil {
		return "", inbox.Classify(fmt.Errorf("payment: record anomaly %s: %w", kind, err))
	}
	if tag.RowsAffected() == 0 {
		return "", inbox.ErrAlreadyApplied
	}
	return kind, nil
}
