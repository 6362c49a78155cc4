-- +goose Up
-- worker replay's record of the dead letters of a dead-letter topic it put back, a row per letter by
-- its place in the topic. A replay claims the row before it writes the letter back (claimed_by until
-- claimed_until) and marks it replayed once the write is acknowledged, so that a later replay skips
-- it (unless told --again) and two replays at once do not both put it back. letter says which dead
-- letter was at that place (its original topic, partition and offset, and when it failed): a
-- dead-letter topic deleted and created again starts its offsets over, and a row of another letter
-- is not this one's.
CREATE TABLE dead_letter_replays (
    dlq_topic     text        NOT NULL,
    dlq_partition integer     NOT NULL,
    dlq_offset    bigint      NOT NULL,
    letter        text        NOT NULL,
    claimed_by    text        NOT NULL,
    claimed_until timestamptz,          -- NULL once replayed, or while nobody holds it
    replayed_at   timestamptz,
    replays       integer     NOT NULL DEFAULT 0 CHECK (replays >= 0),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);

-- +goose Down
DROP TABLE dead_letter_replays;
