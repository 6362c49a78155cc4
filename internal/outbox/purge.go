package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// purgeBatchSize is how many rows one purge statement deletes, in a transaction of its own.
const purgeBatchSize = 5000

// purgeEventsSQL deletes up to $2 events published before $1, found through the published index
// and deleted by their physical row address.
const purgeEventsSQL = `
WITH deleted AS (
	DELETE FROM outbox WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM outbox WHERE published_at < $1 ORDER BY published_at LIMIT $2))
	RETURNING 1
)
SELECT count(*) FROM deleted`

// purgeSequencesSQL deletes the counters of aggregates that emitted nothing since $1, among up to
// $2 counters after the key ($3, $4), and returns how many it deleted and the last key it looked
// at ("" when it reached the end): a sweep in key order, with no index on updated_at for every
// emission to maintain. A counter an emitter has just updated is not deleted: the delete waits for
// the emitter's row lock, then sees its updated_at. An aggregate whose counter is gone numbers its
// next event 1 again; the relay orders by position, which follows the counter's lock either way.
const purgeSequencesSQL = `
WITH page AS (
	SELECT aggregatetype, aggregateid, updated_at FROM outbox_sequences
	WHERE (aggregatetype, aggregateid) > ($3, $4)
	ORDER BY aggregatetype, aggregateid
	LIMIT $2
), deleted AS (
	DELETE FROM outbox_sequences s USING page p
	WHERE s.aggregatetype = p.aggregatetype AND s.aggregateid = p.aggregateid AND s.updated_at < $1
	RETURNING 1
), last AS (
	SELECT aggregatetype, aggregateid FROM page ORDER BY aggregatetype DESC, aggregateid DESC LIMIT 1
)
SELECT (SELECT count(*) FROM deleted), coalesce((SELECT aggregatetype FROM last), ''),
       coalesce((SELECT aggregateid FROM last), ''), (SELECT count(*) FROM page) = $2`

// Purge deletes the events published longer than Retention ago, and the counters of aggregates
// idle that long, in batches, each in a short transaction of its own. It returns how many events it
// deleted.
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	var cutoff time.Time
	if err := r.config.Pool.QueryRow(ctx, `SELECT now() - $1 * interval '1 microsecond'`,
		r.config.Retention.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", inbox.Classify(err))
	}
	var deleted int64
	for {
		var n int64
		if err := r.config.Pool.QueryRow(ctx, purgeEventsSQL, cutoff, purgeBatchSize).Scan(&n); err != nil {
			return deleted, fmt.Errorf("outbox: purge: %w", inbox.Classify(err))
		}
		deleted += n
		if n < purgeBatchSize {
			break
		}
	}
	afterType, afterID := "", ""
	for more := true; more; {
		var n int64
		err := r.config.Pool.QueryRow(ctx, purgeSequencesSQL, cutoff, purgeBatchSize, afterType, afterID).
			Scan(&n, &afterType, &afterID, &more)
		if err != nil {
			return deleted, fmt.Errorf("outbox: purge counters: %w", inbox.Classify(err))
		}
	}
	return deleted, nil
}

// purgeWhileHolding purges every PurgeInterval while this relay holds the lease, so that one
// instance purges at a time.
func (r *Relay) purgeWhileHolding(ctx context.Context) {
	ticker := time.NewTicker(r.config.PurgeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !r.isHolding() {
			continue
		}
		start := time.Now()
		deleted, err := r.Purge(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.WarnContext(ctx, "outbox purge failed", slog.Int64("deleted", deleted), slog.Any("error", err))
		case deleted > 0:
			r.log.InfoContext(ctx, "outbox purged published events", slog.Int64("deleted", deleted),
				slog.Duration("took", time.Since(start)))
		}
	}
}
