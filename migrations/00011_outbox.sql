-- +goose Up
-- The transactional outbox: events written by a handler in the transaction of its effect, so that an
-- event exists if and only if its effect committed, and published to Kafka afterwards by the relay.
--
-- The first six columns are the shape of Debezium's outbox event router (io.debezium.transforms.
-- outbox.EventRouter): a team running Debezium can relay this table with the router instead of the
-- worker's relay (docs/operations.md says how). The rest is what the worker's relay needs.
CREATE TABLE outbox (
    id                  uuid        PRIMARY KEY,        -- derived from the event's cause: emitted again, the same id
    aggregatetype       text        NOT NULL,           -- what the event is about: 'order'
    aggregateid         text        NOT NULL,           -- which one: the order number; the Kafka message key
    type                text        NOT NULL,           -- what happened: 'order.paid'
    payload             json        NOT NULL,           -- the Kafka message value, as emitted
    tracingspancontext  text,                           -- the W3C trace context of the emitter, as java.util.Properties text ('traceparent=…'); NULL: none
    topic               text        NOT NULL,           -- where the relay publishes it
    -- The aggregate's events in the order their transactions committed: 1, 2, 3… (see outbox_sequences).
    seq                 bigint      NOT NULL CHECK (seq >= 1),
    -- Insertion order, across aggregates: the relay takes the oldest first.
    position            bigint      GENERATED ALWAYS AS IDENTITY,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at        timestamptz                     -- NULL: waiting for the relay
);

-- What the relay reads: the waiting rows, oldest first.
CREATE INDEX outbox_waiting_idx ON outbox (position) WHERE published_at IS NULL;
-- What the purge reads: the published rows, by when.
CREATE INDEX outbox_published_idx ON outbox (published_at) WHERE published_at IS NOT NULL;

-- One counter per aggregate, which gives its events their seq. An emitter increments it with
-- INSERT … ON CONFLICT DO UPDATE … RETURNING, and so holds the counter's row lock until its
-- transaction ends: a second emitter of the same aggregate waits for the first to commit (and then
-- takes the next number) or to roll back (and then takes the same number). So an aggregate's seq
-- follows the order in which its events' transactions committed (without gaps, but where an event
-- already in the table was emitted again and not written twice), and no committed row
-- can appear below a row already visible: the relay publishes what it sees in seq order. A sequence
-- or an identity taken at insert time would not do: of two concurrent transactions, the one that
-- took the lower number may commit last, after the relay published the higher.
CREATE TABLE outbox_sequences (
    aggregatetype  text        NOT NULL,
    aggregateid    text        NOT NULL,
    last_seq       bigint      NOT NULL CHECK (last_seq >= 1),
    updated_at     timestamptz NOT NULL DEFAULT now(),  -- the last emission; idle counters are purged with their rows
    PRIMARY KEY (aggregatetype, aggregateid)
);

-- The relay's lease: one relay publishes at a time, across all the instances sharing this schema.
-- The holder renews expires_at while it runs; once it has passed, another instance takes the lease
-- over, with the next epoch. A relay publishes only while its lease is live, with a margin, and stops
-- at once when it finds the lease held by another epoch.
CREATE TABLE outbox_relay_lease (
    name         text        PRIMARY KEY CHECK (name = 'relay'),
    holder       text        NOT NULL,          -- host, pid and a random part
    epoch        bigint      NOT NULL CHECK (epoch >= 1), -- incremented at each takeover
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    renewed_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- The customer's phone (E.164), for the "payment received" SMS; NULL: no SMS for the order.
ALTER TABLE orders ADD COLUMN phone text;

-- +goose Down
ALTER TABLE orders DROP COLUMN phone;
DROP TABLE outbox_relay_lease;
DROP TABLE outbox_sequences;
DROP TABLE outbox;
