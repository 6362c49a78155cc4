-- +goose Up
-- A parked message is known by its origin and by its content. Offsets start again when a topic is
-- recreated, or when worker dev restarts its embedded broker on a kept database: a different
-- message may then arrive at the origin (topic, partition, offset) of one still parked. It must be
-- parked beside it, never taken for it: a message is acknowledged only once its own row is in the
-- park. The fingerprint is the SHA-256 of the value, as the inbox's.
ALTER TABLE inbox_parked ADD COLUMN fingerprint bytea;
UPDATE inbox_parked SET fingerprint = sha256(coalesce(value, ''::bytea));
ALTER TABLE inbox_parked ALTER COLUMN fingerprint SET NOT NULL;
ALTER TABLE inbox_parked DROP CONSTRAINT inbox_parked_topic_partition_offset_key;
ALTER TABLE inbox_parked ADD CONSTRAINT inbox_parked_origin_key
    UNIQUE (topic, "partition", "offset", fingerprint); -- a redelivered message is parked once

-- When the message was produced (its record's timestamp), for handlers that drop what is too old;
-- NULL for messages parked before.
ALTER TABLE inbox_parked ADD COLUMN produced_at timestamptz;

-- A retrier's claim on a parked message is its hold: "claim" is the inbox row's word.
ALTER TABLE inbox_parked RENAME COLUMN claimed_by TO held_by;
ALTER TABLE inbox_parked RENAME COLUMN claimed_until TO held_until;
ALTER TABLE inbox_parked RENAME CONSTRAINT inbox_parked_check1 TO inbox_parked_held_check;
-- And a call's lease is taken, not claimed.
ALTER TABLE inbox_leases RENAME COLUMN claimed_at TO taken_at;

-- +goose Down
ALTER TABLE inbox_parked DROP COLUMN produced_at;
ALTER TABLE inbox_leases RENAME COLUMN taken_at TO claimed_at;
ALTER TABLE inbox_parked RENAME CONSTRAINT inbox_parked_held_check TO inbox_parked_check1;
ALTER TABLE inbox_parked RENAME COLUMN held_until TO claimed_until;
ALTER TABLE inbox_parked RENAME COLUMN held_by TO claimed_by;
ALTER TABLE inbox_parked DROP CONSTRAINT inbox_parked_origin_key;
DELETE FROM inbox_parked a USING inbox_parked b
WHERE a.topic = b.topic AND a."partition" = b."partition" AND a."offset" = b."offset" AND a.id > b.id;
ALTER TABLE inbox_parked ADD CONSTRAINT inbox_parked_topic_partition_offset_key UNIQUE (topic, "partition", "offset");
ALTER TABLE inbox_parked DROP COLUMN fingerprint;
