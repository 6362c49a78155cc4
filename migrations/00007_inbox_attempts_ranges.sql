-- +goose Up
-- A partition's messages now finish out of order, several ranges in flight at once: a row per
-- started range instead of one per partition, with the SHA-256 of the range's first message, so
-- that a different message at a known offset (a recreated topic, a new broker whose offsets start
-- again at 0) is not taken for the one that died there. The rows of the old shape say nothing of
-- the new ranges: a range left by a worker that died just before this migration is run again
-- without the narrowing, as on any first start.
DELETE FROM inbox_attempts;
ALTER TABLE inbox_attempts
    ADD COLUMN first_fingerprint bytea NOT NULL,
    DROP CONSTRAINT inbox_attempts_pkey,
    ADD PRIMARY KEY (consumer_group, topic, "partition", first_offset);

-- +goose Down
DELETE FROM inbox_attempts;
ALTER TABLE inbox_attempts
    DROP CONSTRAINT inbox_attempts_pkey,
    DROP COLUMN first_fingerprint,
    ADD PRIMARY KEY (consumer_group, topic, "partition");
