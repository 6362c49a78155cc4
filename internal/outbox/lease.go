package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// acquireSQL takes the lease: the first time, a new row; then the row of a holder whose lease has
// expired, with the next epoch. It returns nothing while another holder's lease is live. now() is
// the statement's transaction start, on the database's one clock for every instance.
const acquireSQL = `
INSERT INTO outbox_relay_lease AS l (name, holder, epoch, expires_at)
VALUES ('relay', $1, 1, now() + $2 * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, epoch = l.epoch + 1, acquired_at = now(), renewed_at = now(),
    expires_at = excluded.expires_at
WHERE l.expires_at <= now()
RETURNING epoch, coalesce((SELECT holder FROM outbox_relay_lease WHERE name = 'relay'), ''), l.published_position`

// acquire takes the lease if no other relay holds a live one, and reports whether it did.
func (r *Relay) acquire(ctx context.Context) (bool, error) {
	start := time.Now()
	var epoch, cursor int64
	var previous string
	err := r.config.Pool.QueryRow(ctx, acquireSQL, r.holder, r.config.LeaseTTL.Microseconds()).
		Scan(&epoch, &previous, &cursor)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("outbox relay: take the lease: %w", inbox.Classify(err))
	}
	r.epoch, r.renewed = epoch, start
	r.cursor, r.marked, r.ahead = cursor, cursor, map[event]bool{}
	r.horizon.reset(cursor)
	r.setHolding(true)
	attrs := []any{slog.Int64("epoch", epoch), slog.String("holder", r.holder)}
	if epoch > 1 {
		attrs = append(attrs, slog.String("previous_holder", previous))
	}
	r.log.InfoContext(ctx, "outbox relay: took the lease; publishing", attrs...)
	return true, nil
}

// renewSQL extends the lease of holder and epoch, if it is still theirs and live.
const renewSQL = `
UPDATE outbox_relay_lease SET renewed_at = now(), expires_at = now() + $3 * interval '1 microsecond'
WHERE name = 'relay' AND holder = $1 AND epoch = $2 AND expires_at > now()`

// fetchSQL reads the emissions after the cursor $3 up to the horizon $4, oldest first, if holder's
// lease of epoch is live: as many as start before the $5th event. The arrays are read whole and
// taken apart by the relay: unnested on the server, the events were a row each to sort back into
// their order.
const fetchSQL = `
SELECT position, ids, topics, aggregateids, payloads, tracingspancontext
FROM (
	SELECT l.*, sum(l.n) OVER (ORDER BY l.position) - l.n AS before
	FROM (
		SELECT position, ids, topics, aggregateids, payloads, tracingspancontext, cardinality(ids) AS n
		FROM outbox_batches
		WHERE position > $3 AND position <= $4
		  AND EXISTS (SELECT FROM outbox_relay_lease WHERE name = 'relay' AND holder = $1 AND epoch = $2 AND expires_at > now())
		ORDER BY position
		LIMIT $5
	) AS l
) AS b
WHERE before < $5
ORDER BY position`

// row is an event as the relay reads it.
type row struct {
	event       event
	of          int32 // events of its emission: the last has event.ordinal == of
	id          string
	topic       string
	aggregateID string
	payload     []byte
	trace       *string
}

// event is where an event is in the outbox: its emission's position, and its ordinal (from 1) in it.
type event struct {
	position int64
	ordinal  int32
}

// emission is a row of outbox_batches as the relay reads it.
type emission struct {
	position             int64
	ids                  []pgtype.UUID
	topics, aggregateIDs []string
	payloads             [][]byte
	trace                *string
}

// row is the ith event of e. The table's constraint gives e's arrays one length.
func (e *emission) row(i int) row {
	return row{event: event{e.position, int32(i + 1)}, of: int32(len(e.ids)), id: uuid.UUID(e.ids[i].Bytes).String(),
		topic: e.topics[i], aggregateID: e.aggregateIDs[i], payload: e.payloads[i], trace: e.trace}
}

// batch is what a round read: the events after the cursor, in position order.
type batch struct {
	rows []row
	// complete is whether rows are every event after the cursor up to the horizon.
	complete bool
}

// fetch moves the horizon on (renewing the lease in the same round trip when a renewal is due),
// then reads the events after the cursor up to the horizon: the emissions that start before the
// BatchSize-th event, and of their events no more than BatchSize and maxBatchBytes of those not
// already published (the rest of an emission in a later round), so that the writer sends a
// partition's events of the round in one produce request. It returns no batch, and gives the lease up, when
// the lease is found lost. The horizon's readings come before the read of the events, in an earlier
// round trip: the read sees every transaction that the readings found ended.
func (r *Relay) fetch(ctx context.Context) (batch, error) {
	if err := r.observe(ctx); err != nil || r.epoch == 0 || r.horizon.at <= r.cursor {
		return batch{}, err
	}
	rows, err := r.config.Pool.Query(ctx, fetchSQL, r.holder, r.epoch, r.cursor, r.horizon.at, r.config.BatchSize)
	if err != nil {
		return batch{}, fmt.Errorf("outbox relay: read events: %w", inbox.Classify(err))
	}
	defer rows.Close()
	b := batch{complete: true}
	size, sending, n := 0, 0, 0
	for rows.Next() && b.complete {
		var e emission
		if err := rows.Scan(&e.position, &e.ids, &e.topics, &e.aggregateIDs, &e.payloads, &e.trace); err != nil {
			return batch{}, fmt.Errorf("outbox relay: read events: %w", err)
		}
		for i := range e.ids {
			n++
			row := e.row(i)
			if !r.ahead[row.event] {
				size += messageBytes(row)
				if sending++; sending > r.config.BatchSize || size > maxBatchBytes && len(b.rows) > 0 {
					b.complete = false
					break // the rest in the next round, after these
				}
			}
			b.rows = append(b.rows, row)
		}
	}
	if err := rows.Err(); err != nil {
		return batch{}, fmt.Errorf("outbox relay: read events: %w", inbox.Classify(err))
	}
	b.complete = b.complete && n < r.config.BatchSize
	return b, nil
}

// observe renews the lease when a renewal is due, and reads the last position drawn and then the
// emitters, to move the horizon on.
func (r *Relay) observe(ctx context.Context) error {
	start := time.Now()
	b := &pgx.Batch{}
	renewing := start.Sub(r.renewed) >= renewEvery(r.config.LeaseTTL)
	if renewing {
		b.Queue(renewSQL, r.holder, r.epoch, r.config.LeaseTTL.Microseconds())
	}
	b.Queue(lastPositionSQL)
	b.Queue(emittersSQL)
	results := r.config.Pool.SendBatch(ctx, b)
	defer results.Close()
	if renewing {
		tag, err := results.Exec()
		if err != nil {
			return fmt.Errorf("outbox relay: renew the lease: %w", inbox.Classify(err))
		}
		if tag.RowsAffected() == 0 {
			r.lost(ctx)
			return nil
		}
		r.renewed = start
	}
	var last int64
	var emitters []string
	if err := results.QueryRow().Scan(&last); err != nil {
		return fmt.Errorf("outbox relay: read the last position: %w", inbox.Classify(err))
	}
	if err := results.QueryRow().Scan(&emitters); err != nil {
		return fmt.Errorf("outbox relay: read the emitters: %w", inbox.Classify(err))
	}
	r.horizon.observe(last, emitters)
	return nil
}

// lost gives up a lease another relay has taken, or that expired while this one could not renew it.
func (r *Relay) lost(ctx context.Context) {
	r.log.WarnContext(ctx, "outbox relay: lost the lease; standing by", slog.Int64("epoch", r.epoch),
		slog.String("holder", r.holder))
	r.epoch = 0
	r.setHolding(false)
}

// markSQL moves the cursor of holder's lease of epoch on to $3.
const markSQL = `
UPDATE outbox_relay_lease SET published_position = $3, published_at = now()
WHERE name = 'relay' AND holder = $1 AND epoch = $2 AND published_position < $3`

// asyncCommitSQL makes the commit of the statements after it, in one round trip, asynchronous: it
// returns before the commit's WAL record is flushed. The cursor is committed so (and nothing else
// is): a Postgres crash may lose its last moves, and the next holder then publishes those events
// again, with their ids, as after a crash of the relay's own; it saves the relay a WAL flush per
// round, which the emitters' commits would otherwise queue behind.
const asyncCommitSQL = `SELECT set_config('synchronous_commit', 'off', true)`

// markUnmarked moves the lease's cursor on to the relay's, if it is behind. It runs even once ctx is
// done: events published and not marked are published again. Once the lease is lost the cursor
// stays where it is, for the next holder to publish the rest again.
func (r *Relay) markUnmarked(ctx context.Context) error {
	if r.marked >= r.cursor || r.epoch == 0 {
		return nil
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(asyncCommitSQL)
	b.Queue(markSQL, r.holder, r.epoch, r.cursor)
	if err := r.config.Pool.SendBatch(mctx, b).Close(); err != nil {
		return fmt.Errorf("outbox relay: mark the events up to %d published: %w", r.cursor, inbox.Classify(err))
	}
	r.marked = r.cursor
	return nil
}

// markTimeout bounds the marking and the release of the lease, which run even when the relay stops.
const markTimeout = 5 * time.Second

// releaseSQL ends the lease at once, if it is still this relay's.
const releaseSQL = `UPDATE outbox_relay_lease SET expires_at = now() WHERE name = 'relay' AND holder = $1 AND epoch = $2`

// release marks what was published and gives the lease up, so that another instance takes over at
// once, not when it expires.
func (r *Relay) release(ctx context.Context) {
	if r.epoch == 0 {
		return
	}
	if err := r.markUnmarked(ctx); err != nil {
		r.log.WarnContext(ctx, "outbox relay: stopping with published events not marked; they will be published again",
			slog.Any("error", err))
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	if _, err := r.config.Pool.Exec(rctx, releaseSQL, r.holder, r.epoch); err != nil {
		r.log.WarnContext(ctx, "outbox relay: stopping without giving the lease up; another instance takes over when it expires",
			slog.Any("error", err))
	} else {
		r.log.InfoContext(ctx, "outbox relay: gave the lease up", slog.Int64("epoch", r.epoch))
	}
	r.epoch = 0
	r.setHolding(false)
}
