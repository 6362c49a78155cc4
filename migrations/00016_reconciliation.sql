-- +goose Up
-- Reconciliation: the worker asks the payment provider about each order left PENDING past
-- RECONCILE_AFTER, then at doubling intervals, until RECONCILE_MAX_AGE. A row per order asked about:
-- how many answers it had, when it is due again, what the provider last said, and which instance
-- is asking now (held_by until held_until), so that no order is asked about twice at once.
CREATE TABLE payment_reconciliations (
    order_no       text        PRIMARY KEY,
    asks           integer     NOT NULL DEFAULT 0 CHECK (asks >= 0), -- answers had (errors not counted)
    next_ask_at    timestamptz NOT NULL,
    last_result    text        CHECK (last_result IN ('paid', 'failed', 'pending', 'unknown', 'error')),
    last_error     text,
    last_asked_at  timestamptz,
    held_by        text,
    held_until     timestamptz,
    CHECK ((held_by IS NULL) = (held_until IS NULL))
);

-- The orders still PENDING, by age: what reconciliation looks for, and its metrics count. Small,
-- since an order leaves it once paid or cancelled.
CREATE INDEX orders_pending_created_at_idx ON orders (created_at) WHERE status = 'PENDING';

-- +goose Down
DROP INDEX orders_pending_created_at_idx;
DROP TABLE payment_reconciliations;
