-- +goose Up
-- Dead letters their dead-letter topic refused for good (too large for it, not authorised), kept
-- here so that they block no partition and are not lost. `worker replay DLQ_TOPIC` puts the pending
-- ones back on their original topic and sets replayed_at; rows are never deleted by the worker.
-- Each column is what the dead letter's header of the same name would have said.
CREATE TABLE dead_letters (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dlq_topic          text        NOT NULL, -- the dead-letter topic that refused it
    original_topic     text        NOT NULL,
    original_partition integer     NOT NULL,
    original_offset    bigint      NOT NULL,
    message_key        bytea,                -- NULL: the message had no key
    message_value      bytea,                -- NULL: the message had no value
    -- The dead letter's headers, in order: the original message's, then the dlq-* ones. Bytes, as
    -- Kafka carries them; convert_from(name, 'UTF8') reads a name.
    header_names       bytea[]     NOT NULL,
    header_values      bytea[]     NOT NULL,
    reason             text        NOT NULL,
    error              text        NOT NULL,
    attempts           integer     NOT NULL,
    failed_at          timestamptz NOT NULL,
    write_error        text        NOT NULL, -- why the dead-letter topic refused it
    stored_at          timestamptz NOT NULL DEFAULT now(),
    replayed_at        timestamptz           -- NULL: not replayed yet
);

CREATE INDEX dead_letters_pending ON dead_letters (dlq_topic, id) WHERE replayed_at IS NULL;

-- +goose Down
DROP TABLE dead_letters;
