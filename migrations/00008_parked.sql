-- +goose Up
-- Messages that wait, each out of its partition's way: one whose retries in place did not clear a
-- retryable error (its order does not exist yet, say), and every later message of its ordering key,
-- parked behind it so that the key keeps its order. The partition's offset moves past them; the
-- partition's owner retries the head of each key (its lowest offset) until it is applied, found a
-- duplicate, or dead-lettered, and the key's next message gets its turn.
--
-- A row holds everything needed to apply or dead-letter the message without Kafka: its Kafka key,
-- value and headers as received, and its origin. It is removed in the same transaction as the
-- message's effect and inbox row, so a message leaves the park once, applied or not.
CREATE TABLE inbox_parked (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    handler          text        NOT NULL, -- the route's name in the inbox
    topic            text        NOT NULL, -- where the message was read from
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    ordering_key     bytea       NOT NULL, -- the messages of one key run in offset order
    idempotency_key  text        NOT NULL,
    message_key      bytea,                -- the Kafka key as received; NULL when there was none
    value            bytea,
    header_keys      bytea[]     NOT NULL DEFAULT '{}', -- the Kafka headers as received, in order
    header_values    bytea[]     NOT NULL DEFAULT '{}',
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0), -- runs of its handler
    starts           integer     NOT NULL DEFAULT 0 CHECK (starts >= 0),   -- retries begun in a row, never settled
    reason           text,                 -- the dead-letter reason once its retry budget runs out
    first_error      text,
    last_error       text,
    first_failed_at  timestamptz,          -- NULL: parked behind its key without having run
    budget_spent     interval    NOT NULL DEFAULT '0', -- retry budget spent, outages and pauses excluded
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    parked_at        timestamptz NOT NULL DEFAULT now(),
    claimed_by       text,                 -- the retrier working on it, until claimed_until
    claimed_until    timestamptz,
    CHECK (cardinality(header_keys) = cardinality(header_values)),
    CHECK ((claimed_by IS NULL) = (claimed_until IS NULL)),
    UNIQUE (topic, "partition", "offset") -- a redelivered message is parked once
);

-- The heads of a partition's keys, and whether a key is parked. The id is included so that the
-- heads are found from the index alone: tens of thousands of messages parked in an outage are
-- scanned in milliseconds.
CREATE INDEX inbox_parked_key_idx ON inbox_parked (topic, "partition", ordering_key, "offset") INCLUDE (id);

-- +goose Down
DROP TABLE inbox_parked;
