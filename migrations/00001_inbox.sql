-- +goose Up
-- One row per (handler, idempotency key) whose effect has been committed. The row is written in the
-- same transaction as the effect, so it exists if and only if the effect happened.
CREATE TABLE inbox (
    handler          text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      bytea       NOT NULL, -- SHA-256 of the message value
    topic            text        NOT NULL, -- where the key was first seen
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    processed_at     timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL, -- remembered until then; purged after
    PRIMARY KEY (handler, idempotency_key)
);

CREATE INDEX inbox_expires_at_idx ON inbox (expires_at);

-- The last range of offsets a consumer started on each partition, written before its handlers run.
-- A worker that finds a range it did not finish was started before, and died in it: a crash loop.
CREATE TABLE inbox_attempts (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    first_offset    bigint      NOT NULL,
    last_offset     bigint      NOT NULL,
    starts          integer     NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition")
);

-- +goose Down
DROP TABLE inbox_attempts;
DROP TABLE inbox;
