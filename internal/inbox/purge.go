package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/inboxworker/inboxworker/internal/wait"
)

// defaultPurgeBatchSize is Config.PurgeBatchSize's default, chosen with TestPurgeMillionRows (a
// million expired keys, 2 busy cores, one run): batches of 1000, 5000, 20000 and 50000 purged 180k,
// 227k, 280k and 288k keys/s, while the slowest claim meanwhile took 41ms, 44ms, 256ms and 79ms.
// A batch of 5000 runs for about 20ms.
const defaultPurgeBatchSize = 5000

// defaultPurgeInterval is RunPurger's interval when it is given none.
const defaultPurgeInterval = 10 * time.Minute

// purgeBatchSQL deletes up to $3 keys that expired before $2, oldest first from expiry $1 on, if
// it gets the purge lock, and returns whether it did, how many it deleted and the latest expiry
// among them, where the next batch starts. The keys are found through the expires_at index and
// deleted by their physical row address (a TID scan), so a batch costs the rows it deletes and its
// transaction locks only those rows. Starting each batch where the last one ended spares it from
// stepping over the index entries of the rows deleted before, which stay in the index until vacuum.
//
// The purge lock is a transaction advisory lock named after the schema that holds the inbox table,
// held for one batch, so that one batch runs at a time per inbox table however many workers share
// it. A lock of the transaction's, not the session's: through a connection pooler in transaction
// mode, a session's lock would stay on a server connection that other clients then use.
const purgeBatchSQL = `
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended('inboxworker.inbox.purge.' || current_schema(), 0)) AS held
), deleted AS (
    DELETE FROM inbox
    WHERE (SELECT held FROM lock) AND ctid = ANY (ARRAY(
        SELECT ctid FROM inbox
        WHERE expires_at >= $1 AND expires_at < $2
        ORDER BY expires_at
        LIMIT $3
    ))
    RETURNING expires_at
)
SELECT (SELECT held FROM lock), count(*), coalesce(max(expires_at), $1) FROM deleted`

// Purge deletes the keys whose retention has run out and returns how many it deleted. It deletes
// in batches of Config.PurgeBatchSize, each in its own short transaction, so that it never holds
// many locks or one long transaction, and the claims of new keys go on while it runs.
//
// One batch runs at a time: a purge that finds another instance's batch running returns what it
// deleted until then at once, and leaves the rest to it. It stops at keys that expire after it
// started. On an error, it returns what it deleted until then.
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	deleted, _, err = s.purge(ctx)
	return deleted, err
}

// purge is Purge that also reports whether it ran or found another instance purging.
func (s *Store) purge(ctx context.Context) (deleted int64, ran bool, err error) {
	var cutoff time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&cutoff); err != nil {
		return 0, false, Classify(fmt.Errorf("inbox: purge: %w", err))
	}
	var from time.Time // the zero time, long before any expiry
	for {
		var (
			held bool
			n    int64
		)
		err := s.pool.QueryRow(ctx, purgeBatchSQL, from, cutoff, s.config.PurgeBatchSize).Scan(&held, &n, &from)
		switch {
		case err != nil:
			return deleted, true, Classify(fmt.Errorf("inbox: purge: delete: %w", err))
		case !held:
			return deleted, deleted > 0, nil
		}
		deleted += n
		if n < int64(s.config.PurgeBatchSize) {
			return deleted, true, nil
		}
		if err := ctx.Err(); err != nil {
			return deleted, true, fmt.Errorf("inbox: purge: %w", context.Cause(ctx))
		}
	}
}

// RunPurger calls Purge at once and then every interval (10 minutes if interval is not positive)
// until ctx is done, logging what it deleted and any failure. A failed purge is tried again at the
// next interval.
func (s *Store) RunPurger(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = defaultPurgeInterval
	}
	wait.Every(ctx, interval, s.config.Logger, "purge the inbox", func(ctx context.Context) error {
		s.purgeAndLog(ctx)
		return nil
	})
}

// purgeAndLog purges once and logs what it deleted, or why it did not.
func (s *Store) purgeAndLog(ctx context.Context) {
	start := time.Now()
	deleted, ran, err := s.purge(ctx)
	took := time.Since(start)
	switch {
	case ctx.Err() != nil:
		if deleted > 0 {
			s.config.Logger.InfoContext(ctx, "inbox purge stopped", slog.Int64("deleted", deleted),
				slog.Duration("took", took))
		}
	case err != nil:
		s.config.Logger.WarnContext(ctx, "inbox purge failed", slog.Int64("deleted", deleted),
			slog.Duration("took", took), slog.Any("error", err))
	case !ran:
		s.config.Logger.DebugContext(ctx, "inbox purge skipped: another instance is purging")
	case deleted > 0:
		s.config.Logger.InfoContext(ctx, "inbox purged expired keys", slog.Int64("deleted", deleted),
			slog.Duration("took", took))
	default:
		s.config.Logger.DebugContext(ctx, "inbox purge found no expired keys", slog.Duration("took", took))
	}
}
