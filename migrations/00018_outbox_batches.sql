-- +goose Up
-- The outbox's events as the worker's relay reads them: a row per emission (an EmitBatch, the events
-- of a handler's batch), its events as arrays in their order, rather than a row per event. A row per
-- event cost a payment batch a third of its throughput (its heap tuple, its primary key and position
-- index entries, their WAL, the purge's delete and its vacuum; docs/benchmarks.md); a row per
-- emission costs one tuple and one index entry, its arrays compressed together.
--
-- The table outbox keeps Debezium's outbox event router shape, a row per event: an emission goes
-- there instead when the worker runs no relay of its own (OUTBOX_RELAY=false, or a Worker without
-- EventTopics), for Debezium to relay. Both tables draw their positions from outbox_position_seq,
-- under the same emitter locks (internal/outbox).
--
-- The outbox's id primary key no longer stops an event emitted twice from being written twice: the
-- inbox does, by applying the effect that emits it once per message, and the events' ids, the same
-- for the same cause, let a consumer recognise a resend.
CREATE TABLE outbox_batches (
    position            bigint      PRIMARY KEY DEFAULT nextval('outbox_position_seq'),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- One element per event, in the emission's order; every array has the same length.
    ids                 uuid[]      NOT NULL CHECK (cardinality(ids) >= 1),
    topics              text[]      NOT NULL,
    aggregatetypes      text[]      NOT NULL,
    aggregateids        text[]      NOT NULL,
    types               text[]      NOT NULL,
    payloads            text[]      NOT NULL,           -- each the Kafka message value, byte for byte (JSON, checked by the emitter)
    tracingspancontext  text,                           -- the emitter's W3C trace context, for all its events; NULL: none
    CHECK (cardinality(topics) = cardinality(ids) AND cardinality(aggregatetypes) = cardinality(ids)
       AND cardinality(aggregateids) = cardinality(ids) AND cardinality(types) = cardinality(ids)
       AND cardinality(payloads) = cardinality(ids))
);

-- lz4 compresses the payloads about as well as pglz, the default, at a fraction of its CPU: where
-- the server was built with it (PostgreSQL 14 and later, with --with-lz4, as the common packages are).
-- +goose StatementBegin
DO $$
BEGIN
    IF 'lz4' = ANY ((SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression')::text[]) THEN
        ALTER TABLE outbox_batches ALTER COLUMN payloads SET COMPRESSION lz4,
                                   ALTER COLUMN aggregateids SET COMPRESSION lz4;
    END IF;
END
$$;
-- +goose StatementEnd

-- Every event of both tables, a row each, in position order: what operators and tests read.
CREATE VIEW outbox_events AS
SELECT e.id, e.aggregatetype, e.aggregateid, e.type, e.payload::json AS payload, b.tracingspancontext,
       e.topic, b.position, e.ordinal::integer AS ordinal, b.created_at
FROM outbox_batches b,
     unnest(b.ids, b.topics, b.aggregatetypes, b.aggregateids, b.types, b.payloads)
         WITH ORDINALITY AS e(id, topic, aggregatetype, aggregateid, type, payload, ordinal)
UNION ALL
SELECT id, aggregatetype, aggregateid, type, payload, tracingspancontext, topic, position, 1, created_at
FROM outbox;

-- The events the worker's relay has yet to publish: those of outbox_batches after its cursor.
DROP VIEW outbox_waiting;
CREATE VIEW outbox_waiting AS
SELECT e.* FROM outbox_events e
WHERE e.position > coalesce((SELECT published_position FROM outbox_relay_lease WHERE name = 'relay'), 0)
  AND EXISTS (SELECT FROM outbox_batches b WHERE b.position = e.position);

-- The events the relay had yet to publish when this migration ran move to outbox_batches, each a row
-- of its own at its position; the published ones stay in outbox until the relay's purge deletes them
-- (OUTBOX_RETENTION). Only where the relay has run (its lease
-- exists): the rows of a deployment relayed by Debezium are its own.
WITH moved AS (
    DELETE FROM outbox o
    WHERE EXISTS (SELECT FROM outbox_relay_lease WHERE name = 'relay')
      AND o.position > (SELECT published_position FROM outbox_relay_lease WHERE name = 'relay')
    RETURNING o.*
)
INSERT INTO outbox_batches (position, created_at, ids, topics, aggregatetypes, aggregateids, types, payloads,
                            tracingspancontext)
SELECT position, created_at, ARRAY[id], ARRAY[topic], ARRAY[aggregatetype], ARRAY[aggregateid], ARRAY[type],
       ARRAY[payload::text], tracingspancontext
FROM moved;

-- +goose Down
-- The events still waiting go back to outbox, a row each, with new positions in their order; those
-- published are dropped with the table.
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tracingspancontext, topic, created_at)
SELECT id, aggregatetype, aggregateid, type, payload, tracingspancontext, topic, created_at
FROM outbox_waiting ORDER BY position, ordinal
ON CONFLICT (id) DO NOTHING;
DROP VIEW outbox_waiting;
DROP VIEW outbox_events;
CREATE VIEW outbox_waiting AS
SELECT o.* FROM outbox o
WHERE o.position > coalesce((SELECT published_position FROM outbox_relay_lease WHERE name = 'relay'), 0);
DROP TABLE outbox_batches;
