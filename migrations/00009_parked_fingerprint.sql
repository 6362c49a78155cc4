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

-- +goose Down
ALTER TABLE inbox_parked DROP CONSTRAINT inbox_parked_origin_key;
DELETE FROM inbox_parked a USING inbox_parked b
WHERE a.topic = b.topic AND a."partition" = b."partition" AND a."offset" = b."offset" AND a.id > b.id;
ALTER TABLE inbox_parked ADD CONSTRAINT inbox_parked_topic_partition_offset_key UNIQUE (topic, "partition", "offset");
ALTER TABLE inbox_parked DROP COLUMN fingerprint;
