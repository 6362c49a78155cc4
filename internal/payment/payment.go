// Package payment applies payment callbacks to orders: the order state machine of the contract.
//
// Handler.Handle decodes a callback strictly (see Decode) and applies it through the inbox
// transaction it is given, so the inbox row, the order update, the payments row and any anomaly
// commit together or not at all. An order only ever moves PENDING → PAID, by one conditional UPDATE
// (never read-then-write); a callback that cannot pay the order is recorded for a person as a
// payment_anomalies row (amount_mismatch, duplicate_payment, paid_after_cancel) and the order is left
// as it is. A provider transaction already applied, under whatever idempotency key, is reported as
// inboxworker.ErrAlreadyApplied, with nothing written.
//
// The rules, where the contract's table is silent:
//   - A provider transaction belongs to one order and carries one amount and currency: the first
//     callback of it that is recorded (paid, failed or flagged) writes them to payment_transactions,
//     whose primary key is (provider, provider_txn_id). A later callback of it for another order,
//     or with another amount or currency, is refused (invalid_payload, naming provider_txn_id,
//     amount or currency), whatever its result and the state of its order, and records nothing. So
//     a transaction that paid one order never becomes a refund flag on another, and a refund flag
//     never stands on the transaction that paid. The primary key decides, not a read: of two
//     callbacks recording one transaction at once, the second waits for the first to commit.
//   - A FAILED callback never changes an order. On any existing order it is recorded as a payments
//     row with result FAILED, unless that provider transaction already has a row (or paid the order):
//     then it is a duplicate.
//   - A SUCCESS for a provider transaction first recorded as FAILED on the same order (a provider
//     retrying one payment intent) pays the order if it is still PENDING and matches, and its payments
//     row becomes SUCCESS: one row per provider transaction, holding its final result.
//   - One anomaly per provider transaction: a transaction already flagged (of any kind) is not flagged
//     again, so one received payment is never refunded twice. A unique index on payment_anomalies
//     (provider, provider_txn_id) decides.
//   - "Paid by the same provider_txn_id" means the order's provider_txn_id matches and the payments
//     row that paid it, if any, is the same provider's.
//   - An unknown order is retryable with reason unknown_order, whatever the result.
//
// Handler.HandleBatch applies a batch of callbacks in one transaction with the same results: the
// common case, a SUCCESS that pays a PENDING order, for the whole batch in one statement, and every
// other callback as Handle does, in order.
//
// What a callback did (an anomaly at warn level; a payment, paid or failed, at info unless
// Config.AppliedLevel says otherwise; one line each) is logged once its transaction commits (see
// inboxworker.AfterCommit), never for work rolled back; called outside a transaction of package inbox,
// the handler logs nothing. A callback found already applied under another key is logged at debug:
// the consumer logs the duplicate it skipped.
//
// payment does not retry, dead-letter, count or know Kafka: it returns nil (applied),
// inboxworker.ErrAlreadyApplied (duplicate) or an error classified with package fault, and its caller does
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
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxworker/inboxworker"
)

// Config configures a Handler.
type Config struct {
	// EventsTopic is where the order events (order.paid, payment.failed, payment.anomaly) are
	// emitted, through the outbox, in the transaction of the callback. Empty: none is.
	EventsTopic string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// AppliedLevel is the level of the line logged for each callback applied (an order paid, a
	// failed payment recorded). Defaults to slog.LevelInfo, the zero value; slog.LevelDebug quiets
	// the lines at the default log level, for a worker applying more callbacks than its log should
	// carry. Anomalies are logged at warn whatever it is.
	AppliedLevel slog.Level
}

// Handler applies payment callbacks. It is safe for concurrent use.
type Handler struct {
	events       string
	logger       *slog.Logger
	appliedLevel slog.Level
}

// NewHandler returns a Handler.
func NewHandler(config Config) (*Handler, error) {
	return &Handler{events: config.EventsTopic, logger: cmp.Or(config.Logger, slog.Default()),
		appliedLevel: config.AppliedLevel}, nil
}

// UnknownOrder is the dead-letter reason of a callback whose order did not appear within the retry
// budget: retried until then (the callback may overtake the order's creation).
const UnknownOrder inboxworker.Reason = "unknown_order"

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
// inboxworker.ErrAlreadyApplied when its provider transaction had already been applied, having written
// nothing, or a classified error: invalid_payload (permanent), unknown_order (retryable), or a
// Postgres error, which the inbox classifies.
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	cb, err := Decode(d.Value)
	if err != nil {
		return err
	}
	return h.apply(ctx, tx, d, cb)
}

// apply applies the decoded callback cb of d through tx, and logs what it did once the transaction
// commits (see inboxworker.AfterCommit): never a line for work rolled back.
func (h *Handler) apply(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery, cb Callback) error {
	_, err := h.run(ctx, &application{tx: tx, cb: cb, key: d.Key, verifiedBy: nullable(d.VerifiedBy)})
	return err
}

// Reconciled applies cb, the provider's answer about an order the worker asked it about
// (reconciliation), through tx, exactly as the callback with its fields would be applied: the same
// state machine, the same business key (provider, provider_txn_id), so that the callback itself,
// arriving before, during or after the answer, is applied once in all. What it records says source
// reconciliation, and key stands for the idempotency key a callback has. It returns what it did
// (EffectPaid, EffectFailedRecorded or an anomaly kind), or what Handle would: ErrAlreadyApplied
// with nothing written, or an error. It logs nothing: its caller does, once tx commits.
func (h *Handler) Reconciled(ctx context.Context, tx pgx.Tx, key string, cb Callback) (string, error) {
	return h.run(ctx, &application{tx: tx, cb: cb, key: key, source: sourceReconciliation})
}

// run applies a's callback and emits its event, and returns what it did.
func (h *Handler) run(ctx context.Context, a *application) (string, error) {
	key, cb := a.key, a.cb
	var done string
	var err error
	if cb.Result == Success {
		done, err = a.success(ctx)
	} else {
		done, err = a.failed(ctx)
	}
	switch {
	case errors.Is(err, inboxworker.ErrAlreadyApplied):
		h.logAfterCommit(ctx, slog.LevelDebug, "payment callback already applied", key, cb)
		return "", err
	case err != nil:
		return "", err
	}
	if err := h.emit(ctx, a.tx, []applied{{key: key, cb: cb, effect: done}}); err != nil {
		return "", err
	}
	switch {
	case done == AmountMismatch || done == DuplicatePayment || done == PaidAfterCancel:
		h.logAfterCommit(ctx, slog.LevelWarn, "payment anomaly recorded", key, cb, slog.String("anomaly", done))
	default:
		h.logAfterCommit(ctx, h.appliedLevel, "payment callback applied", key, cb, slog.String("effect", done))
	}
	return done, nil
}

// logAfterCommit logs msg about the callback cb, whose idempotency key is key, once the transaction
// of ctx commits.
func (h *Handler) logAfterCommit(ctx context.Context, level slog.Level, msg, key string, cb Callback, extra ...slog.Attr) {
	if !h.logger.Enabled(ctx, level) {
		return
	}
	attrs := append([]slog.Attr{
		slog.String("order_no", cb.OrderNo), slog.String("provider", cb.Provider),
		slog.String("provider_txn_id", cb.ProviderTxnID), slog.String("result", string(cb.Result)),
		slog.String("amount", cb.Amount), slog.String("currency", cb.Currency),
		slog.String("idempotency_key", key),
	}, extra...)
	inboxworker.AfterCommit(ctx, func(ctx context.Context) { h.logger.LogAttrs(ctx, level, msg, attrs...) })
}

// application is one callback being applied in one transaction.
type application struct {
	tx  pgx.Tx
	cb  Callback
	key string
	// verifiedBy names the key that verified the callback (payments.verified_by); nil when the
	// route does not verify.
	verifiedBy *string
	// source is where the callback came from (payments.source): "" for a callback, else
	// sourceReconciliation.
	source string
}

// sourceReconciliation is payments.source of a payment the provider's answer recorded.
const sourceReconciliation = "reconciliation"

// sourceOf is payments.source of a: callback, or reconciliation.
func (a *application) sourceOf() string { return cmp.Or(a.source, "callback") }

// nullable is s, nil when empty: NULL in a column.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// The effects of a callback that are not anomalies: what Reconciled returns, and the effect the log
// says.
const (
	EffectPaid           = "order_paid"
	EffectFailedRecorded = "failed_payment_recorded"
)

// payNewSQL records the callback's provider transaction for its order and money, and, if that
// record is new, pays the order if it is PENDING with the callback's amount and currency and records
// the payment: the common case in one statement. A transaction recorded before (or concurrently,
// once that commits: the primary key makes this statement wait for it) pays nothing here.
const payNewSQL = `
WITH bound AS (
	INSERT INTO payment_transactions (provider, provider_txn_id, order_no, amount, currency)
	VALUES ($1, $2, $3, $4::numeric, $5)
	ON CONFLICT (provider, provider_txn_id) DO NOTHING
	RETURNING order_no
), paid AS (
	UPDATE orders
	SET status = 'PAID', paid_at = $6, provider_txn_id = $2, updated_at = now()
	WHERE order_no = (SELECT order_no FROM bound) AND status = 'PENDING' AND amount = $4::numeric AND currency = $5
	RETURNING order_no
), recorded AS (
	INSERT INTO payments (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key, verified_by, source)
	SELECT $1, $2, order_no, $4::numeric, $5, 'SUCCESS', $6, $7, $8, $9 FROM paid
	RETURNING order_no
)
SELECT EXISTS (SELECT FROM bound), EXISTS (SELECT FROM recorded)`

// success applies a SUCCESS callback. payNewSQL is the state change of the common case; its UPDATE
// takes the order's row lock, so concurrent callbacks for one order queue behind each other, and a
// loser's UPDATE re-checks the winner's committed row and touches nothing. Only then, and in new
// statements (which in READ COMMITTED see what the winner committed), does it find out why.
func (a *application) success(ctx context.Context) (string, error) {
	cb := a.cb
	var bound, paid bool
	err := a.tx.QueryRow(ctx, payNewSQL, cb.Provider, cb.ProviderTxnID, cb.OrderNo, cb.Amount, cb.Currency,
		cb.PaidAt, a.key, a.verifiedBy, a.sourceOf()).Scan(&bound, &paid)
	if err != nil {
		return "", classify(fmt.Errorf("payment: pay order %s: %w", cb.OrderNo, err))
	}
	if paid {
		return EffectPaid, nil
	}
	if !bound {
		// Recorded before: for this order and this money, or the callback is refused.
		if err := a.bind(ctx); err != nil {
			return "", err
		}
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
		// The provider transaction was recorded before on this order (a FAILED attempt), or the
		// order was committed after payNewSQL's snapshot was taken: with the row locked now, the
		// UPDATE cannot miss it.
		if paid, err := a.markPaid(ctx); err != nil || paid {
			return EffectPaid, err
		}
		return "", fmt.Errorf("payment: order %s: locked PENDING order not updated", a.cb.OrderNo)
	case statusPaid:
		same, err := a.paidBySameTransaction(ctx, order)
		if err != nil || same {
			return "", cmp.Or(err, inboxworker.ErrAlreadyApplied)
		}
		return a.anomaly(ctx, DuplicatePayment, order)
	case statusCancelled:
		return a.anomaly(ctx, PaidAfterCancel, order)
	default:
		return "", fmt.Errorf("payment: order %s has unknown status %q", a.cb.OrderNo, order.status)
	}
}

// bindSQL records the callback's provider transaction for its order and money, unless it is
// recorded already; a concurrent record of it makes the statement wait for that transaction's end.
const bindSQL = `
INSERT INTO payment_transactions (provider, provider_txn_id, order_no, amount, currency)
VALUES ($1, $2, $3, $4::numeric, $5)
ON CONFLICT (provider, provider_txn_id) DO NOTHING`

// bind records the callback's provider transaction for its order, amount and currency, or checks
// that it was recorded with those. A provider transaction belongs to one order and carries one
// amount: one recorded for another order, or with other money, is refused (invalid_payload naming
// the field), whatever its result and whatever the state of this order, so that no callback of it
// is applied twice and no refund is ever flagged on a transaction that paid.
func (a *application) bind(ctx context.Context) error {
	cb := a.cb
	tag, err := a.tx.Exec(ctx, bindSQL, cb.Provider, cb.ProviderTxnID, cb.OrderNo, cb.Amount, cb.Currency)
	if err != nil {
		return classify(fmt.Errorf("payment: record provider transaction: %w", err))
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	// A statement of its own: in READ COMMITTED it sees the row that the INSERT waited for.
	var orderNo, amount, currency string
	err = a.tx.QueryRow(ctx, `
		SELECT order_no, amount::text, currency FROM payment_transactions
		WHERE provider = $1 AND provider_txn_id = $2`,
		cb.Provider, cb.ProviderTxnID).Scan(&orderNo, &amount, &currency)
	if err != nil {
		return classify(fmt.Errorf("payment: read recorded provider transaction: %w", err))
	}
	switch {
	case orderNo != cb.OrderNo:
		return invalid("provider_txn_id", "provider %s transaction %s is already recorded for order %s",
			quote(cb.Provider), quote(cb.ProviderTxnID), quote(orderNo))
	case amount != cb.Amount:
		return invalid("amount", "provider %s transaction %s is already recorded with amount %s, got %s",
			quote(cb.Provider), quote(cb.ProviderTxnID), amount, cb.Amount)
	case currency != cb.Currency:
		return invalid("currency", "provider %s transaction %s is already recorded in %s, got %s",
			quote(cb.Provider), quote(cb.ProviderTxnID), currency, cb.Currency)
	}
	return nil
}

const markPaidSQL = `
UPDATE orders
SET status = 'PAID', paid_at = $4, provider_txn_id = $5, updated_at = now()
WHERE order_no = $1 AND status = 'PENDING' AND amount = $2::numeric AND currency = $3`

// upsertSuccessSQL records a successful payment. A row of the same provider transaction, which bind
// has checked is this order's, is upgraded only from FAILED (a provider retrying one payment
// intent).
const upsertSuccessSQL = `
INSERT INTO payments AS p (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key, verified_by, source)
VALUES ($1, $2, $3, $4::numeric, $5, 'SUCCESS', $6, $7, $8, $9)
ON CONFLICT (provider, provider_txn_id) DO UPDATE
SET result = 'SUCCESS', amount = excluded.amount, currency = excluded.currency, paid_at = excluded.paid_at,
    idempotency_key = excluded.idempotency_key, verified_by = excluded.verified_by, source = excluded.source,
    received_at = now()
WHERE p.result = 'FAILED' AND p.order_no = excluded.order_no`

// markPaid moves the locked order PENDING → PAID if it is PENDING with the callback's amount and
// currency, and records the payment. It reports whether it did.
func (a *application) markPaid(ctx context.Context) (bool, error) {
	cb := a.cb
	tag, err := a.tx.Exec(ctx, markPaidSQL, cb.OrderNo, cb.Amount, cb.Currency, cb.PaidAt, cb.ProviderTxnID)
	if err != nil {
		return false, classify(fmt.Errorf("payment: mark order %s paid: %w", cb.OrderNo, err))
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	tag, err = a.tx.Exec(ctx, upsertSuccessSQL, cb.Provider, cb.ProviderTxnID, cb.OrderNo, cb.Amount,
		cb.Currency, cb.PaidAt, a.key, a.verifiedBy, a.sourceOf())
	if err != nil {
		return false, classify(fmt.Errorf("payment: record payment: %w", err))
	}
	if tag.RowsAffected() == 0 {
		// A successful payment of this transaction on this PENDING order: the order was changed
		// behind the worker's back. The error rolls back the order update too.
		return false, fmt.Errorf("payment: order %s is PENDING but provider %s transaction %s already paid it",
			quote(cb.OrderNo), quote(cb.Provider), quote(cb.ProviderTxnID))
	}
	return true, nil
}

// failed applies a FAILED callback: it never changes the order, and records the failed payment
// unless its provider transaction is already recorded or paid the order.
func (a *application) failed(ctx context.Context) (string, error) {
	if err := a.bind(ctx); err != nil {
		return "", err
	}
	// FOR SHARE waits for a SUCCESS in flight on this order, so that its outcome is seen below.
	order, err := a.lockOrder(ctx, "FOR SHARE")
	if err != nil {
		return "", err
	}
	if order.status == statusPaid {
		if same, err := a.paidBySameTransaction(ctx, order); err != nil || same {
			return "", cmp.Or(err, inboxworker.ErrAlreadyApplied)
		}
	}
	cb := a.cb
	tag, err := a.tx.Exec(ctx, `
		INSERT INTO payments (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key, verified_by, source)
		VALUES ($1, $2, $3, $4::numeric, $5, 'FAILED', $6, $7, $8, $9)
		ON CONFLICT (provider, provider_txn_id) DO NOTHING`,
		cb.Provider, cb.ProviderTxnID, cb.OrderNo, cb.Amount, cb.Currency, cb.PaidAt, a.key, a.verifiedBy, a.sourceOf())
	if err != nil {
		return "", classify(fmt.Errorf("payment: record failed payment: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return "", inboxworker.ErrAlreadyApplied
	}
	return EffectFailedRecorded, nil
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
		return o, inboxworker.RetryableUntil(UnknownOrder,
			fmt.Errorf("payment: order %s not found", quote(a.cb.OrderNo)))
	}
	if err != nil {
		return o, classify(fmt.Errorf("payment: lock order %s: %w", a.cb.OrderNo, err))
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
		return nil, classify(fmt.Errorf("payment: read payments of order %s: %w", a.cb.OrderNo, err))
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
	// VerifiedBy names the key that verified the callback, when callbacks are verified.
	VerifiedBy *string `json:"verified_by,omitempty"`
	// Source is reconciliation when the provider's answer to the worker's question recorded it.
	Source string `json:"source,omitempty"`
	// The payment that paid the order first (duplicate_payment).
	PreviousProviderTxnID string `json:"previous_provider_txn_id,omitempty"`
	PreviousProvider      string `json:"previous_provider,omitempty"`
}

// anomaly records the callback as an anomaly of kind, unless its provider transaction is already
// flagged (of any kind): then it is a duplicate. The unique index on (provider, provider_txn_id)
// decides, not a read: a concurrent second writer waits for the first and then inserts nothing.
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
		VerifiedBy:       a.verifiedBy,
		Source:           a.source,
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
		VALUES ($1, $2, $3, $4, $5::jsonb)
		ON CONFLICT DO NOTHING`,
		cb.OrderNo, cb.Provider, cb.ProviderTxnID, kind, string(detailJSON))
	if err != nil {
		return "", classify(fmt.Errorf("payment: record anomaly %s: %w", kind, err))
	}
	if tag.RowsAffected() == 0 {
		return "", inboxworker.ErrAlreadyApplied
	}
	return kind, nil
}

// sqlstateUniqueViolation is the SQLSTATE of a unique violation.
const sqlstateUniqueViolation = "23505"

// classify makes a unique violation retryable; the inbox classifies every other Postgres error (a
// deadlock is retried, an outage waited out). Every statement here that can meet one of the
// constraints binding a provider transaction says ON CONFLICT, so only a row written outside these
// rules (an operator's hand, a database restored from before them) can
// raise one; retried, the callback sees that row and gets its outcome, never a handler_error.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateUniqueViolation {
		return inboxworker.Retryable(err)
	}
	return err
}
