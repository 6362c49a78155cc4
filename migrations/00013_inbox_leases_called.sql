-- +goose Up
-- A call that went out, and whose completion then failed for good (a handler's bug, a panic), is
-- known to have been made: its lease is kept, expired, with the time of that failure. The key's
-- next delivery (a replay of its dead letter) then makes no call: it is dead-lettered again, saying
-- so, until an operator deletes the row to have the call made again.
ALTER TABLE inbox_leases ADD COLUMN called_at timestamptz; -- NULL: no call of it is known unrecorded

-- +goose Down
ALTER TABLE inbox_leases DROP COLUMN called_at;
