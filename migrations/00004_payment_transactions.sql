-- +goose Up
-- The order and the money each provider transaction was first recorded with, whatever became of it
-- (a payment, a failed payment or an anomaly). Every callback the worker records writes this row in
-- its transaction first, so the primary key, not a read, binds one provider transaction to one order
-- and one amount: a second writer waits for the first and then finds the row. No foreign key to
-- orders: a callback may come before its order, and is then rolled back as unknown_order.
CREATE TABLE payment_transactions (
    provider         text          NOT NULL,
    provider_txn_id  text          NOT NULL,
    order_no         text          NOT NULL,
    amount           numeric(12,2) NOT NULL,
    currency         text          NOT NULL,
    recorded_at      timestamptz   NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, provider_txn_id)
);

-- The transactions already recorded: payments first (the order they paid or failed on), then
-- anomalies of transactions without a payment, by their first anomaly.
INSERT INTO payment_transactions (provider, provider_txn_id, order_no, amount, currency, recorded_at)
SELECT provider, provider_txn_id, order_no, amount, currency, received_at FROM payments;

INSERT INTO payment_transactions (provider, provider_txn_id, order_no, amount, currency, recorded_at)
SELECT DISTINCT ON (provider, provider_txn_id)
       provider, provider_txn_id, order_no, (detail->>'received_amount')::numeric,
       detail->>'received_currency', created_at
FROM payment_anomalies
ORDER BY provider, provider_txn_id, created_at, id
ON CONFLICT (provider, provider_txn_id) DO NOTHING;

-- One anomaly per provider transaction, so that one received payment is never refunded twice. The
-- contract's UNIQUE (provider, provider_txn_id, kind) stays; this is the stronger rule. A database
-- where a transaction was flagged twice needs a person first: each such pair is a possible double
-- refund.
-- +goose StatementBegin
DO $$
DECLARE
    twice bigint;
BEGIN
    SELECT count(*) INTO twice FROM (
        SELECT FROM payment_anomalies GROUP BY provider, provider_txn_id HAVING count(*) > 1) AS t;
    IF twice > 0 THEN
        RAISE EXCEPTION '% provider transactions have more than one row in payment_anomalies', twice
            USING HINT = 'Settle them (one refund each) and delete all but one row of each, then migrate again: '
                      || 'SELECT provider, provider_txn_id FROM payment_anomalies GROUP BY 1, 2 HAVING count(*) > 1';
    END IF;
END
$$;
-- +goose StatementEnd

CREATE UNIQUE INDEX payment_anomalies_provider_txn_key ON payment_anomalies (provider, provider_txn_id);

-- +goose Down
DROP INDEX payment_anomalies_provider_txn_key;
DROP TABLE payment_transactions;
