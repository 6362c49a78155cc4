-- +goose Up
-- One row per SMS idempotency key the provider accepted, committed with its inbox row.
CREATE TABLE notifications (
    idempotency_key      text        PRIMARY KEY,
    recipient            text        NOT NULL,
    template             text        NOT NULL,
    status               text        NOT NULL CHECK (status IN ('SENT')),
    provider_message_id  text        CHECK (provider_message_id <> ''), -- NULL: accepted without an id
    attempts             integer     NOT NULL CHECK (attempts >= 1),
    sent_at              timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE notifications;
