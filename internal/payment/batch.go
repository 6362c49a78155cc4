package payment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// HandleBatch applies the callbacks in ds, in order, through tx, the inbox transaction of their
// keys, and returns for each what Handle would have returned for it, the callbacks handled one after
// another. It stops at its first error (an invalid payload included), leaving the later results nil.
//
// Most callbacks pay a PENDING order. Those HandleBatch applies together with one statement (see
// payAllSQL): each valid SUCCESS callback whose order and provider transaction no other callback of
// the batch names, which pays its order if the order is PENDING with the callback's amount and
// currency and the provider transaction has no payments row yet. Such a callback touches rows no
// other callback of the batch reads or writes, so applying it before the callbacks that precede it
// gives every callback the result it has in order. Every other callback, and every one the statement
// did not pay, goes through Handle's path, in order. Should the statement fail (a concurrent
// transaction recorded one of the provider transactions first, say), it is rolled back to a
// savepoint and all callbacks go through Handle's path, so that an error is the callback's own.
//
// It does database work only, through tx, and may run more than once for a callback whose effect
// commits once (see consumer.BatchHandler).
func (h *Handler) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	errs := make([]error, len(ds))
	cbs := make([]Callback, len(ds))
	n := len(ds) // the callbacks before the first invalid one, which are applied
	for i, d := range ds {
		var err error
		if cbs[i], err = Decode(d.Value); err != nil {
			errs[i], n = err, i
			break
		}
	}
	paid, first, err := h.payAll(ctx, tx, ds[:n], cbs[:n])
	if err != nil {
		// The transaction is unusable: reported on the first callback it was to pay.
		errs[first] = err
		return errs
	}
	for i := range n {
		if paid[i] {
			continue
		}
		if err := h.apply(ctx, tx, ds[i].Key, cbs[i]); err != nil {
			errs[i] = err
			if !errors.Is(err, inbox.ErrAlreadyApplied) {
				return errs
			}
		}
	}
	return errs
}

// payAllSQL pays, for each input row, its order if it is PENDING with the row's amount and currency
// and the row's provider transaction has no payments row, and records the payment: Handle's
// markPaid, for a set of callbacks with distinct orders and distinct provider transactions.
const payAllSQL = `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[])
		AS i(order_no, provider, provider_txn_id, amount, currency, paid_at, idempotency_key)
), paid AS (
	UPDATE orders o
	SET status = 'PAID', paid_at = i.paid_at, provider_txn_id = i.provider_txn_id, updated_at = now()
	FROM input i
	WHERE o.order_no = i.order_no AND o.status = 'PENDING' AND o.amount = i.amount::numeric
	  AND o.currency = i.currency
	  AND NOT EXISTS (SELECT FROM payments p WHERE p.provider = i.provider AND p.provider_txn_id = i.provider_txn_id)
	RETURNING i.*
)
INSERT INTO payments (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key)
SELECT provider, provider_txn_id, order_no, amount::numeric, currency, 'SUCCESS', paid_at, idempotency_key
FROM paid
RETURNING order_no`

// payAllBegin and payAllEnd bracket payAllSQL with a savepoint, to roll back to if it fails, and
// with planner settings that leave it only lookups by key: one per callback into orders and
// payments. Left to itself, the planner scans orders, or scans payments for every callback, when
// the tables were small or had no statistics when the statement was first planned, and keeps that
// plan while they grow. (ROLLBACK TO SAVEPOINT undoes the settings too.)
const (
	payAllBegin = `SAVEPOINT pay_all; SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off`
	payAllEnd   = `RELEASE SAVEPOINT pay_all; RESET enable_seqscan; RESET enable_hashjoin; RESET enable_mergejoin`
)

// payAll applies together the callbacks of the batch that can be (see HandleBatch) and reports which
// it paid: none when the statement failed and was rolled back. When the transaction cannot go on
// (the rollback failed too), it returns the error and the index of the first callback it tried to
// pay.
func (h *Handler) payAll(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery, cbs []Callback) (paid []bool, first int, err error) {
	paid = make([]bool, len(cbs))
	type txn struct{ provider, id string }
	orders := make(map[string]int, len(cbs))
	txns := make(map[txn]int, len(cbs))
	for _, cb := range cbs {
		orders[cb.OrderNo]++
		txns[txn{cb.Provider, cb.ProviderTxnID}]++
	}
	var candidates []int
	for i, cb := range cbs {
		if cb.Result == Success && orders[cb.OrderNo] == 1 && txns[txn{cb.Provider, cb.ProviderTxnID}] == 1 {
			candidates = append(candidates, i)
		}
	}
	if len(candidates) == 0 {
		return paid, 0, nil
	}

	n := len(candidates)
	orderNos, providers, txnIDs := make([]string, n), make([]string, n), make([]string, n)
	amounts, currencies, keys := make([]string, n), make([]string, n), make([]string, n)
	paidAt := make([]time.Time, n)
	byOrder := make(map[string]int, n)
	for j, i := range candidates {
		cb := cbs[i]
		orderNos[j], providers[j], txnIDs[j] = cb.OrderNo, cb.Provider, cb.ProviderTxnID
		amounts[j], currencies[j], paidAt[j], keys[j] = cb.Amount, cb.Currency, cb.PaidAt, ds[i].Key
		byOrder[cb.OrderNo] = i
	}
	if _, err := tx.Exec(ctx, payAllBegin); err != nil {
		return nil, candidates[0], inbox.Classify(fmt.Errorf("payment: savepoint: %w", err))
	}
	rows, _ := tx.Query(ctx, payAllSQL, orderNos, providers, txnIDs, amounts, currencies, paidAt, keys)
	paidOrders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		if _, rbErr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT pay_all`); rbErr != nil {
			return nil, candidates[0], inbox.Classify(fmt.Errorf(
				"payment: pay %d orders: %v; roll back to the savepoint: %w", n, err, rbErr))
		}
		h.logger.DebugContext(ctx, "cannot pay the batch's orders together; applying the callbacks one by one",
			"callbacks", n, "error", err)
		return paid, 0, nil
	}
	if _, err := tx.Exec(ctx, payAllEnd); err != nil {
		return nil, candidates[0], inbox.Classify(fmt.Errorf("payment: release the savepoint: %w", err))
	}
	debug := h.logger.Enabled(ctx, slog.LevelDebug)
	for _, orderNo := range paidOrders {
		i := byOrder[orderNo]
		paid[i] = true
		if debug {
			cb := cbs[i]
			h.logger.LogAttrs(ctx, slog.LevelDebug, "payment callback applied",
				slog.String("order_no", cb.OrderNo), slog.String("provider", cb.Provider),
				slog.String("provider_txn_id", cb.ProviderTxnID), slog.String("result", string(cb.Result)),
				slog.String("idempotency_key", ds[i].Key), slog.String("effect", effectPaid))
		}
	}
	return paid, 0, nil
}
