package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// The crash-loop guard. A message that kills the process (a panic outside the handler's recover, an
// out-of-memory kill, a SIGKILL) is never finished, so its offset is never committed and every new
// owner of its partition runs it again, forever. To notice, each batch's offset range is recorded in
// inbox_attempts before the batch runs (one autocommit statement per batch), with a count of how
// many times that same range was started. A new owner that starts inside the recorded range knows a
// run died there: it runs the range one message per batch, so that each message's starts are
// counted alone, and a message started crashLoopStarts times without finishing is dead-lettered
// with reason crash_loop on its next start, without running its handler.
//
// A run that abandons a batch cleanly (a rebalance, a stop) deletes the batch's row, so only deaths
// are counted. A process that dies for a reason of its own while a message is in flight counts a
// start against that message too: it takes crashLoopStarts such deaths in a row on one message to
// dead-letter it, and a dead letter can be replayed.

// crashLoopStarts is how many starts without finishing make a message a crash loop.
const crashLoopStarts = 5

const recordStartSQL = `
INSERT INTO inbox_attempts AS a (consumer_group, topic, "partition", first_offset, last_offset, starts)
VALUES ($1, $2, $3, $4, $5, 1)
ON CONFLICT (consumer_group, topic, "partition") DO UPDATE
SET starts = CASE WHEN a.first_offset = excluded.first_offset AND a.last_offset = excluded.last_offset
                  THEN a.starts + 1 ELSE 1 END,
    first_offset = excluded.first_offset,
    last_offset = excluded.last_offset,
    updated_at = now()
RETURNING starts`

// recordStart records that the batch [first, last] starts now and returns how many times in a row
// that range has been started, this time included. It waits through database outages; it fails only
// when ctx is done or the consumer is stopping.
func (p *partition) recordStart(ctx context.Context, first, last int64) (starts int, err error) {
	err = p.retryDatabase(ctx, "record the start of a batch", func(ctx context.Context) error {
		return p.c.config.Pool.QueryRow(ctx, recordStartSQL,
			p.c.config.GroupID, p.topic, p.id, first, last).Scan(&starts)
	})
	if starts > 1 {
		p.log.Warn("starting a range of messages again: a previous run died in it",
			"first_offset", first, "last_offset", last, "starts", starts)
	}
	return starts, err
}

// releaseStart deletes the record of the batch [first, last], which was abandoned cleanly. It is
// best effort: a record left behind only makes the next owner run the range one message at a time.
func (p *partition) releaseStart(ctx context.Context, first, last int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, err := p.c.config.Pool.Exec(ctx, `
		DELETE FROM inbox_attempts
		WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3 AND first_offset = $4 AND last_offset = $5`,
		p.c.config.GroupID, p.topic, p.id, first, last)
	if err != nil {
		p.log.Warn("cannot release the record of an abandoned batch", "error", err)
	}
}

// findUnfinished looks up the range the partition's last run started. If the partition now starts
// at or before its end, that run died in it (a clean stop commits or releases what it started), and
// the range becomes suspect.
func (p *partition) findUnfinished(ctx context.Context, start int64) error {
	var first, last int64
	err := p.retryDatabase(ctx, "look up the partition's last started batch", func(ctx context.Context) error {
		err := p.c.config.Pool.QueryRow(ctx, `
			SELECT first_offset, last_offset FROM inbox_attempts
			WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3`,
			p.c.config.GroupID, p.topic, p.id).Scan(&first, &last)
		if errors.Is(err, pgx.ErrNoRows) {
			first, last = -1, -1
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	if start <= last {
		p.suspects = last
		p.log.Warn("a previous run died in a range of this partition; running it one message at a time",
			"first_offset", first, "last_offset", last)
	}
	return nil
}

// deadLetterCrashLoop dead-letters m, whose handler was started too often without finishing.
func (p *partition) deadLetterCrashLoop(ctx context.Context, m kafka.Message, starts int) error {
	log := p.log.With("offset", m.Offset)
	err := fmt.Errorf("the worker died %d times in a row while handling this message", starts)
	if err := p.deadLetter(ctx, m, failure{reason: fault.CrashLoop, err: err, attempts: starts}, log); err != nil {
		return err
	}
	p.c.metrics.count(p.topic, outcomeDeadLettered)
	return nil
}

// retryDatabase runs fn until it succeeds, waiting between tries. It is for the consumer's own
// statements, which fail only when the database does: no message is to blame, so there is no retry
// budget. It fails only when ctx is done or the consumer is stopping.
func (p *partition) retryDatabase(ctx context.Context, what string, fn func(context.Context) error) error {
	var bo *backoff.ExponentialBackOff
	for {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if bo == nil {
			bo = p.outageBackOff()
		}
		delay := bo.NextBackOff()
		p.log.Warn("cannot "+what+"; retrying", "delay", delay, "error", inbox.Classify(err))
		if err := p.sleep(ctx, delay); err != nil {
			return err
		}
	}
}
