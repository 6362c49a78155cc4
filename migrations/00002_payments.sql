-- +goose Up
-- Orders belong to the order service, which inserts them with the first five columns.
CREATE TABLE orders (
    order_no         text          PRIMARY KEY,
    user_id          text          NOT NULL,
    amount           numeric(12,2) NOT NULL CHECK (amount >= 0),
    currency         text          NOT NULL,
    status           text          NOT NULL DEFAULT 'PENDING'
                                   CHECK (status IN ('PENDING', 'PAID', 'CANCELLED')),
    provider_txn_id  text,
    paid_at          timestamptz,
    created_at       timestamptz   NOT NULL DEFAULT now(),
    updated_at       timestamptz   NOT NULL DEFAULT now()
);

-- One row per provider transaction, holding its final result (a FAILED attempt that later succeeds
-- is upgraded to SUCCESS). UNIQUE(provider, provider_txn_id) is the business-key
-- guard: a provider resending one payment under a new event id cannot record it twice.
CREATE TABLE payments (
    id               bigint        GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider         text          NOT NULL,
    provider_txn_id  text          NOT NULL,
    order_no         text          NOT NULL REFERENCES orders (order_no),
    amount           numeric(12,2) NOT NULL,
    currency         text          NOT NULL,
    result           text          NOT NULL CHECK (result IN ('SUCCESS', 'FAILED')),
    paid_at          timestamptz,
    idempotency_key  text          NOT NULL,
    received_at      timestamptz   NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_txn_id)
);

CREATE INDEX payments_order_no_idx ON payments (order_no);

-- Callbacks that could not be applied as they came and need a person (usually a refund).
CREATE TABLE payment_anomalies (
    id               bigint        GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no         text          NOT NULL,
    provider         text          NOT NULL,
    provider_txn_id  text          NOT NULL,
    kind             text          NOT NULL
                                   CHECK (kind IN ('amount_mismatch', 'duplicate_payment', 'paid_after_cancel')),
    detail           jsonb         NOT NULL DEFAULT '{}',
    created_at       timestamptz   NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_txn_id, kind)
);

CREATE INDEX payment_anomalies_order_no_idx ON payment_anomalies (order_no);

-- +goose Down
DROP TABLE payment_anomalies;
DROP TABLE payments;
DROP TABLE orders;
