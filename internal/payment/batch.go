package payment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
)

// HandleBatch applies the callbacks in ds, in order, through tx, the inbox transaction of their
// keys, and returns for each what Handle would have returned for it, the callbacks handled one after
// another. It stops at its first error (an invalid payload included), leaving the later results nil.
//
// Most callbacks pay a PENDING order. Those HandleBatch applies together with one statement (see
// payAllSQL): each valid SUCCESS callback whose order and provider transaction no other callback of
// the batch names, which pays its order if the order is PENDING with the callback's amount and
// currency and the provider transaction was not recorded before. Such a callback touches rows no
// other callback of the batch reads or writes, so applying it before the callbacks that precede it
// gives every callback the result it has in order. Every other callback, and every one the statement
// did not pay, goes through Handle's path, in order. A provider transaction that a concurrent
// transaction records first makes the statement wait for it, and then not pay with it: Handle's
// path then gives that callback its outcome, which is its own.
//
// It does database work only, through tx, and may run more than once for a callback whose effect
// commits once (see inboxworker.BatchHandler).
func (h *Handler) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inboxworker.Delivery) []error {
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
		if err := h.apply(ctx, tx, ds[i], cbs[i]); err != nil {
			errs[i] = err
			if !errors.Is(err, inboxworker.ErrAlreadyApplied) {
				return errs
			}
		}
	}
	return errs
}

// payAllSQL is payNewSQL for a set of callbacks with distinct orders and distinct provider
// transactions: it records each row's provider transaction for its order and money, and for each it
// recorded first pays the order if it is PENDING with the row's amount and currency, and records the
// payment. Its plan is by primary key by its shape, with or without statistics: it reads no table
// but through the insert's arbiter index (payment_transactions' primary key) and orders, which it
// joins by primary key to the rows the insert returned — rows of a CTE, of which the planner
// assumes few, so a nested loop of index lookups into orders, in custom and in generic plans, on an
// empty never-analysed database as on one of a million orders. (Only an orders table analysed while
// empty is scanned, which is then right; the next automatic ANALYZE replans it.) The statement it
// replaces read payments with NOT EXISTS, which the planner turned into a scan of payments per batch
// when payments was small at planning time, and kept while the worker filled it.
const payAllSQL = `
WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[],
			$8::text[])
		AS i(order_no, provider, provider_txn_id, amount, currency, paid_at, idempotency_key, verified_by)
), bound AS (
	INSERT INTO payment_transactions (provider, provider_txn_id, order_no, amount, currency)
	SELECT provider, provider_txn_id, order_no, amount::numeric, currency FROM input
	ORDER BY provider, provider_txn_id
	ON CONFLICT (provider, provider_txn_id) DO NOTHING
	RETURNING provider, provider_txn_id
), paid AS (
	UPDATE orders o
	SET status = 'PAID', paid_at = i.paid_at, provider_txn_id = i.provider_txn_id, updated_at = now()
	FROM input i JOIN bound b USING (provider, provider_txn_id)
	WHERE o.order_no = i.order_no AND o.status = 'PENDING' AND o.amount = i.amount::numeric
	  AND o.currency = i.currency
	RETURNING i.*
)
INSERT INTO payments (provider, provider_txn_id, order_no, amount, currency, result, paid_at, idempotency_key, verified_by)
SELECT provider, provider_txn_id, order_no, amount::numeric, currency, 'SUCCESS', paid_at, idempotency_key, verified_by
FROM paid
RETURNING order_no`

// payAll applies together the callbacks of the batch that can be (see HandleBatch) and reports which
// it paid. When the statement fails, the transaction cannot go on: it returns the error and the
// index of the first callback it tried to pay.
func (h *Handler) payAll(ctx context.Context, tx pgx.Tx, ds []inboxworker.Delivery, cbs []Callback) (paid []bool, first int, err error) {
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
	verifiedBy := make([]*string, n)
	paidAt := make([]time.Time, n)
	byOrder := make(map[string]int, n)
	for j, i := range candidates {
		cb := cbs[i]
		orderNos[j], providers[j], txnIDs[j] = cb.OrderNo, cb.Provider, cb.ProviderTxnID
		amounts[j], currencies[j], paidAt[j], keys[j] = cb.Amount, cb.Currency, cb.PaidAt, ds[i].Key
		verifiedBy[j] = nullable(ds[i].VerifiedBy)
		byOrder[cb.OrderNo] = i
	}
	rows, _ := tx.Query(ctx, payAllSQL, orderNos, providers, txnIDs, amounts, currencies, paidAt, keys, verifiedBy)
	paidOrders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, candidates[0], classify(fmt.Errorf("payment: pay %d orders: %w", n, err))
	}
	done := make([]applied, 0, len(paidOrders))
	for _, orderNo := range paidOrders {
		i := byOrder[orderNo]
		paid[i] = true
		done = append(done, applied{key: ds[i].Key, cb: cbs[i], effect: EffectPaid})
	}
	// The events of the orders paid, in one statement too.
	if err := h.emit(ctx, tx, done); err != nil {
		return nil, candidates[0], err
	}
	for _, a := range done {
		h.logAfterCommit(ctx, h.appliedLevel, "payment callback applied", a.key, a.cb, slog.String("effect", EffectPaid))
	}
	return paid, 0, nil
}
