-- +goose Up
-- The transactional outbox: events written by a handler in the transaction of its effect, so that an
-- event exists if and only if its effect committed, and published to Kafka afterwards by the relay.
--
-- This migration has not been in a release yet, so it was changed in place rather than superseded:
-- the per-aggregate counters (outbox_sequences, the column seq) and the relay's mark on each row
-- (published_at, with its two partial indexes) gave way to emitter locks and the relay's cursor
-- (outbox_relay_lease.published_position), which make an emission cheaper (see docs/benchmarks.md).
--
-- The first six columns are the shape of Debezium's outbox event router (io.debezium.transforms.
-- outbox.EventRouter): a team running Debezium can relay this table with the router instead of the
-- worker's relay (docs/operations.md says how). The rest is what the worker's relay needs.
CREATE TABLE outbox (
    id                  uuid        PRIMARY KEY,        -- derived from the event's cause: emitted again, the same id
    aggregatetype       text        NOT NULL,           -- what the event is about: 'order'
    aggregateid         text        NOT NULL,           -- which one: the order number; the Kafka message key
    type                text        NOT NULL,           -- what happened: 'order.paid'
    -- The Kafka message value, byte for byte as emitted: json keeps the text (jsonb would reorder
    -- keys and respace it, and cost a parse on the way in and a rendering on the way out).
    payload             json        NOT NULL,
    tracingspancontext  text,                           -- the W3C trace context of the emitter, as java.util.Properties text ('traceparent=…'); NULL: none
    topic               text        NOT NULL,           -- where the relay publishes it
    -- The order of publication. An emitter draws positions while it holds its outbox's emitter lock
    -- and each of its aggregates' locks (transaction-level advisory locks, see internal/outbox), so
    -- that one aggregate's positions follow the order its transactions committed, and the relay,
    -- which publishes in position order, never passes a position whose transaction may still
    -- commit. The sequence must hand positions out in order: never give it a CACHE above 1.
    position            bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME outbox_position_seq),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- What the relay reads (the events after its cursor, in order) and the purge deletes (the oldest).
CREATE INDEX outbox_position_idx ON outbox (position);

-- The relay's lease and its cursor. One relay publishes at a time, across all the instances sharing
-- this schema: the holder renews expires_at while it runs; once it has passed, another instance takes
-- the lease over, with the next epoch. A relay publishes only while its lease is live, with a margin,
-- and stops at once when it finds the lease held by another epoch. Every event at or below
-- published_position has been published (acknowledged by Kafka); the holder moves it on, under its
-- epoch, after each acknowledged write.
CREATE TABLE outbox_relay_lease (
    name                text        PRIMARY KEY CHECK (name = 'relay'),
    holder              text        NOT NULL,          -- host, pid and a random part
    epoch               bigint      NOT NULL CHECK (epoch >= 1), -- incremented at each takeover
    acquired_at         timestamptz NOT NULL DEFAULT now(),
    renewed_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    published_position  bigint      NOT NULL DEFAULT 0, -- the cursor: every event up to it is published
    published_at        timestamptz                     -- when the cursor last moved; NULL: never
);

-- The events waiting to be published, for operators and the worker's gauges.
CREATE VIEW outbox_waiting AS
SELECT o.* FROM outbox o
WHERE o.position > coalesce((SELECT published_position FROM outbox_relay_lease WHERE name = 'relay'), 0);

-- The customer's phone (E.164), for the "payment received" SMS; NULL: no SMS for the order.
ALTER TABLE orders ADD COLUMN phone text;

-- +goose Down
ALTER TABLE orders DROP COLUMN phone;
DROP VIEW outbox_waiting;
DROP TABLE outbox_relay_lease;
DROP TABLE outbox;
