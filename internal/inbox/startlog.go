package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements of a consumer's crash counter (package consumer): the one record of the messages
// it started and did not finish. A consumer records each range of offsets of a partition before it
// starts the range's messages (Record), one statement for the range, and deletes the record once
// the range is finished or cleanly abandoned (Release); a record that outlives its run tells the
// partition's next owner that a run died in that range (Unfinished). A retry of a parked message is
// recorded alone on the message's row (RecordParked), which its settling resets or removes. The
// store only keeps the counts: what a death means is the consumer's business.

// StartLog is the log of the messages a consumer started (Store.StartLog): ranges of a partition's
// offsets, and retries of parked messages.
type StartLog struct{ pool *pgxpool.Pool }

// Partition names one partition of a topic as a consumer group consumes it.
type Partition struct {
	Group     string
	Topic     string
	Partition int32
}

// StartedRange is a range of offsets whose messages a consumer started.
type StartedRange struct {
	First, Last int64
	// FirstFingerprint identifies the message at First (see Fingerprint): a message at that offset
	// with another fingerprint is another message, and the record says nothing about it.
	FirstFingerprint [sha256.Size]byte
	// Starts counts how many times in a row this same range was started without being finished.
	Starts int
}

const recordStartSQL = `
WITH finished AS (
    DELETE FROM inbox_attempts
    WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3
      AND last_offset < $7 AND first_offset <> $4
)
INSERT INTO inbox_attempts AS a
       (consumer_group, topic, "partition", first_offset, last_offset, first_fingerprint, starts)
VALUES ($1, $2, $3, $4, $5, $6, 1)
ON CONFLICT (consumer_group, topic, "partition", first_offset) DO UPDATE
SET starts = CASE WHEN a.last_offset = excluded.last_offset
                   AND a.first_fingerprint = excluded.first_fingerprint
                  THEN a.starts + 1 ELSE 1 END,
    last_offset = excluded.last_offset,
    first_fingerprint = excluded.first_fingerprint,
    updated_at = now()
RETURNING starts`

// Record records, in one autocommit statement, that r's messages of p start now, and returns
// how many times in a row that same range (same offsets, same first message) has been started,
// this time included; r.Starts is not read. In the same statement it deletes p's records of ranges
// that ended before finishedBefore, the partition's committed offset: they finished.
func (l *StartLog) Record(ctx context.Context, p Partition, r StartedRange, finishedBefore int64) (int, error) {
	var starts int
	err := l.pool.QueryRow(ctx, recordStartSQL, p.Group, p.Topic, p.Partition,
		r.First, r.Last, r.FirstFingerprint[:], finishedBefore).Scan(&starts)
	if err != nil {
		return 0, Classify(fmt.Errorf("inbox: record a start: %w", err))
	}
	return starts, nil
}

// Release deletes p's records of the ranges that begin at firsts: they finished, or were
// abandoned cleanly (rolled back, not died in).
func (l *StartLog) Release(ctx context.Context, p Partition, firsts []int64) error {
	if len(firsts) == 0 {
		return nil
	}
	_, err := l.pool.Exec(ctx, `
		DELETE FROM inbox_attempts
		WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3 AND first_offset = ANY($4)`,
		p.Group, p.Topic, p.Partition, firsts)
	if err != nil {
		return Classify(fmt.Errorf("inbox: release starts: %w", err))
	}
	return nil
}

// Unfinished returns p's recorded ranges that end at or after from, in offset order: ranges a run
// started and did not finish, if from is where the partition's consumption starts again.
func (l *StartLog) Unfinished(ctx context.Context, p Partition, from int64) ([]StartedRange, error) {
	rows, _ := l.pool.Query(ctx, `
		SELECT first_offset, last_offset, first_fingerprint, starts FROM inbox_attempts
		WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3 AND last_offset >= $4
		ORDER BY first_offset`,
		p.Group, p.Topic, p.Partition, from)
	ranges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StartedRange, error) {
		var r StartedRange
		var fingerprint []byte
		err := row.Scan(&r.First, &r.Last, &fingerprint, &r.Starts)
		copy(r.FirstFingerprint[:], fingerprint)
		return r, err
	})
	if err != nil {
		return nil, Classify(fmt.Errorf("inbox: read starts: %w", err))
	}
	return ranges, nil
}

// RecordParked records that a retry of p, a parked message the caller holds, begins, and returns
// p's starts: how many retries of it in a row began and never settled (Park.Reschedule,
// Park.Release, Park.ReleaseAll, or its leaving the park), this one included. Its retrier died in
// each of the others. The count is kept on p's row, so that it goes with the row. It returns
// ErrHoldLost when p is no longer held by p.HeldBy.
//
// The count is committed without waiting for the flush to disk (synchronous_commit off): it must
// outlive the worker, which it does as soon as Postgres has it, and a crash of Postgres itself, which
// could lose it, is no crash of the message's. That spares a retry a second flush.
func (l *StartLog) RecordParked(ctx context.Context, p Parked) (int, error) {
	var starts int
	err := WithTx(ctx, l.pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO OFF`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			UPDATE inbox_parked SET starts = starts + 1 WHERE id = $1 AND held_by = $2 RETURNING starts`,
			p.ID, p.HeldBy).Scan(&starts)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, ErrHoldLost
	case err != nil:
		return 0, Classify(fmt.Errorf("inbox: begin a retry of a parked message: %w", err))
	}
	return starts, nil
}
