package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultPurgeBatchSize is Config.PurgeBatchSize's default, chosen with TestPurgeMillionRows (a
// million expired keys, 2 busy cores, one run): batches of 1000, 5000, 20000 and 50000 purged 180k,
// 227k, 280k and 288k keys/s, while the slowest claim meanwhile took 41ms, 44ms, 256ms and 79ms.
// A batch of 5000 runs for about 20ms.
const defaultPurgeBatchSize = 5000

// defaultPurgeInterval is RunPurger's interval when it is given none.
const defaultPurgeInterval = 10 * time.Minute

// The purge lock is a session advisory lock named after the schema that holds the inbox table, so
// that one purger runs per inbox table however many workers share it.
const (
	purgeLockSQL   = `SELECT pg_try_advisory_lock(hashtextextended('inboxworker.inbox.purge.' || current_schema(), 0)), now()`
	purgeUnlockSQL = `SELECT pg_advisory_unlock(hashtextextended('inboxworker.inbox.purge.' || current_schema(), 0))`
)

// purgeBatchSQL deletes up to $3 keys that expired before $2, oldest first from expiry $1 on, and
// returns how many it deleted and the latest expiry among them, where the next batch starts. The
// keys are found through the expires_at index and deleted by their physical row address (a TID
// scan), so a batch costs the rows it deletes and its transaction locks only those rows. Starting
// each batch where the last one ended spares it from stepping over the index entries of the rows
// deleted before, which stay in the index until vacuum.
const purgeBatchSQL = `
WITH deleted AS (
    DELETE FROM inbox
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM inbox
        WHERE expires_at >= $1 AND expires_at < $2
        ORDER BY expires_at
        LIMIT $3
    ))
    RETURNING expires_at
)
SELECT count(*), coalesce(max(expires_at), $1) FROM deleted`

// Purge deletes the keys whose retention has run out and returns how many it deleted. It deletes
// in batches of Config.PurgeBatchSize, each in its own short transaction, so that it never holds
// many locks or one long transaction, and the claims of new keys go on while it runs.
//
// One instance purges at a time: Purge holds a Postgres advisory lock while it runs and returns
// 0, nil at once when another holds it. It stops at keys that expire after it started. On an
// error, it returns what it deleted until then.
func (s *Store) Purge(ctx context.Context) (deleted int64, err error) {
	deleted, _, err = s.purge(ctx)
	return deleted, err
}

// purge is Purge that also reports whether it ran or found another instance purging.
func (s *Store) purge(ctx context.Context) (deleted int64, ran bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, false, Classify(fmt.Errorf("inbox: purge: %w", err))
	}
	defer conn.Release()

	var locked bool
	var cutoff time.Time
	if err := conn.QueryRow(ctx, purgeLockSQL).Scan(&locked, &cutoff); err != nil {
		return 0, false, Classify(fmt.Errorf("inbox: purge: lock: %w", err))
	}
	if !locked {
		return 0, false, nil
	}
	defer unlockPurge(ctx, conn)

	var from time.Time // the zero time, long before any expiry
	for {
		var n int64
		err := conn.QueryRow(ctx, purgeBatchSQL, from, cutoff, s.config.PurgeBatchSize).Scan(&n, &from)
		if err != nil {
			return deleted, true, Classify(fmt.Errorf("inbox: purge: delete: %w", err))
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

// unlockPurge releases the purge lock held by conn's session, even when ctx is cancelled. A
// session that may still hold it is closed rather than returned to the pool, where it would keep
// every other instance from purging.
func unlockPurge(ctx context.Context, conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	var unlocked bool
	if err := conn.QueryRow(ctx, purgeUnlockSQL).Scan(&unlocked); err != nil || !unlocked {
		_ = conn.Conn().Close(ctx)
	}
}

// RunPurger calls Purge at once and then every interval (10 minutes if interval is not positive)
// until ctx is done, logging what it deleted and any failure. A failed purge is tried again at the
// next interval.
func (s *Store) RunPurger(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = defaultPurgeInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		start := time.Now()
		deleted, ran, err := s.purge(ctx)
		took := time.Since(start)
		switch {
		case ctx.Err() != nil:
			if deleted > 0 {
				s.config.Logger.InfoContext(ctx, "inbox purge stopped", slog.Int64("deleted", deleted),
					slog.Duration("took", took))
			}
			return
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
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
