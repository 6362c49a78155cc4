package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// purgeBatchSize is how many emissions one purge statement looks at, in a transaction of its own.
const purgeBatchSize = 5000

// purgeSQL deletes, of the $2 oldest rows of table published (at or below the lease's cursor),
// those written before $1, and says how many events and rows it deleted and how many rows it looked
// at; events is how many events a row holds. The rows are in position order, and so in the order
// they were written, give or take the few microseconds between an emitter drawing a position and
// stamping created_at: the purge stops at the first page that has a row too young, without reading
// the rest.
func purgeSQL(table, events string) string {
	return `
WITH page AS (
	SELECT position, created_at, ` + events + ` AS events FROM ` + table + `
	WHERE position <= coalesce((SELECT published_position FROM outbox_relay_lease WHERE name = 'relay'), 0)
	ORDER BY position
	LIMIT $2
), deleted AS (
	DELETE FROM ` + table + ` o USING page p WHERE o.position = p.position AND p.created_at < $1
	RETURNING p.events
)
SELECT (SELECT coalesce(sum(events), 0) FROM deleted), (SELECT count(*) FROM deleted), (SELECT count(*) FROM page)`
}

// The purge's statements: of outbox_batches, an emission a row; of outbox, the events this relay
// published a row each before migration 00018 put them in outbox_batches (a row written since, with
// the relay off, is Debezium's and after the cursor: the relay does not delete it).
var (
	purgeEventsSQL = purgeSQL("outbox_batches", "cardinality(ids)")
	purgeRowsSQL   = purgeSQL("outbox", "1")
)

// Purge deletes the events published and written longer than Retention ago, in batches, each in a
// short transaction of its own. It returns how many events it deleted.
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	var cutoff time.Time
	if err := r.config.Pool.QueryRow(ctx, `SELECT now() - $1 * interval '1 microsecond'`,
		r.config.Retention.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", inbox.Classify(err))
	}
	var deleted int64
	for _, stmt := range []string{purgeRowsSQL, purgeEventsSQL} {
		for {
			var events, n, seen int64
			if err := r.config.Pool.QueryRow(ctx, stmt, cutoff, purgeBatchSize).Scan(&events, &n, &seen); err != nil {
				return deleted, fmt.Errorf("outbox: purge: %w", inbox.Classify(err))
			}
			deleted += events
			if n < seen || seen < purgeBatchSize {
				break
			}
		}
	}
	return deleted, nil
}

// purgeWhileHolding purges every PurgeInterval while this relay holds the lease, so that one
// instance purges at a time.
func (r *Relay) purgeWhileHolding(ctx context.Context) {
	wait.Every(ctx, r.config.PurgeInterval, r.log, "purge the outbox", func(ctx context.Context) error {
		if !r.isHolding() {
			return nil
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
		return nil
	})
}
