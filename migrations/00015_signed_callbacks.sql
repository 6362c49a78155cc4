-- +goose Up
-- Payment integrity. A payment says where it came from: a callback the worker consumed, or the
-- provider's answer to the worker's own question about an order left PENDING (reconciliation).
-- A payment of a signed callback names the key of PAYMENT_SIGNING_KEYS that verified it; NULL when
-- callbacks are not verified. A parked message keeps the name of the key that verified it when it
-- was read, for its handler when it is retried.
ALTER TABLE payments
    ADD COLUMN source      text NOT NULL DEFAULT 'callback' CHECK (source IN ('callback', 'reconciliation')),
    ADD COLUMN verified_by text;
ALTER TABLE inbox_parked ADD COLUMN verified_by text;

-- +goose Down
ALTER TABLE inbox_parked DROP COLUMN verified_by;
ALTER TABLE payments DROP COLUMN verified_by, DROP COLUMN source;
