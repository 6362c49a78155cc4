-- +goose Up
-- A replay claims a row of dead_letters before it puts the dead letter back on its topic, and marks
-- it replayed (replayed_at) once the write is acknowledged: two replays at once put each row back
-- once, and no transaction stays open across the write. A claim lapses at replay_claimed_until, so
-- that a row whose replay died in between is replayed by the next one.
ALTER TABLE dead_letters
    ADD COLUMN replay_claimed_by    text,        -- the replay that claimed it; NULL: never claimed
    ADD COLUMN replay_claimed_until timestamptz; -- when that claim lapses

-- +goose Down
ALTER TABLE dead_letters DROP COLUMN replay_claimed_by, DROP COLUMN replay_claimed_until;
